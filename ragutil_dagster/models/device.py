"""Device and dtype selection shared by every torch backend."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import torch

__all__ = [
    "PLACEMENT_ENTRIES",
    "SPLIT_KV_VARIABLE",
    "VLLMCPUPlacement",
    "available_memory_bytes",
    "cpu_has_native_bf16",
    "default_causal_lm_dtype",
    "default_nli_dtype",
    "resolve_device",
    "resolve_dtype",
    "vllm_cpu_environment",
    "vllm_cpu_placement",
    "warm_up_on_cpu",
    "warn_if_bf16_emulated",
]


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """The requested device, or CUDA when present and CPU otherwise."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was requested but CUDA is not available here")
    return resolved


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AMX-BF16 or AVX512-BF16), as torch's cpuinfo
    reports it. Without those, torch emulates bfloat16 matmuls and they are slower than float32."""
    capabilities = torch.cpu.get_capabilities()
    return bool(capabilities.get("amx_bf16") or capabilities.get("avx512_bf16"))


def default_causal_lm_dtype(device: torch.device) -> torch.dtype:
    """The causal LM's dtype when the configuration leaves it to us: bfloat16 on CUDA and on CPUs
    with native bfloat16 (``bench/seper_e2e.py`` and ``bench/logprob_agreement.py`` measure its
    speed-up and log-prob difference against float32; docs/performance.md), float32 elsewhere."""
    if device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16()):
        return torch.bfloat16
    return torch.float32


def default_nli_dtype(device: torch.device) -> torch.dtype:
    """The NLI model's dtype when the configuration leaves it to us: float16 on CUDA, float32 on
    every CPU. Native bfloat16 judges about 2× the pairs per second on an AMX Xeon and keeps
    99.95 % of the entailment decisions SePer reads, but only 71.9 % of the three-way labels of a
    real run's pairs (contradiction / neutral near-ties), below issue 29's 99.5 % bar, and it moves
    per-query ΔSePer_H by up to 0.12 (bench/nli_dtype_seper.py; docs/performance.md). So the CPU
    default stays float32, the same labels on every CPU; ``nli.dtype: bfloat16`` opts in."""
    return torch.float16 if device.type == "cuda" else torch.float32


def warm_up_on_cpu(model: torch.nn.Module, device: torch.device) -> None:
    """One discarded forward pass over a few tokens, on CPU (any model that takes ``input_ids``).

    On a 2-thread CPU (Intel Xeon with AMX, PyTorch 2.13) about one fresh process in ten computed
    other outputs in its *first* forward pass than in every later one, for identical inputs
    (bfloat16: sampled tokens flipped; float32: the last bits); with this pass first, none of 50
    did (docs/reliability.md, Determinism). Paying it at load time keeps samples, NLI
    probabilities and scores reproducible from process to process.
    """
    if device.type != "cpu":
        return
    with torch.inference_mode():
        model(input_ids=torch.zeros((1, 4), dtype=torch.long, device=device))


def warn_if_bf16_emulated(dtype: torch.dtype, device: torch.device, what: str) -> None:
    """A RuntimeWarning when ``what`` is asked to run in bfloat16 on a CPU that emulates it: there
    a bfloat16 matmul is about a hundred times slower than float32, or worse (docs/performance.md,
    "bfloat16 on a CPU without it")."""
    if dtype == torch.bfloat16 and device.type == "cpu" and not cpu_has_native_bf16():
        warnings.warn(
            f"{what} runs in bfloat16 on a CPU without native bfloat16 (no AMX-BF16 or AVX512-BF16): "
            "torch emulates it, about a hundred times slower than float32. Set its dtype to auto "
            "(float32 on this CPU); see docs/performance.md.",
            RuntimeWarning,
            stacklevel=3,
        )


# vLLM's automatic CPU binding keeps one core per worker for its scheduler process. On a machine
# this small that is half of the compute or more (2 cores: SmolLM2 sampled 2.9 samples/s with one
# core, 5.3 with both; docs/performance.md), so there the worker gets every core.
SMALL_MACHINE_CPUS = 4
# Without a configured size, vLLM's CPU worker asks for 0.85 of the machine's RAM (its
# gpu_memory_utilization) as KV cache, and refuses to start when other processes hold more than
# the rest. ragutil sizes the cache from the model and the machine instead: what the engine's
# default batch (VLLM_MAX_SEQS sequences of max_model_len tokens) can fill, at most this share of
# the memory available when the engine starts, and never less than one full-length sequence.
KV_CACHE_SHARE_OF_AVAILABLE = 0.25
VLLM_MAX_SEQS = 256  # vLLM's default max_num_seqs for an in-process CPU engine (vllm.LLM)
_GIB = 1 << 30


# vLLM's CPU attention splits a sequence's keys into chunks by how many sequences a step holds
# (on by default), so a sample's logits move with its batch mates and an adaptive round draws
# other texts than fixed N. Off, 0.997 of SmolLM2's bfloat16 samples drawn in adaptive rounds are
# fixed N's (0.975 on), for a 6 % slower draw (bench/results/batch_noise_vllm.json).
SPLIT_KV_VARIABLE = "VLLM_CPU_ATTN_SPLIT_KV"
THREADS_VARIABLE = "VLLM_CPU_OMP_THREADS_BIND"


@dataclass(frozen=True)
class VLLMCPUPlacement:
    """How a vLLM CPU engine runs on this machine, as ragutil chose it (logged with the
    generations): the worker's OpenMP CPUs, the cores vLLM keeps for its scheduler, the KV
    cache and whether the attention splits keys by batch. ``*_source`` says where each choice
    came from (``machine``, ``config``, ``ragutil`` — its fixed choice — or ``environment`` — a
    variable the user set, which ragutil leaves alone)."""

    threads_bind: str
    threads_source: str
    reserved_cpus: str
    kv_cache_gib: float
    kv_cache_source: str
    split_kv: str
    split_kv_source: str

    def environment(self) -> dict[str, str]:
        """The variables ragutil sets for the engine (none where the user set them)."""
        chosen = {}
        if self.threads_source == "machine":
            chosen[THREADS_VARIABLE] = self.threads_bind
        if self.split_kv_source == "ragutil":
            chosen[SPLIT_KV_VARIABLE] = self.split_kv
        return chosen

    def metadata(self) -> dict[str, str]:
        """The choices as text entries named :data:`PLACEMENT_ENTRIES` (Dagster metadata of the
        generation steps, MLflow params of the partition runs)."""
        values = (
            f"{self.threads_bind} ({self.threads_source})",
            self.reserved_cpus,
            f"{self.kv_cache_gib:.3f} ({self.kv_cache_source})",
            f"{self.split_kv} ({self.split_kv_source})",
        )
        return dict(zip(PLACEMENT_ENTRIES, values, strict=True))


PLACEMENT_ENTRIES = (
    "vllm_cpu_threads_bind",
    "vllm_cpu_reserved_cpus",
    "vllm_kv_cache_gib",
    "vllm_cpu_attn_split_kv",
)


def vllm_cpu_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment variables ragutil adds for a vLLM CPU engine or server, none the user set:
    on a machine of at most :data:`SMALL_MACHINE_CPUS`, the worker's OpenMP threads bound to
    every CPU this process may use — an explicit binding, so vLLM reserves no core for its
    scheduler (it reserves them only when it binds automatically); everywhere, the attention's
    batch-dependent key splitting off (:data:`SPLIT_KV_VARIABLE`)."""
    environ = os.environ if environ is None else environ
    chosen = {}
    cpus = sorted(os.sched_getaffinity(0))
    if THREADS_VARIABLE not in environ and len(cpus) <= SMALL_MACHINE_CPUS:
        chosen[THREADS_VARIABLE] = ",".join(map(str, cpus))
    if SPLIT_KV_VARIABLE not in environ:
        chosen[SPLIT_KV_VARIABLE] = "0"
    return chosen


