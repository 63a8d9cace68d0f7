"""The scoring cache: a (prompt, continuation) scored once per model, stored beside the samples."""

from __future__ import annotations

import numpy as np
import pytest
import sqlalchemy as sa

from ragutil_dagster.models.cache import SCORES_TABLE, GenerationCache
from ragutil_dagster.models.scoring_cache import CachedScorer
from ragutil_dagster.models.token_scoring import ScoredContinuation


class CountingScorer:
    """Scores a continuation by its length and its prompt; counts what it was asked."""

    identity = "counting"
    supports_attention = True

    def __init__(self) -> None:
        self.scored: list[tuple[str, str]] = []
        self.attended: list[tuple[str, str]] = []

    def score(self, prompts, continuations):
        self.scored += list(zip(prompts, continuations))
        return [
            ScoredContinuation(
                token_ids=tuple(range(len(c.split()))),
                tokens=tuple(c.split()),
                word_ids=tuple(range(len(c.split()))),
                token_logprobs=tuple(-0.1 * len(p) - i for i in range(len(c.split()))),
                prompt_tokens=len(p.split()),
            )
            for p, c in zip(prompts, continuations)
        ]

    def passage_attention(self, prompts, continuations, spans):
        self.attended += list(zip(prompts, continuations))
        return [
            np.array([np.nan if not c else len(p) / (k + 1) for k in range(len(s))])
            for p, c, s in zip(prompts, continuations, spans)
        ]


@pytest.fixture
def cached(tmp_path):
    inner = CountingScorer()
    return inner, CachedScorer(inner, {"backend": "hf", "model": "m"}, GenerationCache(tmp_path))


def test_a_pair_is_scored_once_and_served_equal_afterwards(cached) -> None:
    inner, scorer = cached
    first = scorer.score(["q1", "q2", "q1"], ["an answer", "other", "an answer"])
    assert inner.scored == [("q1", "an answer"), ("q2", "other")]  # a repeated pair once
    again = scorer.score(["q2", "q1", "q3"], ["other", "an answer", "new one"])
    assert inner.scored[2:] == [("q3", "new one")]
    assert again[:2] == [first[1], first[0]]
    assert again[2].tokens == ("new", "one")


def test_attention_masses_are_cached_per_spans_with_nan_kept(cached) -> None:
    inner, scorer = cached
    spans = [[(0, 1), (1, 2)], [(0, 2)]]
    first = scorer.passage_attention(["ab", "cd"], ["x", ""], spans)
    again = scorer.passage_attention(["ab", "cd"], ["x", ""], spans)
    assert len(inner.attended) == 2
    np.testing.assert_array_equal(first[0], again[0])
    assert np.isnan(again[1]).all()  # an empty continuation's undefined mass survives the store
    scorer.passage_attention(["ab"], ["x"], [[(0, 2)]])  # other spans: another request
    assert len(inner.attended) == 3


def test_other_settings_score_anew(tmp_path) -> None:
    cache = GenerationCache(tmp_path)
    inner = CountingScorer()
    CachedScorer(inner, {"model": "a"}, cache).score(["q"], ["x"])
    CachedScorer(inner, {"model": "b"}, cache).score(["q"], ["x"])
    assert len(inner.scored) == 2


def test_a_corrupt_entry_is_recomputed_and_replaced(cached, caplog) -> None:
    inner, scorer = cached
    expected = scorer.score(["q"], ["an answer"])
    with scorer.cache.engine.begin() as db:
        db.execute(sa.text(f"UPDATE {SCORES_TABLE} SET entry = :e"), {"e": b"garbage"})
    assert scorer.score(["q"], ["an answer"]) == expected
    assert len(inner.scored) == 2 and "scoring cache entries" in caplog.text
    scorer.score(["q"], ["an answer"])
    assert len(inner.scored) == 2  # the recomputed entry was stored
