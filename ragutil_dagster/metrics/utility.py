"""LLM-specific utility — Zhang et al., 2025: which passages help *this* LLM (§3.2.1, §3.4).

A passage is gold-utilitarian for an LLM on a query when the LLM answers correctly with it and
not without it: u_i = 1[has_answer(L(q, d_i)) > has_answer(L(q, ∅))] (eq. 1), G_q = {d_i | u_i = 1}
(eq. 2). A query is *known* when the LLM answers it correctly without passages (§3.4); its gold
set is then empty, and the right judgment selects nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import regex

from ragutil_dagster.errors import UnparseableOutputError
from ragutil_dagster.metrics.ranking import ir_measures, ranks_to_run


def gold_utility(has_answer_without: bool, has_answer_with_each: Mapping[str, bool]) -> set[str]:
    """G_q (eqs. 1–2): the passages with which the LLM answers correctly when it does not
    without any passage. Empty for a known query."""
    return {doc for doc, hit in has_answer_with_each.items() if bool(hit) > bool(has_answer_without)}


def is_known(has_answer_without: bool) -> bool:
    """A known query is answered correctly without any passage (§3.4)."""
    return bool(has_answer_without)


@dataclass(frozen=True)
class SetMetrics:
    """Set-based utility-judgment evaluation (§3.4).

    ``precision``, ``recall`` average over queries with a non-empty gold set; ``f1`` is computed
    from those averages, as the authors' code does; ``mean_f1`` is the per-query F1 averaged;
    ``accuracy_empty`` is the share of empty-gold queries for which nothing was selected.
    """

    precision: float
    recall: float
    f1: float
    mean_f1: float
    accuracy_empty: float
    n_nonempty: int
    n_empty: int


def _harmonic(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p + r > 0 else 0.0


def set_metrics(
    selected: Mapping[str, Collection[str]], gold: Mapping[str, Collection[str]]
) -> SetMetrics:
    """Precision / recall / F1 of the selected passages on queries with non-empty gold utility,
    and accuracy (selected nothing) on queries with empty gold utility. A query missing from
    ``selected`` selected nothing."""
    if not gold:
        raise ValueError("no queries in gold")
    precisions, recalls, f1s, empty_hits = [], [], [], []
    for qid, gold_docs in gold.items():
        gold_set, chosen = set(gold_docs), set(selected.get(qid, ()))
        if not gold_set:
            empty_hits.append(not chosen)
            continue
        overlap = len(gold_set & chosen)
        p = overlap / len(chosen) if chosen else 0.0
        r = overlap / len(gold_set)
        precisions.append(p)
        recalls.append(r)
        f1s.append(_harmonic(p, r))
    nan = float("nan")
    precision = float(np.mean(precisions)) if precisions else nan
    recall = float(np.mean(recalls)) if recalls else nan
    return SetMetrics(
        precision=precision,
        recall=recall,
        f1=_harmonic(precision, recall) if precisions else nan,
        mean_f1=float(np.mean(f1s)) if f1s else nan,
        accuracy_empty=float(np.mean(empty_hits)) if empty_hits else nan,
        n_nonempty=len(precisions),
        n_empty=len(empty_hits),
    )


@dataclass(frozen=True)
class RankMetrics:
    ndcg: float
    recall: float
    k: int
    n_queries: int
    per_query: dict[str, dict[str, float]]


def rank_metrics(
    ranked: Mapping[str, Sequence[str]], gold: Mapping[str, Collection[str]], k: int = 5
) -> RankMetrics:
    """NDCG@k and Recall@k of utility rankings against the gold utilitarian passages (§3.4),
    over queries with a non-empty gold set (empty-gold queries are skipped)."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    qrels = {qid: {doc: 1 for doc in docs} for qid, docs in gold.items() if docs}
    if not qrels:
        raise ValueError("every query has an empty gold set: ranking metrics are undefined")
    run = ranks_to_run({qid: docs for qid, docs in ranked.items() if qid in qrels})
    per_query, mean = ir_measures(run, qrels, [f"ndcg_cut_{k}", f"recall_{k}"])
    return RankMetrics(
        ndcg=mean[f"ndcg_cut_{k}"],
        recall=mean[f"recall_{k}"],
        k=k,
        n_queries=len(qrels),
        per_query=per_query,
    )


_SELECTION_PREFIX = regex.compile(r"my\s*selection\s*[:：]?", regex.IGNORECASE)
_SELECTION_BODY = regex.compile(r"\[?\s*(?:\[\s*\d+\s*\]\s*(?:,\s*)?)*\]?\s*\.?")
_PASSAGE_NUMBER = regex.compile(r"\[\s*(\d+)\s*\]")
_RANKING_BODY = regex.compile(r"\[\s*\d+\s*\](?:\s*>\s*\[\s*\d+\s*\])*\s*\.?")


def _check_range(numbers: list[int], n_passages: int | None, text: str) -> None:
    if n_passages is not None:
        bad = [n for n in numbers if not 1 <= n <= n_passages]
        if bad:
            raise UnparseableOutputError(
                f"passage numbers {bad} are outside 1..{n_passages} in {text!r}"
            )


def parse_selection(text: str, n_passages: int | None = None) -> list[int]:
    """Parse a pointwise/listwise selection (paper Fig. 5): ``My selection:[[1],[3]]`` → [1, 3].

    Spacing, a missing outer bracket and a final period are tolerated; ``My selection:[]`` is
    an empty selection. Anything else raises :class:`UnparseableOutputError`.
    """
    match = _SELECTION_PREFIX.search(text)
    if match is None:
        raise UnparseableOutputError(f"no 'My selection:' in {text!r}")
    body = text[match.end() :].strip()
    if not _SELECTION_BODY.fullmatch(body):
        raise UnparseableOutputError(f"selection is not a list like [[1],[3]]: {body!r}")
    numbers = list(dict.fromkeys(int(n) for n in _PASSAGE_NUMBER.findall(body)))
    _check_range(numbers, n_passages, text)
    return numbers


def parse_ranking(text: str, n_passages: int | None = None) -> list[int]:
    """Parse a listwise ranking (paper Fig. 7): ``[2] > [1] > [3]`` → [2, 1, 3].

    Spacing and a final period are tolerated; a repeated passage keeps its first position.
    Anything else raises :class:`UnparseableOutputError`.
    """
    body = text.strip()
    if not _RANKING_BODY.fullmatch(body):
        raise UnparseableOutputError(f"ranking is not of the form [2] > [1] > [3]: {body!r}")
    numbers = list(dict.fromkeys(int(n) for n in _PASSAGE_NUMBER.findall(body)))
    _check_range(numbers, n_passages, text)
    return numbers
