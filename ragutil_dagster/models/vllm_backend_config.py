"""The ``vllm`` generator backend's entry (the vLLM engine in this process): its config models,
its factories and its :class:`Backend`. Light: the factories import ``vllm_backend`` (vLLM)
when called."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from ragutil_dagster.config import GeneratorConfig
from ragutil_dagster.models.backend_contract import Backend, Placement
from ragutil_dagster.models.identity import ModelRef

if TYPE_CHECKING:
    from ragutil_dagster.models.generation import Generator


class EngineConfig(BaseModel):
    """vLLM engine settings (``backend: vllm``); one engine per process serves every partition."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: str = "auto"
    max_model_len: int | None = Field(default=None, ge=16)
    gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1)
    tensor_parallel_size: int = Field(default=1, ge=1)
    enable_prefix_caching: bool = True
    kv_cache_space_gib: float | None = Field(default=None, gt=0)
    enforce_eager: bool = False


class VLLMGeneratorConfig(GeneratorConfig):
    """``backend: vllm``: the vLLM engine in this process (its dtype is ``engine.dtype``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: EngineConfig = EngineConfig()


def _generator(
    config: VLLMGeneratorConfig, local_copy: ModelRef, placement: Placement
) -> Generator:
    from ragutil_dagster.models.vllm_backend import VLLMGenerator

    return VLLMGenerator(
        local_copy,
        use_chat_template=config.use_chat_template,
        trust_remote_code=config.trust_remote_code,
        show_progress=placement.show_progress,
        **config.engine.model_dump(),
    )


def _scorer(generator: Any, placement: Placement) -> Any:
    from ragutil_dagster.models.vllm_backend import VLLMTokenScorer

    return VLLMTokenScorer(generator, show_progress=placement.show_progress)


def _runtime_metadata(_generator: Any) -> dict[str, str]:
    from ragutil_dagster.models.vllm_backend import engine_placement

    return engine_placement()


BACKEND = Backend(
    "vllm", VLLMGeneratorConfig, _generator, _scorer, runtime_metadata=_runtime_metadata
)
