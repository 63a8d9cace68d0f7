"""Hybrid retrieval by reciprocal rank fusion of run tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import polars as pl

from ragutil_dagster.retrieval.runs import validate_run
from ragutil_dagster.tables import RUN_SCHEMA


def reciprocal_rank_fusion(
    runs: pl.DataFrame | Sequence[pl.DataFrame],
    k: int = 60,
    depth: int | None = None,
    top: int | None = None,
    name: str = "rrf",
) -> pl.DataFrame:
    """Fuse the rankings of several retrievers (Cormack, Clarke & Büttcher, SIGIR 2009):
    ``score(d) = Σ_r 1 / (k + rank_r(d))`` over the retrievers ``r`` that returned ``d``.

    ``runs`` is one run table holding several ``retriever`` values, or a list of run tables.
    ``depth`` keeps only each retriever's first ``depth`` ranks before fusing; ``top`` keeps the
    fused first ``top``. Ties are broken by doc id so the result is deterministic.
    """
    if k < 0:
        raise ValueError(f"k must be non-negative, got {k}")
    tables = [runs] if isinstance(runs, pl.DataFrame) else list(runs)
    if not tables:
        raise ValueError("no runs to fuse")
    combined = validate_run(pl.concat([validate_run(table) for table in tables]))
    if depth is not None:
        combined = combined.filter(pl.col("rank") <= depth)
    fused = (
        combined.group_by("query_id", "doc_id")
        .agg((1.0 / (k + pl.col("rank").cast(pl.Float64))).sum().alias("score"))
        .sort(["query_id", "score", "doc_id"], descending=[False, True, False])
        .with_columns(
            pl.int_range(1, pl.len() + 1, dtype=pl.Int32).over("query_id").alias("rank"),
            pl.lit(name).alias("retriever"),
        )
    )
    if top is not None:
        fused = fused.filter(pl.col("rank") <= top)
    return fused.select(list(RUN_SCHEMA))


class Searcher(Protocol):
    """What a retriever gives: the top ``k`` passages of each query as a run table named ``name``."""

    def search(self, queries: pl.DataFrame, k: int = 10, name: str = "") -> pl.DataFrame: ...


@dataclass(frozen=True)
class HybridSearcher:
    """A hybrid retriever: each of ``searchers`` retrieves its first ``depth`` passages (at least
    the k asked for), and :func:`reciprocal_rank_fusion` with constant ``rrf_k`` ranks their union."""

    searchers: Sequence[Searcher]
    rrf_k: int = 60
    depth: int = 100

    def search(self, queries: pl.DataFrame, k: int = 10, name: str = "hybrid") -> pl.DataFrame:
        depth = max(self.depth, k)
        runs = [
            searcher.search(queries, k=depth, name=f"{name}:{n}")
            for n, searcher in enumerate(self.searchers)
        ]
        return reciprocal_rank_fusion(runs, k=self.rrf_k, top=k, name=name)
