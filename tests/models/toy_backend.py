"""A toy generator backend, written as a new backend is: its config model, generator and token
scorer here, and one :class:`Backend` to register (the contract tests register it for their
module). It samples ``prompts_per_call`` prompts at a time through the HF decode loop in float32."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ConfigDict, Field

from ragutil_dagster.config import GeneratorConfig
from ragutil_dagster.models.backend_contract import Backend, Placement
from ragutil_dagster.models.generation import Sample
from ragutil_dagster.models.hf_backend import HFGenerator
from ragutil_dagster.models.identity import ModelRef
from ragutil_dagster.models.token_scoring import TokenScorer
from ragutil_dagster.sampling import SamplingParams


class ToyGeneratorConfig(GeneratorConfig):
    """``backend: toy``; its own key: ``prompts_per_call``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompts_per_call: int = Field(default=1, ge=1)


class ToyGenerator:
    backend = "toy"

    def __init__(
        self, config: ToyGeneratorConfig, local_copy: ModelRef, placement: Placement
    ) -> None:
        self.inner = HFGenerator(
            local_copy, device=placement.device, dtype="float32", show_progress=False
        )
        self.prompts_per_call = config.prompts_per_call

    @property
    def identity(self) -> str:
        return self.inner.identity

    @property
    def settings(self) -> dict[str, object]:
        return {**self.inner.settings, "backend": self.backend}

    @property
    def context_length(self) -> int | None:
        return self.inner.context_length

    def count_prompt_tokens(self, prompts: Sequence[str]) -> list[int]:
        return self.inner.count_prompt_tokens(prompts)

    def sample(self, prompts: Sequence[str], params: SamplingParams) -> list[list[Sample]]:
        step = self.prompts_per_call
        return [
            per
            for start in range(0, len(prompts), step)
            for per in self.inner.sample(prompts[start : start + step], params)
        ]


def toy_scorer(generator: ToyGenerator, placement: Placement) -> TokenScorer:
    return TokenScorer(generator.inner.lm, show_progress=placement.show_progress)


TOY = Backend("toy", ToyGeneratorConfig, ToyGenerator, toy_scorer)
