"""LLM-specific utility — Zhang et al., 2025: which passages help *this* LLM (§3.2.1, §3.3, §3.4).

A passage is gold-utilitarian for an LLM on a query when the LLM answers correctly with it and
not without it: u_i = 1[has_answer(L(q, d_i)) > has_answer(L(q, ∅))] (eq. 1), G_q = {d_i | u_i = 1}
(eq. 2). A query is *known* when the LLM answers it correctly without passages (§3.4); its gold
set is then empty, and the right judgment selects nothing.

The verbalized judgment methods (§3.3.1–3.3.2, prompts in App. A, Figs. 5–6): pointwise and
listwise selection and listwise ranking, each directly or with the pseudo-answer (``_answer``).
Their outputs are parsed here; a judgment not in the requested format raises
:class:`UnparseableOutputError`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import regex

from ragutil_dagster.errors import UnparseableOutputError
from ragutil_dagster.metrics.ranking import ir_measures, ranks_to_run

SELECTION_METHODS = ("pointwise", "pointwise_answer", "listwise", "listwise_answer")
"""Verbalized selection (§3.3.1, eqs. 3–4): each passage judged alone, or the candidates listed
together; ``_answer``: with the pseudo-answer in the prompt."""
RANKING_METHODS = ("ranking", "ranking_answer")
"""Verbalized listwise ranking (§3.3.2, eq. 5), directly or with the pseudo-answer."""
VERBALIZED_METHODS = (*SELECTION_METHODS, *RANKING_METHODS)

RANK_CUTOFF = 5
"""The cut-off of the ranking metrics, NDCG@5 and Recall@5 (§3.4, Table 4)."""


def gold_utility(has_answer_without: bool, has_answer_with_each: Mapping[str, bool]) -> set[str]:
    """G_q (eqs. 1–2): the passages with which the LLM answers correctly when it does not
    without any passage. Empty for a known query."""
    return {
        doc for doc, hit in has_answer_with_each.items() if bool(hit) > bool(has_answer_without)
    }


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
class GoldOverlap:
    """How far two LLMs' gold-utility sets agree over the queries both judged (§5, Figure 3: the
    passages two sets share; Jaccard and the one-sided share are ragutil's summaries of it).

    ``jaccard`` averages |G_a ∩ G_b| / |G_a ∪ G_b| over the ``n_queries`` where either set is
    non-empty; ``mean_shared`` averages |G_a ∩ G_b| over the same queries; ``useful_only_to_a``
    is the share of LLM a's gold passages (pooled over queries, ``n_passages_a`` of them) that
    are not gold for b — a passage useful to a and useless to b."""

    jaccard: float
    mean_shared: float
    useful_only_to_a: float
    n_queries: int
    n_passages_a: int


def gold_overlap(
    gold_a: Mapping[str, Collection[str]], gold_b: Mapping[str, Collection[str]]
) -> GoldOverlap:
    """:class:`GoldOverlap` of LLM a's gold sets against LLM b's, over the queries in both."""
    jaccards, shared = [], []
    only_a = passages_a = 0
    for qid in gold_a.keys() & gold_b.keys():
        a, b = set(gold_a[qid]), set(gold_b[qid])
        passages_a += len(a)
        only_a += len(a - b)
        if a | b:
            jaccards.append(len(a & b) / len(a | b))
            shared.append(len(a & b))
    nan = float("nan")
    return GoldOverlap(
        jaccard=float(np.mean(jaccards)) if jaccards else nan,
        mean_shared=float(np.mean(shared)) if shared else nan,
        useful_only_to_a=only_a / passages_a if passages_a else nan,
        n_queries=len(jaccards),
        n_passages_a=passages_a,
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


# Quotes, backticks and Markdown emphasis a chat model may wrap its answer in.
_DECORATION = regex.compile(r"[\"'`*_“”‘’]+")
_PASSAGE_NUMBER = regex.compile(r"\[\s*(\d+)\s*\]")
_POINTWISE = regex.compile(r"utility\s*judge?ment\s*[:：]?\s*(yes|no)\b(?!\s*/)", regex.IGNORECASE)
_BARE_VERDICT = regex.compile(r"\W*(yes|no)\b(?!\s*/)", regex.IGNORECASE)
_SELECTION_PREFIX = regex.compile(r"my\s*selection\s*(?:is)?\s*[:：]?", regex.IGNORECASE)
_SELECTION_LIST = regex.compile(
    r"\[\s*\[?\s*\]?\s*\]"  # [] or [[]]: nothing selected
    r"|\[?\s*\[\s*\d+\s*\](?:\s*,?\s*\[\s*\d+\s*\])*\s*\]?"  # [[1],[3]] or [1],[3]
    r"|\[\s*\d+(?:\s*,\s*\d+)*\s*\]"  # [1, 3]
)
_RANKING_PREFIX = regex.compile(r"(?:my\s*)?ranking\s*(?:is)?\s*[:：]", regex.IGNORECASE)
_RANKING_CHAIN = regex.compile(r"\[\s*\d+\s*\](?:\s*>\s*\[\s*\d+\s*\])*")


def _undecorated(text: str) -> str:
    return _DECORATION.sub("", text).strip()


def _check_range(numbers: list[int], n_passages: int | None, text: str) -> None:
    if n_passages is not None:
        bad = [n for n in numbers if not 1 <= n <= n_passages]
        if bad:
            raise UnparseableOutputError(
                f"passage numbers {bad} are outside 1..{n_passages} in {text!r}"
            )


def _numbers(listed: str, rest: str, n_passages: int | None, text: str) -> list[int]:
    """The passage numbers of ``listed``, first occurrence kept; ``rest`` (what follows the list)
    may hold any text but another passage number, which would make the judgment ambiguous."""
    if _PASSAGE_NUMBER.search(rest):
        raise UnparseableOutputError(f"passage numbers after the judgment's list in {text!r}")
    numbers = list(dict.fromkeys(int(n) for n in regex.findall(r"\d+", listed)))
    _check_range(numbers, n_passages, text)
    return numbers


def parse_pointwise(text: str) -> bool:
    """Parse a pointwise judgment (Fig. 5, ``Utility judgment: Yes/No.``): True for yes.

    Case, spacing, quotes and Markdown emphasis are tolerated, as is a bare ``Yes`` / ``No``
    opening the answer; the template's own ``Yes/No`` echoed back, or no verdict at all, raises
    :class:`UnparseableOutputError`.
    """
    plain = _undecorated(text)
    found = _POINTWISE.search(plain) or _BARE_VERDICT.match(plain)
    if found is None:
        raise UnparseableOutputError(f"no 'Utility judgment: Yes' or 'No' in {text!r}")
    return found[1].lower() == "yes"


def parse_selection(text: str, n_passages: int | None = None) -> list[int]:
    """Parse a listwise selection (Fig. 5, ``My selection:[[1],[3]]``) → [1, 3].

    The list is read right after ``My selection:``, or at the start of the answer when the
    prefix is missing; ``[[1],[3]]``, ``[1],[3]`` and ``[1, 3]`` are accepted, with any spacing,
    quotes or Markdown emphasis, and ``[]`` is an empty selection. Text after the list is
    ignored unless it names another passage. A repeated passage counts once. Anything else —
    no list, or a number outside 1..``n_passages`` — raises :class:`UnparseableOutputError`.
    """
    plain = _undecorated(text)
    prefix = _SELECTION_PREFIX.search(plain)
    body = plain[prefix.end() :].lstrip() if prefix else plain
    listed = _SELECTION_LIST.match(body)
    if listed is None:
        raise UnparseableOutputError(f"no selection list like [[1],[3]] in {text!r}")
    return _numbers(listed[0], body[listed.end() :], n_passages, text)


def parse_ranking(text: str, n_passages: int | None = None) -> list[int]:
    """Parse a listwise ranking (Fig. 6, ``[2] > [1] > [3]``) → [2, 1, 3].

    The chain is read at the start of the answer (after an optional ``Ranking:``), with any
    spacing, quotes or Markdown emphasis; text after it is ignored unless it names another
    passage. A repeated passage keeps its first position; a partial ranking is returned as
    given (:func:`complete_ranking` appends the rest). Anything else raises
    :class:`UnparseableOutputError`.
    """
    plain = _undecorated(text)
    prefix = _RANKING_PREFIX.match(plain)
    body = plain[prefix.end() :].lstrip() if prefix else plain
    chain = _RANKING_CHAIN.match(body)
    if chain is None:
        raise UnparseableOutputError(f"ranking is not of the form [2] > [1] > [3]: {text!r}")
    return _numbers(chain[0], body[chain.end() :], n_passages, text)


def complete_ranking(order: Sequence[int], n_passages: int) -> list[int]:
    """A full ranking of passages 1..``n_passages``: ``order`` first, then every passage it
    leaves out in its original (retrieval) order — as RankGPT-style rerankers read a partial
    answer."""
    listed = list(dict.fromkeys(order))
    return listed + [n for n in range(1, n_passages + 1) if n not in set(listed)]
