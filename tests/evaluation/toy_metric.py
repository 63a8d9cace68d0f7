"""A toy per-query metric, written as a user would add one: its function and its catalogue entry
in one module; ``catalog.register(HAS_ANSWER_GAIN)`` is the registration."""

from __future__ import annotations

import polars as pl

from ragutil_dagster.metrics.catalog import Metric


def has_answer_gain(per_query: pl.DataFrame) -> pl.Series:
    """How much the context raises the share of samples holding a gold answer: has_answer with
    the top k together minus closed book (a ΔSePer with the lexical judge's kernel)."""
    return per_query["has_answer_rag"] - per_query["has_answer_closed"]


HAS_ANSWER_GAIN = Metric(
    "has_answer_gain",
    "has gain",
    "toy: has_answer rag − has_answer closed book",
    (-1, 1),
    level="query",
    ci=True,
    query_column=has_answer_gain,
)
