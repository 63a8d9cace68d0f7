"""What the trainers of the embedded models share: deterministic torch settings, the
learning-rate schedule and the NLI label order."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch

NLI_LABELS = ("contradiction", "neutral", "entailment")  # the MNLI order Entailment expects


def lr_schedule(step: int, total: int, warmup: int = 100) -> float:
    """Linear warm-up, constant, then cosine decay to a tenth over the last fifth of training.

    The reader's reading comprehension emerges late and abruptly, so the rate stays at its peak
    until then.
    """
    if step < warmup:
        return (step + 1) / warmup
    decay_start = int(0.8 * total)
    if step < decay_start:
        return 1.0
    progress = (step - decay_start) / max(1, total - decay_start)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


@contextlib.contextmanager
def deterministic(seed: int, threads: int) -> Iterator[None]:
    """Seed torch, force deterministic kernels and a fixed thread count, restoring both after.

    The thread count is part of the configuration: results then do not depend on the machine's
    core count (and on a CPU shared with other work one thread is often faster than two that
    contend).
    """
    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)
