"""MIRAGE — Park et al.: RAG-adaptability metrics (§4.2, eqs. 1–6) and retriever metrics (Table 2).

Each question is answered three ways: base (no context), oracle (the gold chunk) and mixed (the
gold chunk among noisy ones). Grouping questions by the correctness triple (b, o, m) gives eight
groups G(b, o, m) (eq. 1); the four metrics are shares of the dataset and sum to 1 (eq. 6).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import polars as pl

from ragutil_dagster.metrics.ranking import dcg
from ragutil_dagster.tables import ORACLE_SCHEMA


@dataclass(frozen=True)
class Adaptability:
    """MIRAGE's four metrics (shares of the dataset) and the group sizes |G(b, o, m)|."""

    noise_vulnerability: float
    context_acceptability: float
    context_insensitivity: float
    context_misinterpretation: float
    groups: dict[tuple[int, int, int], int]
    n: int

    def as_dict(self) -> dict[str, float]:
        return {
            "noise_vulnerability": self.noise_vulnerability,
            "context_acceptability": self.context_acceptability,
            "context_insensitivity": self.context_insensitivity,
            "context_misinterpretation": self.context_misinterpretation,
        }

    def counts(self) -> dict[str, int]:
        """The numerators of eqs. 2–5: how many questions each metric counts (its two groups),
        to print beside the shares; they sum to ``n`` (eq. 6)."""
        return {
            name: sum(self.groups[group] for group in groups)
            for name, groups in _METRIC_GROUPS.items()
        }


# Each metric's two groups G(b, o, m), eqs. 2–5.
_METRIC_GROUPS: dict[str, tuple[tuple[int, int, int], tuple[int, int, int]]] = {
    "noise_vulnerability": ((0, 1, 0), (1, 1, 0)),
    "context_acceptability": ((0, 1, 1), (1, 1, 1)),
    "context_insensitivity": ((0, 0, 0), (0, 0, 1)),
    "context_misinterpretation": ((1, 0, 0), (1, 0, 1)),
}


def _as_bool(name: str, values: Sequence[bool]) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name}: expected one boolean per question, got shape {array.shape}")
    if array.dtype != bool and not np.isin(array, (0, 1)).all():
        raise ValueError(f"{name}: expected booleans (or 0/1), got values {np.unique(array)[:5]}")
    return array.astype(bool)


def adaptability(
    base: Sequence[bool], oracle: Sequence[bool], mixed: Sequence[bool]
) -> Adaptability:
    """Noise vulnerability (eq. 2: o = 1, m = 0), context acceptability (eq. 3: o = 1, m = 1),
    context insensitivity (eq. 4: b = 0, o = 0) and context misinterpretation (eq. 5: b = 1, o = 0),
    from per-question correctness without context, with the oracle chunk, and with the mixed
    context."""
    b, o, m = (_as_bool(n, v) for n, v in (("base", base), ("oracle", oracle), ("mixed", mixed)))
    if not len(b) == len(o) == len(m):
        raise ValueError(
            f"base, oracle and mixed must cover the same questions: {len(b)}, {len(o)}, {len(m)}"
        )
    if len(b) == 0:
        raise ValueError("no questions given")
    groups = {
        (bi, oi, mi): int(np.sum((b == bi) & (o == oi) & (m == mi)))
        for bi in (0, 1)
        for oi in (0, 1)
        for mi in (0, 1)
    }
    n = len(b)

    def share(*keys: tuple[int, int, int]) -> float:
        return sum(groups[key] for key in keys) / n

    return Adaptability(
        **{name: share(*keys) for name, keys in _METRIC_GROUPS.items()}, groups=groups, n=n
    )


@dataclass(frozen=True)
class RetrieverMetrics:
    precision: float
    recall: float
    f1: float
    ndcg: float


MIRAGE_RETRIEVAL_DEPTH = 5
"""How many chunks MIRAGE retrieves per question (its config.yaml, ``retriever_info.top_k``): its
code scores NDCG@1, @3 and @5 of Table 2 within this one top-5 list."""


def mirage_ideal_relevance(relevance: np.ndarray, k: int) -> np.ndarray:
    """The ideal ranking of MIRAGE's NDCG@k: the relevance labels of the top max(k, 5) retrieved,
    sorted, cut at k. MIRAGE's code sorts the labels of its whole retrieved list (the top 5, see
    ``MIRAGE_RETRIEVAL_DEPTH``) for every k it reports (1, 3, 5); a k above 5 needs a list of k
    (``top_k: k`` in its config), whose labels it sorts."""
    return np.sort(relevance[: max(k, MIRAGE_RETRIEVAL_DEPTH)])[::-1][:k]


