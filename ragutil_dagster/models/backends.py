"""Generator backends by the name an experiment config gives them (``backend: hf | vllm | openai``).

The one place that knows every backend; each is imported only when asked for, so vLLM (and
its engine) loads only in processes that use it.
"""

from __future__ import annotations

import typing

from ragutil_dagster.config import GeneratorBackend
from ragutil_dagster.models.generation import Generator
from ragutil_dagster.models.identity import ModelRef

BACKENDS: tuple[str, ...] = typing.get_args(GeneratorBackend)


def build_generator(backend: str, model: str | ModelRef, **options: object) -> Generator:
    """A generator by backend name; ``options`` go to that backend's constructor."""
    if backend == "hf":
        from ragutil_dagster.models.generation import HFGenerator

        return HFGenerator(model, **options)
    if backend == "vllm":
        from ragutil_dagster.models.vllm_backend import VLLMGenerator

        return VLLMGenerator(model, **options)
    if backend == "openai":
        from ragutil_dagster.models.openai_backend import OpenAIGenerator

        return OpenAIGenerator(model=str(model), **options)  # model: the name as served
    raise ValueError(f"unknown generator backend {backend!r}; choose one of {', '.join(BACKENDS)}")
