"""The ``sampling`` section: how many samples at which temperature, the labels' decoding, and
adaptive sampling's stop rule."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from ragutil_dagster.config.base import _Strict
from ragutil_dagster.sampling import SamplingParams, check_sampling_field

CLOSED_BOOK_ALWAYS_N = 0.01
"""A standard error below that of any group of at most 68 samples (the Jeffreys floor of 68
agreeing samples is 0.0101, of 10 0.060): as ``closed_book_target_se`` with N ≤ 68, the closed
book draws all N."""


class AdaptiveSamplingConfig(_Strict):
    """Adaptive sampling (``sampling.adaptive``): each prompt draws ``first_round`` samples, then
    ``round_size`` more per round while the standard error of its SePer_S over its samples
    (``metrics.seper.seper_standard_error``) is above its target, up to N_max = ``sampling.n``.
    Every round continues each prompt's sample stream (``SamplingParams.first_index``), so the
    samples a prompt draws are the first N_q of a fixed-N run with the same seed.

    The target is ``target_se`` for prompts with context and ``closed_book_target_se`` for the
    closed-book prompt: its SePer is subtracted from every context SePer of its question (rag,
    each per_doc passage, oracle, every setting), so its error enters each ΔSePer, while it is one
    prompt of many per question (docs/metrics.md). Its default, ``CLOSED_BOOK_ALWAYS_N``, is below
    the standard error of any group of at most 68 samples: the closed-book prompt draws all N, in
    one call. Set to ``null``, it is half of ``target_se``.

    The defaults are the rule ``bench/adaptive_rule.py`` chose on the replays of SQuAD
    development-half runs (``bench/adaptive_sampling.chosen_rule``); docs/metrics.md gives their
    figures on the report half."""

    first_round: int = Field(default=4, ge=2)
    round_size: int = Field(default=2, ge=1)
    target_se: float = Field(default=0.24, gt=0, lt=0.5)
    closed_book_target_se: float | None = Field(default=CLOSED_BOOK_ALWAYS_N, gt=0, lt=0.5)

    def target_for(self, condition: str) -> float:
        """The standard error at which a group of ``condition``'s samples stops."""
        if condition == "closed_book":
            return (
                self.target_se / 2
                if self.closed_book_target_se is None
                else self.closed_book_target_se
            )
        return self.target_se

    @property
    def key(self) -> str:
        """How the rule is named in MLflow's run parameters."""
        return (
            f"first_round={self.first_round},round_size={self.round_size},target_se={self.target_se},"
            f"closed_book_target_se={self.target_for('closed_book')}"
        )


class SamplingConfig(_Strict):
    """SePer's defaults (App. D): N = 10 samples at temperature 1.0.

    ``labels`` decides the one answer per prompt that MIRAGE, eRAG, gold utility, the known /
    unknown split and the pseudo-answer judge: ``greedy`` (default) adds one greedy answer per
    prompt (n = 1, temperature 0), as the papers decide their labels; ``most_likely`` takes
    the most likely of the N samples instead (no extra decoding; ragutil's earlier rule)."""

    n: int = 10
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 512
    stop: tuple[str, ...] = ("\n",)
    labels: Literal["greedy", "most_likely"] = "greedy"
    adaptive: AdaptiveSamplingConfig | None = None

    def params(self, seed: int, n: int | None = None, first_index: int = 0) -> SamplingParams:
        """The sampling value every generator backend takes (validated there); for an adaptive
        round, ``n`` samples (default: ``self.n``) from sample ``first_index`` of each stream."""
        return SamplingParams(
            n=self.n if n is None else n,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens,
            stop=self.stop,
            seed=seed,
            first_index=first_index,
        )

    def greedy_params(self, seed: int) -> SamplingParams:
        """One greedy answer per prompt, with the samples' length limit and stop strings."""
        return SamplingParams(
            n=1, temperature=0.0, max_new_tokens=self.max_new_tokens, stop=self.stop, seed=seed
        )

    @field_validator("n", "temperature", "top_p", "top_k", "max_new_tokens", "stop")
    @classmethod
    def _valid_for_sampling(cls, value: object, info: ValidationInfo) -> object:
        check_sampling_field(info.field_name, value)
        return value

    @model_validator(mode="after")
    def _samples_can_differ(self) -> SamplingConfig:
        # SePer and ΔSePer measure the spread of N samples; greedy decoding has none.
        if self.temperature == 0 and self.n > 1:
            raise ValueError(
                f"temperature 0 is greedy decoding: the n = {self.n} samples would all be identical; "
                "set a temperature > 0, or n: 1"
            )
        if self.adaptive is not None and self.adaptive.first_round > self.n:
            raise ValueError(
                f"adaptive.first_round {self.adaptive.first_round} is more than n = {self.n}, the most "
                "samples a prompt may draw; lower first_round or raise n"
            )
        return self