def retriever_metrics(
    ranked: Sequence[str],
    positives: Sequence[str] | set[str],
    k: int,
    ndcg: Literal["standard", "mirage"] = "standard",
) -> RetrieverMetrics:
    """Precision@k (hits / k), recall@k (hits / positives in the pool), their F1 and NDCG@k of one
    ranked list with binary relevance (MIRAGE Table 2).

    ``ndcg="standard"`` takes the ideal DCG from the number of positives in the pool.
    ``ndcg="mirage"`` reproduces MIRAGE's code (:func:`mirage_ideal_relevance`): the ideal from
    the labels of the top max(k, 5) retrieved — relevance [0, 1, 0, 0, 1, 1] gives NDCG@3 =
    0.3869 (ideal [1, 1, 0] from the top 5), neither the 0.6309 of sorting the first 3 labels
    nor the 0.2961 of sorting all six.
    ``ranked`` must then hold the top max(k, 5) the retriever returned, as MIRAGE's list does;
    a shorter one gives the ideal of what it holds. The two agree when the top max(k, 5) holds
    every positive; with positives beyond it, "mirage" is higher.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if ndcg not in ("standard", "mirage"):
        raise ValueError(f"ndcg must be 'standard' or 'mirage', got {ndcg!r}")
    positive_set = set(positives)
    if not positive_set:
        raise ValueError("no positives: recall and NDCG are undefined for a question without any")
    relevance = np.array([doc in positive_set for doc in ranked], dtype=np.float64)
    hits = float(relevance[:k].sum())
    precision = hits / k
    recall = hits / len(positive_set)
    f1 = 2 * precision * recall / (precision + recall) if hits else 0.0
    ideal = (
        np.ones(min(k, len(positive_set)))
        if ndcg == "standard"
        else mirage_ideal_relevance(relevance, k)
    )
    ideal_dcg = dcg(ideal)
    ndcg_value = dcg(relevance[:k]) / ideal_dcg if ideal_dcg > 0 else 0.0
    return RetrieverMetrics(precision=precision, recall=recall, f1=f1, ndcg=ndcg_value)


def oracle_passages(qrels: pl.DataFrame, queries: pl.DataFrame) -> pl.DataFrame:
    """MIRAGE's oracle context (§4.1, Oracle Context Setting): one relevant chunk per question,
    for single-hop questions only (§3.1 excludes multi-hop datasets; §6, Single-Hop Task Focus:
    "answers are derived from a single oracle chunk").

    One row per query of ``queries`` (``ORACLE_SCHEMA``): the positive (relevance > 0) with the
    highest grade, ties broken by the smallest doc id — the paper picks "one relevant chunk ...
    from the top-5 chunks mapped to each query" without a rule, so any deterministic one serves;
    ``positives`` counts the query's positives. A query with ``n_hops`` > 1 is excluded as
    ``"multi_hop"``, one without a positive as ``"no_positive"`` (doc id and relevance null).
    Without an ``n_hops`` column (every dataset but the synthetic world) each query counts as
    single-hop, as in MIRAGE's own datasets.
    """
    hops = pl.col("n_hops") if "n_hops" in queries.columns else pl.lit(1)
    positives = qrels.filter(pl.col("relevance") > 0)
    best = (
        positives.sort(["query_id", "relevance", "doc_id"], descending=[False, True, False])
        .group_by("query_id", maintain_order=True)
        .agg(pl.col("doc_id").first(), pl.col("relevance").first(), pl.len().alias("positives"))
    )
    table = queries.select("query_id", hops.alias("_hops")).join(best, on="query_id", how="left")
    excluded = (
        pl.when(pl.col("_hops") > 1)
        .then(pl.lit("multi_hop"))
        .when(pl.col("doc_id").is_null())
        .then(pl.lit("no_positive"))
    )
    return (
        table.with_columns(excluded.alias("excluded"), pl.col("positives").fill_null(0))
        .with_columns(
            pl.when(pl.col("excluded").is_null()).then(pl.col(c)).alias(c)
            for c in ("doc_id", "relevance")
        )
        .select(list(ORACLE_SCHEMA))
        .cast(ORACLE_SCHEMA)  # type: ignore[arg-type]
        .sort("query_id")
    )
