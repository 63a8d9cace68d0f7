"""The oracle condition is MIRAGE's (§4.1): one relevant chunk, single-hop questions only;
every positive, multi-hop included, is the named alternative."""

from __future__ import annotations

import polars as pl

from ragutil_dagster.config import PromptConfig
from ragutil_dagster.evaluation.conditions import context_prompts, oracle_contexts
from ragutil_dagster.tables import QRELS_SCHEMA, RUN_SCHEMA

QUERIES = pl.DataFrame(
    {"query_id": ["q1", "q2", "q3"], "question": ["a?", "b?", "c?"], "n_hops": [1, 2, 1]}
)
QRELS = pl.DataFrame(
    {
        "query_id": ["q1", "q1", "q2", "q2"],
        "doc_id": ["d2", "d1", "d3", "d4"],
        "relevance": [1, 1, 1, 1],
    },
    schema=QRELS_SCHEMA,
)


def test_mirage_oracle_is_one_chunk_of_a_single_hop_question() -> None:
    assert oracle_contexts(QRELS, QUERIES, "mirage") == {"q1": ["d1"]}  # q2 is two-hop, q3 has none
    assert oracle_contexts(QRELS, QUERIES, "all_positives") == {
        "q1": ["d1", "d2"],
        "q2": ["d3", "d4"],
    }


def test_the_oracle_prompts_follow_the_rule() -> None:
    corpus = pl.DataFrame(
        {
            "id": [f"d{i}" for i in range(1, 5)],
            "title": [""] * 4,
            "text": [f"text {i}" for i in range(1, 5)],
        }
    )
    run = pl.DataFrame(
        {
            "query_id": ["q1", "q2", "q3"],
            "rank": [1, 1, 1],
            "doc_id": ["d4", "d4", "d4"],
            "score": [1.0] * 3,
            "retriever": ["r"] * 3,
        },
        schema=RUN_SCHEMA,
    )
    for rule, expected in (
        ("mirage", {"q1": ["d1"]}),
        ("all_positives", {"q1": ["d1", "d2"], "q2": ["d3", "d4"]}),
    ):
        prompts = context_prompts(QUERIES, corpus, run, QRELS, PromptConfig(oracle=rule))
        oracle = prompts.filter(pl.col("condition") == "oracle")
        assert dict(oracle.select("query_id", "doc_ids").iter_rows()) == expected
