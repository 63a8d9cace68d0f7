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
        noise_vulnerability=share((0, 1, 0), (1, 1, 0)),
        context_acceptability=share((0, 1, 1), (1, 1, 1)),
        context_insensitivity=share((0, 0, 0), (0, 0, 1)),
        context_misinterpretation=share((1, 0, 0), (1, 0, 1)),
        groups=groups,
        n=n,
    )


@dataclass(frozen=True)
class RetrieverMetrics:
    precision: float
    recall: float
    f1: float
    ndcg: float


def _dcg(relevance: np.ndarray) -> float:
    return float(np.sum(relevance / np.log2(np.arange(2, relevance.size + 2))))


def retriever_metrics(
    ranked: Sequence[str],
    positives: Sequence[str] | set[str],
    k: int,
    ndcg: Literal["standard", "mirage"] = "standard",
) -> RetrieverMetrics:
    """Precision@k (hits / k), recall@k (hits / positives in the pool), their F1 and NDCG@k of one
    ranked list with binary relevance (MIRAGE Table 2).

    ``ndcg="standard"`` takes the ideal DCG from the number of positives in the pool.
    ``ndcg="mirage"`` reproduces MIRAGE's code, which sorts the relevance labels of the whole
    retrieved list (every retrieved item, not only the first k) and cuts that at k: relevance
    [0, 1, 0, 0, 1] gives NDCG@3 = 0.3869, not the 0.6309 of sorting only the first k labels.
    The two agree when the list holds every positive; with positives missing from the list,
    "mirage" is higher.
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
    if ndcg == "standard":
        ideal = np.ones(min(k, len(positive_set)))
    else:
        ideal = np.sort(relevance)[::-1][:k]
    ideal_dcg = _dcg(ideal)
    ndcg_value = _dcg(relevance[:k]) / ideal_dcg if ideal_dcg > 0 else 0.0
    return RetrieverMetrics(precision=precision, recall=recall, f1=f1, ndcg=ndcg_value)
