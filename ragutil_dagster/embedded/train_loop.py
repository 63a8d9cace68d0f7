"""What the trainers of the embedded models share: deterministic torch settings, the
learning-rate schedule, the optimiser step, saving, and the NLI label order."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

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


def optimiser_step(
    loss: torch.Tensor,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    clip: Sequence[torch.nn.Parameter] = (),
) -> None:
    """Back-propagate ``loss`` and step; gradients of ``clip`` (when given) to norm 1 first."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(clip, 1.0)
    opt.step()
    sched.step()


def save_for_inference(model: torch.nn.Module, tokenizer, out_dir: Path) -> Path:
    """``model`` in eval mode and its tokenizer as a Hugging Face directory at ``out_dir``."""
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
