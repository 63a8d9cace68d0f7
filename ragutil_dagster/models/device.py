"""Device and dtype selection shared by every torch backend."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping

import torch

__all__ = [
    "cpu_has_native_bf16", "default_causal_lm_dtype", "resolve_device", "resolve_dtype",
    "vllm_cpu_environment", "warn_if_bf16_emulated",
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
    with native bfloat16 (its speed-up and log-prob difference against float32 are measured in
    docs/performance.md), float32 elsewhere."""
    if device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16()):
        return torch.bfloat16
    return torch.float32


def warn_if_bf16_emulated(dtype: torch.dtype, device: torch.device, what: str) -> None:
    """A RuntimeWarning when ``what`` is asked to run in bfloat16 on a CPU that emulates it: there
    a bfloat16 matmul is about a hundred times slower than float32, or worse (docs/performance.md,
    "bfloat16 on a CPU without it")."""
    if dtype == torch.bfloat16 and device.type == "cpu" and not cpu_has_native_bf16():
        warnings.warn(
            f"{what} runs in bfloat16 on a CPU without native bfloat16 (no AMX-BF16 or AVX512-BF16): "
            "torch emulates it, about a hundred times slower than float32. Set its dtype to auto "
            "(float32 on this CPU); see docs/performance.md.",
            RuntimeWarning, stacklevel=3,
        )


# vLLM's automatic CPU binding keeps one core per worker for its scheduler process. On a machine
# this small that is half of the compute or more (2 cores: SmolLM2 sampled 2.9 samples/s with one
# core, 5.3 with both; docs/performance.md), so there the worker gets every core.
SMALL_MACHINE_CPUS = 4


def vllm_cpu_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment variables ragutil adds for a vLLM CPU engine or server: the worker's
    OpenMP threads bound to every CPU this process may use, on a machine of at most
    :data:`SMALL_MACHINE_CPUS`; nothing where the user set ``VLLM_CPU_OMP_THREADS_BIND``."""
    environ = os.environ if environ is None else environ
    cpus = sorted(os.sched_getaffinity(0))
    if "VLLM_CPU_OMP_THREADS_BIND" in environ or len(cpus) > SMALL_MACHINE_CPUS:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus))}


def resolve_dtype(dtype: str | torch.dtype | None, *, default: torch.dtype) -> torch.dtype:
    """The requested dtype (``None`` or ``"auto"``: ``default``)."""
    if dtype is None or dtype == "auto":
        return default
    if isinstance(dtype, torch.dtype):
        return dtype
    named = getattr(torch, str(dtype).removeprefix("torch."), None)
    if isinstance(named, torch.dtype):
        return named
    raise ValueError(f"unknown dtype {dtype!r}: use e.g. 'auto', 'float32', 'bfloat16' or 'float16'")
