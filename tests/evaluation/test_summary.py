"""The partition summary's LLM-specific-utility metrics (§3.4) from per-document signals."""

from __future__ import annotations

import polars as pl
import pytest

from ragutil_dagster.evaluation.scoring import summarize

QUERIES = pl.DataFrame({
    "query_id": ["q1", "q2"],
    "answer_loose_closed": [False, False],
    "answer_loose_oracle": [None, None],
    "answer_loose_rag": [False, False],
}, schema_overrides={"answer_loose_oracle": pl.Boolean})


def documents(likelihood: list[float | None], attention: list[float | None]) -> pl.DataFrame:
    """q1 ranks d1, d2 (d2 is the gold utilitarian passage); q2 ranks d3, d4 (no gold)."""
    return pl.DataFrame({
        "query_id": ["q1", "q1", "q2", "q2"],
        "doc_id": ["d1", "d2", "d3", "d4"],
        "rank": [1, 2, 1, 2],
        "erag_label": [0, 1, 0, 0],
        "gold_utility": [False, True, False, False],
        "likelihood": likelihood,
        "likelihood_selected": [x is not None and x > -2 for x in likelihood],
        "attention": attention,
    }, schema_overrides={"likelihood": pl.Float64, "attention": pl.Float64})


def test_a_passage_without_a_signal_ranks_last_not_first() -> None:
    # d1 was dropped from the prompt (no signal): it must not outrank the scored gold passage d2.
    summary = summarize(QUERIES, documents([None, -1.0, -3.0, -4.0], [None, 0.6, 0.5, 0.5]), k=2)
    assert summary["utility_likelihood_ndcg_2"] == pytest.approx(1.0)
    assert summary["utility_attention_ndcg_2"] == pytest.approx(1.0)


def test_queries_without_any_signal_are_left_out() -> None:
    # q2 has no pseudo-answer (no signal at all): only q1 counts, and it has gold.
    summary = summarize(QUERIES, documents([-5.0, -1.0, None, None], [0.2, 0.8, None, None]), k=2)
    assert summary["utility_likelihood_precision"] == pytest.approx(1.0)  # d2 alone selected
    assert "utility_likelihood_accuracy_empty" not in summary  # q2 (empty gold) left out


def test_attention_only_ranks() -> None:
    # §3.3.2 uses attention to rank passages; a selection rule would be ours, so none is scored.
    summary = summarize(QUERIES, documents([-5.0, -1.0, -3.0, -4.0], [0.2, 0.8, 0.5, 0.5]), k=2)
    assert "utility_attention_ndcg_2" in summary
    assert not any(
        name.startswith("utility_attention_") and not name.startswith(("utility_attention_ndcg", "utility_attention_recall_"))
        for name in summary
    )
