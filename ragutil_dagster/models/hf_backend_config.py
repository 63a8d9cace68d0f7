"""The ``hf`` generator backend's entry (transformers in this process): its config model, its
factories and its :class:`Backend`. Light: the factories import ``hf_backend`` (torch,
transformers) when called."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict

from ragutil_dagster.config import GeneratorConfig
from ragutil_dagster.models.backend_contract import Backend, Placement
from ragutil_dagster.models.identity import ModelRef

if TYPE_CHECKING:
    from ragutil_dagster.models.generation import Generator


class HFGeneratorConfig(GeneratorConfig):
    """``backend: hf``: transformers in this process. ``dtype``: the weights' (``auto``:
    models/device.default_causal_lm_dtype)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"


def _generator(config: HFGeneratorConfig, local_copy: ModelRef, placement: Placement) -> Generator:
    from ragutil_dagster.models.hf_backend import HFGenerator

    return HFGenerator(
        local_copy,
        device=placement.device,
        dtype=config.dtype,
        use_chat_template=config.use_chat_template,
        trust_remote_code=config.trust_remote_code,
        max_batch_rows=placement.batch_rows,
        show_progress=placement.show_progress,
    )


def _scorer(generator: Any, placement: Placement) -> Any:
    from ragutil_dagster.models.token_scoring import TokenScorer

    return TokenScorer(generator.lm, show_progress=placement.show_progress)


BACKEND = Backend("hf", HFGeneratorConfig, _generator, _scorer)
