"""Fixtures for the metric tests: NLI stand-ins whose answers are known exactly."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pytest

ENTAIL = np.array([0.0, 0.0, 1.0])
NEUTRAL = np.array([0.0, 1.0, 0.0])
CONTRADICT = np.array([1.0, 0.0, 0.0])


class MeaningNLI:
    """Entailment between texts that share a meaning, contradiction otherwise; counts its calls.

    ``meaning`` maps each text (question prefix stripped) to a meaning id; unknown texts mean
    themselves.
    """

    def __init__(self, meaning: Mapping[str, str] | None = None, question: str | None = None):
        self.meaning = dict(meaning or {})
        self.prefix = (
            ""
            if question is None
            else (question if question.endswith("?") else question + "?") + " "
        )
        self.calls: list[list[tuple[str, str]]] = []

    def _meaning(self, text: str) -> str:
        assert text.startswith(self.prefix), f"NLI input {text!r} lacks the question prefix"
        text = text[len(self.prefix) :]
        return self.meaning.get(text, text)

    def __call__(self, premises: Sequence[str], hypotheses: Sequence[str]) -> np.ndarray:
        self.calls.append(list(zip(premises, hypotheses)))
        return np.array(
            [
                ENTAIL if self._meaning(p) == self._meaning(h) else CONTRADICT
                for p, h in zip(premises, hypotheses)
            ]
        ).reshape(len(premises), 3)

    @property
    def pairs_sent(self) -> int:
        return sum(len(call) for call in self.calls)


@pytest.fixture
def meaning_nli() -> Callable[..., MeaningNLI]:
    return MeaningNLI


def equal_logprobs(n: int, value: float = -0.5, length: int = 3) -> list[list[float]]:
    return [[value] * length for _ in range(n)]


@pytest.fixture
def flat_logprobs() -> Callable[..., list[list[float]]]:
    return equal_logprobs
