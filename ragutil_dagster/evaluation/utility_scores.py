"""LLM-specific utility judged against the gold answers: gold utility (eq. 1) and the utility
step's candidates, judgments and RAG answers of one setting × generator."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ragutil_dagster.evaluation.conditions import (
    UTILITY_PER_CANDIDATE,
    UTILITY_PSEUDO_ANSWER,
    utility_rag_condition,
)
from ragutil_dagster.metrics import answers as answer_metrics
from ragutil_dagster.tables import CANDIDATE_SCHEMA, DECODING_GREEDY


def gold_utility() -> pl.Expr:
    """LLM-specific utility eq. 1: the judged answer with the passage alone holds a gold answer
    (``answer_has``) and the judged closed-book answer does not (``answer_has_closed``)."""
    return (pl.col("answer_has") & ~pl.col("answer_has_closed")).alias("gold_utility")


@dataclass(frozen=True)
class UtilityScores:
    """LLM-specific utility of one setting × generator, judged against the gold answers:
    ``candidates`` (``CANDIDATE_SCHEMA``: per candidate its judged answer alone, gold utility and
    signals), the generator's ``judgments`` (``UTILITY_JUDGMENT_SCHEMA``) and ``rag``: per query
    and ``source`` — a verbalized method, or ``candidates`` (all of them, the pseudo-answer's
    prompt) — has_answer of the greedy answer with that source's passages."""

    candidates: pl.DataFrame
    judgments: pl.DataFrame
    rag: pl.DataFrame


def utility_scores(
    groups: pl.DataFrame,
    queries: pl.DataFrame,
    candidates: pl.DataFrame,
    generations: pl.DataFrame,
    signals: pl.DataFrame,
    judgments: pl.DataFrame,
) -> UtilityScores:
    """Judge the utility step's outputs (``evaluation.verbalized``): each candidate's answer alone
    is its ``per_doc`` group's judged answer within the top k, else its ``per_candidate`` greedy
    answer; gold utility (eq. 1) against the judged closed-book answer; RAG with a method's
    passages is its ``rag_<method>`` answer, or the closed-book one when it chose none."""
    golds = dict(queries.select("query_id", "answers").iter_rows())

    greedy = generations.filter(pl.col("decoding") == DECODING_GREEDY)

    def answered(condition: pl.Expr, *keys: str) -> pl.DataFrame:
        """The greedy answers of ``condition`` with has_answer against the gold answers."""
        rows = greedy.filter(condition).select(*keys, pl.col("text").alias("answer"))
        return rows.with_columns(
            pl.Series(
                "answer_has",
                [
                    answer_metrics.has_answer(text, golds[qid])
                    for qid, text in rows.select("query_id", "answer").iter_rows()
                ],
                dtype=pl.Boolean,
            )
        )

    alone = pl.concat(
        [
            groups.filter(pl.col("condition") == "per_doc").select(
                "query_id", "doc_id", "answer", "answer_has"
            ),
            answered(pl.col("condition") == UTILITY_PER_CANDIDATE, "query_id", "doc_id"),
        ]
    )
    closed = groups.filter(pl.col("condition") == "closed_book").select(
        "query_id", pl.col("answer_has").alias("answer_has_closed")
    )
    table = (
        candidates.select("query_id", "doc_id", "rank")
        .join(alone, on=["query_id", "doc_id"], how="left")
        .join(closed, on="query_id", how="left")
        .with_columns(gold_utility())
        .join(signals, on=["query_id", "doc_id"], how="left")
        .select(*CANDIDATE_SCHEMA)
        .cast(CANDIDATE_SCHEMA)
        .sort("query_id", "rank")
    )
    if table["gold_utility"].null_count():
        missing = table.filter(pl.col("gold_utility").is_null()).row(0, named=True)
        raise ValueError(
            f"query {missing['query_id']!r}, candidate {missing['doc_id']!r} (rank {missing['rank']}): no answer "
            "with it alone (per_doc within the top k, per_candidate beyond) or no closed-book answer"
        )
    rag_conditions = [utility_rag_condition(m) for m in judgments["method"].unique()]
    with_passages = {
        (qid, condition): has
        for qid, condition, _, has in answered(
            pl.col("condition").is_in(rag_conditions), "query_id", "condition"
        ).iter_rows()
    }
    closed_has = dict(closed.iter_rows())
    rag = [
        (
            qid,
            method,
            with_passages[(qid, utility_rag_condition(method))] if docs else closed_has[qid],
        )
        for qid, method, docs in judgments.select("query_id", "method", "rag_doc_ids").iter_rows()
    ]
    pseudo = answered(pl.col("condition") == UTILITY_PSEUDO_ANSWER, "query_id")
    rag.extend((qid, UTILITY_PSEUDO_ANSWER, has) for qid, _, has in pseudo.iter_rows())
    schema = {"query_id": pl.String, "source": pl.String, "has_answer": pl.Boolean}
    rag_table = pl.DataFrame(rag, schema=schema, orient="row")
    return UtilityScores(table, judgments, rag_table)
