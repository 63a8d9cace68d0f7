"""N-sample generation with the model's own token log-probabilities.

SePer (Dai et al., ICLR 2025, §3.3, Algorithm 1 steps 1–2) needs, per question, N sampled
responses r_i and their likelihoods p(r_i | q) under the generator. Every backend implements the
:class:`Generator` protocol, each in a module of its own: ``HFGenerator``
(``ragutil_dagster.models.hf_backend``, transformers), ``VLLMGenerator`` (``models.vllm_backend``)
and ``OpenAIGenerator`` (``models.openai_backend``, OpenAI-compatible servers). This module holds
what they share: :class:`Sample`, the rounds of adaptive sampling, the per-sample seed and stop
strings.

Log-probabilities are always those of the model's own distribution — log-softmax of the *raw*
logits — never of the temperature / top-k / top-p processed distribution the token was drawn
from: p(r | q) in SePer is the model's likelihood of the response.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from ragutil_dagster.models.inputs import check_texts
from ragutil_dagster.sampling import SamplingParams, check_rounds

__all__ = [
    "FinishReason",
    "Generator",
    "KeepGoing",
    "RoundSampler",
    "checked_round_prompts",
    "Sample",
    "row_seed",
    "sample_rounds",
    "sample_rounds_by_calls",
    "still_drawing",
    "truncate_at_stop",
]

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Sample:
    """One sampled response.

    ``token_ids`` are every generated token, including the end-of-sequence token or the token
    that completed a stop string; ``token_logprobs`` are their log-probabilities under the
    model's raw distribution (log-softmax of the unprocessed logits). ``text`` is the decoded
    response without special tokens, cut before the stop string. ``finish_reason`` is
    ``"stop"`` (end-of-sequence or stop string) or ``"length"`` (``max_new_tokens`` reached).
    """

    text: str
    token_ids: tuple[int, ...]
    token_logprobs: tuple[float, ...]
    finish_reason: FinishReason
    prompt_tokens: int

    @property
    def logprob(self) -> float:
        """log p(response | prompt): the sum of the token log-probabilities."""
        return float(sum(self.token_logprobs))


@runtime_checkable
class Generator(Protocol):
    """A sampler of N responses per prompt with true log-probabilities.

    ``sample`` returns, per prompt and in order, ``n`` :class:`Sample` s. Log-probabilities are
    those of the model's own distribution (log-softmax of the raw logits), not of the processed
    sampling distribution. The same arguments and seed give the same samples, and a prompt's
    samples do not depend on the other prompts of the call.
    """

    @property
    def identity(self) -> str: ...

    @property
    def settings(self) -> dict[str, object]:
        """Everything besides per-call parameters that changes the samples (backend, model
        identity, dtype, prompt formatting): the generation cache's namespace."""
        ...

    @property
    def context_length(self) -> int | None:
        """The most positions (prompt plus generated tokens) the model handles; None if unbounded."""
        ...

    def count_prompt_tokens(self, prompts: Sequence[str]) -> list[int]:
        """Tokens of each prompt as this generator encodes it (chat template included)."""
        ...

    def sample(self, prompts: Sequence[str], params: SamplingParams) -> list[list[Sample]]: ...


KeepGoing = Callable[[list[int], list[list[Sample]]], list[bool]]
"""Adaptive sampling's decision between rounds: given the indices of some prompts of the call and
every sample each has drawn so far, whether each draws the next round."""


@runtime_checkable
class RoundSampler(Protocol):
    """A generator that draws rounds itself (:func:`sample_rounds`), e.g. keeping each prompt's
    prefill between rounds instead of computing it again for every round."""

    def sample_rounds(
        self, prompts: Sequence[str], rounds: Sequence[SamplingParams], keep_going: KeepGoing
    ) -> list[list[list[Sample]]]: ...


def sample_rounds(
    generator: Generator,
    prompts: Sequence[str],
    rounds: Sequence[SamplingParams],
    keep_going: KeepGoing,
) -> list[list[list[Sample]]]:
    """Each of the distinct ``prompts`` sampled in ``rounds`` (:func:`~ragutil_dagster.sampling.check_rounds`):
    every prompt draws the first round, and the next while ``keep_going`` says so. Returns per
    prompt the samples of each round it drew. A :class:`RoundSampler` draws them its own way;
    any other generator gets one :meth:`Generator.sample` call per round."""
    if isinstance(generator, RoundSampler):
        return generator.sample_rounds(prompts, rounds, keep_going)
    return sample_rounds_by_calls(generator, prompts, rounds, keep_going)


def checked_round_prompts(prompts: Sequence[str], rounds: Sequence[SamplingParams]) -> list[str]:
    """``prompts`` as a list, after checking them and ``rounds``: rounds need distinct prompts,
    since ``keep_going`` decides per prompt."""
    prompts = check_texts(prompts, "prompts")
    check_rounds(rounds)
    seen: dict[str, int] = {}
    for i, prompt in enumerate(prompts):
        if prompt in seen:
            raise ValueError(
                f"prompts[{i}] repeats prompts[{seen[prompt]}]; rounds are drawn per distinct prompt"
            )
        seen[prompt] = i
    return prompts


def sample_rounds_by_calls(
    generator: Generator,
    prompts: Sequence[str],
    rounds: Sequence[SamplingParams],
    keep_going: KeepGoing,
) -> list[list[list[Sample]]]:
    """:func:`sample_rounds` with one ``generator.sample`` call per round over the prompts still
    drawing (a backend with a prefix cache, as vLLM's, does not prefill them again)."""
    prompts = checked_round_prompts(prompts, rounds)
    drawn: list[list[list[Sample]]] = [[] for _ in prompts]
    active = list(range(len(prompts)))
    for number, params in enumerate(rounds):
        for i, samples in zip(
            active, generator.sample([prompts[i] for i in active], params), strict=True
        ):
            drawn[i].append(samples)
        if number == len(rounds) - 1:
            break
        active = still_drawing(keep_going, active, drawn)
        if not active:
            break
    return drawn


def still_drawing(
    keep_going: KeepGoing, active: list[int], drawn: list[list[list[Sample]]]
) -> list[int]:
    """The prompts of ``active`` (indices) that draw another round: ``keep_going`` asked with every
    sample each has drawn so far (``drawn[i]``: prompt i's rounds)."""
    going = keep_going(active, [[s for got in drawn[i] for s in got] for i in active])
    return [i for i, more in zip(active, going, strict=True) if more]


def row_seed(seed: int, prompt: str, index: int) -> int:
    """The RNG seed of sample ``index`` of ``prompt``: a hash of (seed, prompt, index).

    Seeding each sample from its own content (not from its position in a batch) makes it
    independent of batch-mates and of ``n`` (asking for more samples keeps the first ones).
    """
    digest = hashlib.sha256(f"{seed}\x00{index}\x00{prompt}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def truncate_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` cut before the earliest occurrence of any stop string, and whether one occurred."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
