"""Device and dtype selection shared by every torch backend."""

from __future__ import annotations

import torch

__all__ = ["resolve_device", "resolve_dtype"]


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """The requested device, or CUDA when present and CPU otherwise."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was requested but CUDA is not available here")
    return resolved


def resolve_dtype(
    dtype: str | torch.dtype | None,
    device: torch.device,
    *,
    cuda_default: torch.dtype = torch.bfloat16,
) -> torch.dtype:
    """The requested dtype, or ``cuda_default`` on CUDA and float32 elsewhere.

    CPU kernels for half precision are slow and less accurate, so CPU stays float32.
    """
    if dtype is None:
        return cuda_default if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    named = getattr(torch, str(dtype).removeprefix("torch."), None)
    if isinstance(named, torch.dtype):
        return named
    raise ValueError(f"unknown dtype {dtype!r}: use e.g. 'float32', 'bfloat16' or 'float16'")
