"""Device and dtype selection shared by every torch backend."""

from __future__ import annotations

import torch

__all__ = ["cpu_has_native_bf16", "default_causal_lm_dtype", "resolve_device", "resolve_dtype"]


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