def available_memory_bytes() -> int:
    """Memory the kernel can give a new allocation without swapping (``MemAvailable``)."""
    import psutil

    return int(psutil.virtual_memory().available)


def vllm_cpu_placement(
    *,
    kv_cache_gib: float | None,
    kv_bytes_per_token: int,
    max_model_len: int,
    available_bytes: int,
    environ: Mapping[str, str] | None = None,
) -> VLLMCPUPlacement:
    """ragutil's choices for a vLLM CPU engine on this machine (see :class:`VLLMCPUPlacement`).

    The KV cache: ``kv_cache_gib`` when configured; else enough for :data:`VLLM_MAX_SEQS`
    sequences of ``max_model_len`` tokens at ``kv_bytes_per_token``, capped at
    :data:`KV_CACHE_SHARE_OF_AVAILABLE` of ``available_bytes`` and raised to one full-length
    sequence. Raises ``ValueError`` when not even one sequence fits in the available memory."""
    environ = os.environ if environ is None else environ
    chosen = vllm_cpu_environment(environ)
    if THREADS_VARIABLE in chosen:
        threads, threads_source, reserved = chosen[THREADS_VARIABLE], "machine", "0"
    else:
        threads = environ.get(THREADS_VARIABLE, "auto")
        threads_source = "environment" if THREADS_VARIABLE in environ else "vllm default"
        reserved = environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "vllm default (1 per worker)")
    if SPLIT_KV_VARIABLE in chosen:
        split = (chosen[SPLIT_KV_VARIABLE], "ragutil")
    else:
        split = (environ[SPLIT_KV_VARIABLE], "environment")
    if kv_cache_gib is not None:
        return VLLMCPUPlacement(threads, threads_source, reserved, kv_cache_gib, "config", *split)
    one_sequence = kv_bytes_per_token * max_model_len
    if one_sequence > available_bytes:
        raise ValueError(
            f"one sequence of max_model_len = {max_model_len} tokens needs {one_sequence / _GIB:.2f} GiB "
            f"of KV cache, but only {available_bytes / _GIB:.2f} GiB of memory is available: lower "
            "the engine's max_model_len or free memory"
        )
    wanted = min(one_sequence * VLLM_MAX_SEQS, KV_CACHE_SHARE_OF_AVAILABLE * available_bytes)
    return VLLMCPUPlacement(
        threads, threads_source, reserved, max(wanted, one_sequence) / _GIB, "machine", *split
    )


def resolve_dtype(dtype: str | torch.dtype | None, *, default: torch.dtype) -> torch.dtype:
    """The requested dtype (``None`` or ``"auto"``: ``default``)."""
    if dtype is None or dtype == "auto":
        return default
    if isinstance(dtype, torch.dtype):
        return dtype
    named = getattr(torch, str(dtype).removeprefix("torch."), None)
    if isinstance(named, torch.dtype):
        return named
    raise ValueError(
        f"unknown dtype {dtype!r}: use e.g. 'auto', 'float32', 'bfloat16' or 'float16'"
    )
