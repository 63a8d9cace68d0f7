"""Standard IR measures against qrels (through pytrec_eval, the trec_eval reference) and answer recall@k.

Measure names follow pytrec_eval's output keys: ``P_5``, ``recall_10``, ``ndcg_cut_10``,
``map``, ``map_cut_10``, ``recip_rank``, ``success_1``; the dotted request form (``ndcg_cut.10``)
is accepted too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pytrec_eval

from ragutil_dagster.metrics.answers import Golds, has_answer

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]
PerQuery = dict[str, dict[str, float]]

_CUT = re.compile(r"^(?P<base>[A-Za-z_]+?)[._](?P<cut>\d+)$")


def parse_measure(measure: str) -> tuple[str, str]:
    """Map a measure name to (pytrec_eval request, output key): ``ndcg_cut_10`` → (``ndcg_cut.10``, ``ndcg_cut_10``)."""
    match = _CUT.match(measure)
    base, request = (
        (match["base"], f"{match['base']}.{match['cut']}") if match else (measure, measure)
    )
    if base not in pytrec_eval.supported_measures:
        raise ValueError(
            f"unknown IR measure {measure!r}: pytrec_eval supports "
            f"{', '.join(sorted(pytrec_eval.supported_measures))} (with an optional cut, e.g. ndcg_cut_10)"
        )
    key = request.replace(".", "_")
    return request, key


def ranks_to_run(ranked: Mapping[str, Sequence[str]]) -> dict[str, dict[str, float]]:
    """Turn ranked doc-id lists into a pytrec_eval run whose scores reproduce the given order."""
    run: dict[str, dict[str, float]] = {}
    for qid, docs in ranked.items():
        if len(set(docs)) != len(docs):
            raise ValueError(f"query {qid!r}: the ranked list repeats a doc id")
        run[qid] = {doc: float(len(docs) - position) for position, doc in enumerate(docs)}
    return run


def ir_measures(
    run: Run, qrels: Qrels, measures: Iterable[str]
) -> tuple[PerQuery, dict[str, float]]:
    """trec_eval measures per query and their mean over all queries in ``qrels``.

    A query judged in ``qrels`` but absent from ``run`` scores 0 on every measure (trec_eval's
    ``-c`` convention), so a retriever cannot gain by returning nothing. Queries with no relevant
    document count as 0 too. Queries only in ``run`` are ignored.
    """
    names = [parse_measure(m) for m in measures]
    if not names:
        raise ValueError("no IR measure requested")
    if not qrels:
        raise ValueError("qrels are empty: nothing to evaluate against")
    clean_qrels = {q: {d: int(rel) for d, rel in docs.items()} for q, docs in qrels.items()}
    clean_run = {q: {d: float(s) for d, s in docs.items()} for q, docs in run.items() if q in qrels}
    evaluator = pytrec_eval.RelevanceEvaluator(clean_qrels, {request for request, _ in names})
    evaluated = evaluator.evaluate(clean_run)
    per_query = {
        qid: {key: float(evaluated.get(qid, {}).get(key, 0.0)) for _, key in names}
        for qid in clean_qrels
    }
    mean = {key: float(np.mean([scores[key] for scores in per_query.values()])) for _, key in names}
    return per_query, mean


def dcg(gains: Sequence[float] | np.ndarray) -> float:
    """Discounted cumulative gain with linear gains (Järvelin & Kekäläinen 2000, as trec_eval):
    Σ_i g_i / log2(i + 1) over ranks i = 1..n."""
    g = np.asarray(gains, dtype=np.float64)
    return float(np.sum(g / np.log2(np.arange(2, g.size + 2))))


def graded_ndcg(gains: Sequence[float], k: int) -> float:
    """NDCG@k of real-valued gains judged on the ranked list only (the list's gains in rank order):
    the DCG of the first k over that of the list's gains sorted best first, cut at k — the ideal
    a retrieved-only judgment gives, as for eRAG's labels (eRAG §2, G_q over R_k). Gains must be
    non-negative; a list without any positive gain scores 0 (trec_eval's convention for a query
    without relevant documents)."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    g = np.asarray(gains, dtype=np.float64)
    if g.ndim != 1 or not np.all(np.isfinite(g)) or np.any(g < 0):
        raise ValueError("gains must be one finite, non-negative value per ranked item")
    ideal = dcg(np.sort(g)[::-1][:k])
    return dcg(g[:k]) / ideal if ideal > 0 else 0.0


def answer_hits_at_k(
    ranked_texts: Sequence[Sequence[str]], golds: Sequence[Golds], k: int
) -> np.ndarray:
    """Per query: does a top-k passage contain a gold answer (DPR ``has_answer``)? Boolean array."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if len(ranked_texts) != len(golds):
        raise ValueError(
            f"{len(ranked_texts)} ranked lists but {len(golds)} gold answer sets: they must pair up"
        )
    return np.array(
        [
            any(has_answer(text, gold) for text in texts[:k])
            for texts, gold in zip(ranked_texts, golds)
        ],
        dtype=bool,
    )


def answer_recall_at_k(
    ranked_texts: Sequence[Sequence[str]], golds: Sequence[Golds], k: int
) -> float:
    """Answer recall@k (top-k accuracy) as DPR and FlashRAG report it: the share of queries
    with a gold answer in one of their top-k passages."""
    hits = answer_hits_at_k(ranked_texts, golds, k)
    if hits.size == 0:
        raise ValueError("no queries given")
    return float(hits.mean())
