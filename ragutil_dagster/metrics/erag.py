"""eRAG — Salemi & Zamani, SIGIR 2024: evaluate a retrieval list by the generator's own use of it.

Each retrieved document d gets a label G_q[d] = E_M(M(q, {d}), y) (eq. 1): the downstream metric
of the generator's output when d is its only context. The labels then play the role of qrels for
standard ranking measures. As in the authors' code: with all-binary labels the measures are
pytrec_eval's; with any non-binary label only precision (mean label of the top k) and success
(max label of the top k) are defined.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ragutil_dagster.metrics.answers import exact_match, f1, has_answer
from ragutil_dagster.metrics.ranking import ir_measures, parse_measure, ranks_to_run

DownstreamMetric = Literal["exact_match", "has_answer", "token_f1"]
DOWNSTREAM_METRICS: dict[str, Callable[[str, object], float | bool]] = {
    "exact_match": exact_match,  # KILT's metric for QA, as eRAG Table 1 uses on NQ / TriviaQA / HotpotQA
    "has_answer": has_answer,  # DPR / KILT answer containment (binary)
    "token_f1": f1,  # SQuAD token F1: graded labels in [0, 1]
}
"""The downstream metrics E_M an eRAG label can use (eq. 1), by name; every name of
``DownstreamMetric``."""
BINARY_DOWNSTREAM_METRICS = frozenset({"exact_match", "has_answer"})


@dataclass(frozen=True)
class ERAGMeasure:
    """One eRAG aggregate of the labels: its pytrec_eval name (``P``, ``ndcg_cut``), its short
    label, whether it is taken at the cut-off k (``P_5``) and whether graded labels define it."""

    name: str
    label: str
    at_k: bool
    graded: bool

    def at(self, k: int) -> str:
        """Its pytrec_eval name at cut-off ``k``: ``P_5``; ``map`` has none."""
        return f"{self.name}_{k}" if self.at_k else self.name


ERAG_MEASURES = (
    ERAGMeasure("P", "P@k", at_k=True, graded=True),
    ERAGMeasure("success", "Hit@k", at_k=True, graded=True),
    ERAGMeasure("map", "MAP", at_k=False, graded=False),
    ERAGMeasure("recip_rank", "MRR", at_k=False, graded=False),
    ERAGMeasure("ndcg_cut", "NDCG@k", at_k=True, graded=False),
)
"""Every eRAG aggregate ragutil reports, in reporting order: P, success (Hit), MAP, MRR and NDCG
for binary labels; P (mean label of the top k) and success (max label) only for graded ones
(eRAG §3, footnotes of Table 1; the authors' code refuses the others). The catalogue's ``erag_``
entries are made from it."""


def erag_measures(downstream_metric: DownstreamMetric) -> tuple[ERAGMeasure, ...]:
    """The eRAG aggregates defined for labels of ``downstream_metric``: chosen by the metric, not
    by the values, so a graded metric whose labels happen to be 0 / 1 reports the same measures."""
    binary = downstream_metric in BINARY_DOWNSTREAM_METRICS
    return tuple(m for m in ERAG_MEASURES if binary or m.graded)


def erag_measure_names(downstream_metric: DownstreamMetric, k: int) -> list[str]:
    """The pytrec_eval names of :func:`erag_measures` at cut-off k (``P_5``, ``map``)."""
    return [m.at(k) for m in erag_measures(downstream_metric)]


@dataclass(frozen=True)
class ERAGScores:
    """eRAG aggregates: ``mean[measure]`` over queries and ``per_query[qid][measure]``."""

    mean: dict[str, float]
    per_query: dict[str, dict[str, float]]
    binary: bool


def erag_labels(
    outputs: Mapping[str, Mapping[str, str]],
    golds: Mapping[str, object],
    downstream_metric: Callable[[str, object], float | bool],
) -> dict[str, dict[str, float]]:
    """G_q[d] = E_M(M(q, {d}), y) — eq. 1.

    ``outputs[qid][doc_id]`` is the generator's output with that document alone as context,
    ``golds[qid]`` the expected output(s), ``downstream_metric(output, gold)`` a score in [0, 1]
    (e.g. :func:`ragutil_dagster.metrics.answers.exact_match`).
    """
    labels: dict[str, dict[str, float]] = {}
    for qid, per_doc in outputs.items():
        if qid not in golds:
            raise KeyError(f"query {qid!r} has outputs but no gold answer")
        labels[qid] = {}
        for doc_id, output in per_doc.items():
            value = float(downstream_metric(output, golds[qid]))
            if not 0.0 <= value <= 1.0:
                raise ValueError(
                    f"query {qid!r}, document {doc_id!r}: downstream metric returned {value}, "
                    "outside [0, 1]"
                )
            labels[qid][doc_id] = value
    return labels


def _is_binary(labels: Mapping[str, Mapping[str, float]]) -> bool:
    return all(value in (0, 1) for per_doc in labels.values() for value in per_doc.values())


def _non_binary_measure(measure: str, ranked: Sequence[str], labels: Mapping[str, float]) -> float:
    _, key = parse_measure(measure)
    base, _, cut = key.rpartition("_") if key[-1].isdigit() else (key, "", "")
    if base not in {m.name for m in ERAG_MEASURES if m.graded}:
        raise ValueError(
            f"measure {measure!r} needs binary labels; with non-binary labels eRAG defines only "
            "P_k (mean label of the top k) and success_k (max label of the top k)"
        )
    k = int(cut) if cut else len(ranked)
    top = [labels.get(doc, 0.0) for doc in ranked[:k]]
    if base == "P":
        return float(sum(top) / k) if k else 0.0
    return float(max(top, default=0.0))


def erag_scores(
    retrieved: Mapping[str, Sequence[str]],
    labels: Mapping[str, Mapping[str, float]],
    metrics: Iterable[str],
) -> ERAGScores:
    """Aggregate eRAG labels into ranking measures (pytrec_eval names: ``P_5``, ``recall_5``,
    ``map``, ``recip_rank``, ``ndcg_cut_5``, ``success_1``).

    ``retrieved[qid]`` is the ranked doc-id list, ``labels[qid][doc]`` the eRAG label of each
    retrieved doc (missing docs count 0). The mean is over every query in ``retrieved``; queries
    whose labels are all zero count 0.
    """
    metrics = list(metrics)
    if not metrics:
        raise ValueError("no eRAG measure requested")
    missing = [qid for qid in retrieved if qid not in labels]
    if missing:
        raise KeyError(
            f"no eRAG labels for queries {missing[:5]}{' …' if len(missing) > 5 else ''}"
        )
    query_labels = {qid: dict(labels[qid]) for qid in retrieved}
    binary = _is_binary(query_labels)
    if binary:
        qrels = {
            qid: {doc: int(v) for doc, v in per_doc.items()}
            for qid, per_doc in query_labels.items()
        }
        per_query, mean = ir_measures(ranks_to_run(retrieved), qrels, metrics)
        return ERAGScores(mean=mean, per_query=per_query, binary=True)
    per_query = {
        qid: {
            parse_measure(m)[1]: _non_binary_measure(m, retrieved[qid], query_labels[qid])
            for m in metrics
        }
        for qid in retrieved
    }
    keys = [parse_measure(m)[1] for m in metrics]
    mean = {key: float(np.mean([scores[key] for scores in per_query.values()])) for key in keys}
    return ERAGScores(mean=mean, per_query=per_query, binary=False)
