"""Second-stage reranking of a run with a cross-encoder: top-N candidates → top-k.

SePer §5.5 reranks the top 20 retrieved passages with bge-reranker-large and keeps 5; those are
the defaults here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import polars as pl

from ragutil_dagster.data.corpus import indexed_texts
from ragutil_dagster.retrieval.runs import validate_run
from ragutil_dagster.tables import RUN_SCHEMA


class PassageReranker(Protocol):
    """What reranking needs from a cross-encoder
    (:class:`ragutil_dagster.models.rerank.CrossEncoderReranker` is one)."""

    def score_many(
        self, queries: Sequence[str], passages: Sequence[Sequence[str]]
    ) -> list[np.ndarray]: ...


def rerank(
    run: pl.DataFrame,
    queries: pl.DataFrame,
    passages: pl.DataFrame,
    reranker: PassageReranker,
    top_n: int = 20,
    k: int = 5,
    name: str | None = None,
    include_title: bool = True,
) -> pl.DataFrame:
    """Rescore each query's first ``top_n`` passages with ``reranker`` and keep the best ``k``.

    ``queries`` (``id``, ``text``) and ``passages`` (corpus schema) supply the texts. Every
    retriever in ``run`` is reranked separately; the result is tagged ``name`` (default
    ``"<retriever>+rerank"``), scores are the reranker's. Equal reranker scores keep the
    first-stage order.
    """
    if top_n < 1 or not 1 <= k <= top_n:
        raise ValueError(f"need 1 <= k <= top_n, got k={k}, top_n={top_n}")
    candidates = (
        validate_run(run).filter(pl.col("rank") <= top_n).sort("retriever", "query_id", "rank")
    )
    query_text = dict(zip(queries["id"].to_list(), queries["text"].to_list()))
    needed = passages.filter(pl.col("id").is_in(candidates["doc_id"].unique().implode()))
    passage_text = dict(zip(needed["id"].to_list(), indexed_texts(needed, include_title)))
    for column, known, what in (
        ("query_id", query_text, "queries"),
        ("doc_id", passage_text, "passages"),
    ):
        missing = candidates.filter(
            ~pl.col(column).is_in(pl.Series(list(known), dtype=pl.String()).implode())
        )
        if missing.height:
            raise ValueError(f"run names a {column} absent from the {what}: {missing[column][0]!r}")
    reranked: list[pl.DataFrame] = []
    for (retriever,), part in candidates.group_by("retriever", maintain_order=True):
        grouped = part.group_by("query_id", maintain_order=True).agg("doc_id")
        query_ids = grouped["query_id"].to_list()
        doc_lists = grouped["doc_id"].to_list()
        scores = reranker.score_many(
            [query_text[qid] for qid in query_ids],
            [[passage_text[doc] for doc in docs] for docs in doc_lists],
        )
        # ``part`` is sorted by query then rank, so the flattened candidate lists follow its rows.
        reranked.append(
            part.select("query_id", "doc_id", pl.col("rank").alias("first_rank"))
            .with_columns(pl.Series("score", np.concatenate(scores).astype(np.float64)))
            .sort(
                ["query_id", "score", "first_rank"],
                descending=[False, True, False],
                maintain_order=True,
            )
            .with_columns(
                pl.int_range(1, pl.len() + 1, dtype=pl.Int32).over("query_id").alias("rank"),
                pl.lit(name or f"{retriever}+rerank").alias("retriever"),
            )
            .filter(pl.col("rank") <= k)
            .select(list(RUN_SCHEMA))
        )
    return pl.concat(reranked)
