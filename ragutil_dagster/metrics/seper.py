"""SePer (semantic perplexity) and ΔSePer — Dai et al., ICLR 2025, §3.3–3.4 and Algorithm 1.

SePer_M(q, a*) ≈ Σ_C k(C, a*) p(C | q) (eq. 9) is the model's belief in the gold answer, estimated
from N sampled responses; ΔSePer = SePer with retrieved context − SePer without (eq. 11) is the
utility of the context for that model.

Where the paper's prose and the authors' code (github sepermetric/seper) differ, this module
follows the code:

* response weights: the mean (``length_norm="mean"``) or sum of a response's token log-probs,
  softmaxed over the N responses; identical responses count separately; weights sum to 1;
* NLI inputs: with a question, every text t becomes ``f"{q} {t}"`` with q the question ending in
  "?"; a pair's label is the argmax over [contradiction, neutral, entailment];
* clustering: the greedy loop of the semantic-entropy code (each response not yet assigned opens
  a cluster and is compared with every later response, re-assigning those it matches); strict =
  entailment both ways, loose = no contradiction either way and not neutral both ways;
* hard kernel: a cluster matches a gold answer when its first member and that answer are
  equivalent by the loose rule; soft kernel: k_i = max(P_ent(r_i ⇒ a), P_ent(a ⇒ r_i)).

Several gold answers (aliases) combine by ``gold_reduce`` (:func:`combine_gold_answers`), by
default as the authors' code intends for each kernel: the hard kernel counts a cluster once when
it matches *any* gold answer (``"any"``), the soft kernel scores each answer and keeps the best
one (``"max"``). ``"any"`` for the soft kernel credits each response by its best answer;
``"mean"`` averages the per-answer scores (the paper's eq. 10 read literally). Deliberate
deviation: the reference code reshapes its (answer, response) scores in the wrong order, which
mis-pairs responses and answers whenever there are several gold answers; here every pair is the
one it names.

Every distinct (premise, hypothesis) pair goes to ``entail`` once — also across many questions
with :func:`seper_batch` — and only the pairs the computation reads: each response both ways
against each gold answer (the kernels), and the pairs the greedy clustering visits, judged in
rounds (one ``entail`` call per round for all questions) because which response opens the next
cluster depends on the labels already seen; the reverse direction of a pair is judged only when
the forward label leaves equivalence possible (strict: entailment; loose: not contradiction).
With N diverse answers that is about half of the N(N−1) ordered pairs the authors' code judges.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeAlias

import numpy as np
from scipy.special import softmax

from ragutil_dagster.metrics.answers import gold_aliases

if TYPE_CHECKING:
    import polars as pl

EntailFn = Callable[[Sequence[str], Sequence[str]], np.ndarray]
"""NLI model: ``entail(premises, hypotheses)`` → (n, 3) probabilities [contradiction, neutral, entailment]."""

Kernel = Literal["soft", "hard"]
GoldReduce = Literal["any", "max", "mean"]
AUTHORS_GOLD_REDUCE: dict[str, GoldReduce] = {"hard": "any", "soft": "max"}
"""How the authors' code combines several gold answers, per kernel (the default ``gold_reduce``)."""
LengthNorm = Literal["mean", "sum"]

CONTRADICTION, NEUTRAL, ENTAILMENT = 0, 1, 2


@dataclass(frozen=True)
class SePerInput:
    """One question's sampled responses under one condition (with or without context)."""

    responses: Sequence[str]
    token_logprobs: Sequence[Sequence[float]]
    gold_answers: Sequence[str]
    question: str | None = None


@dataclass(frozen=True)
class SePerResult:
    """SePer of one question under one condition.

    ``score``: SePer after ``gold_reduce`` over gold answers; ``per_gold``: the score for each
    gold answer; ``weights``: the N response weights (sum to 1); ``cluster_ids``: semantic
    cluster of each response (0, 1, … in order of first appearance); ``semantic_entropy``:
    −Σ_C p(C) log p(C) with p(C) the summed weight of cluster C; ``credits``: each response's
    kernel value after ``gold_reduce`` (soft: its own k_i, hard: its cluster's 0 / 1), so that
    ``score == weights @ credits`` (what :func:`seper_standard_error` reads).
    """

    score: float
    per_gold: np.ndarray
    weights: np.ndarray
    cluster_ids: np.ndarray
    semantic_entropy: float
    credits: np.ndarray


Scores: TypeAlias = "SePerResult | float | np.ndarray | pl.Expr"
"""What :func:`delta_seper` subtracts: a result, a score, or a column of scores."""


def response_weights(
    token_logprobs: Sequence[Sequence[float]], length_norm: LengthNorm = "mean"
) -> np.ndarray:
    """ℓ_i of Algorithm 1 as the reference code computes them: softmax over responses of each
    response's mean (or summed) token log-probability."""
    if length_norm not in ("mean", "sum"):
        raise ValueError(f"length_norm must be 'mean' or 'sum', got {length_norm!r}")
    reduce = np.mean if length_norm == "mean" else np.sum
    scores = np.empty(len(token_logprobs))
    for position, logprobs in enumerate(token_logprobs):
        values = np.asarray(logprobs, dtype=np.float64)
        if values.size == 0:
            raise ValueError(f"response #{position} has no token log-probs (empty generation)")
        if not np.all(np.isfinite(values)) or np.any(values > 1e-6):
            raise ValueError(
                f"response #{position} has token log-probs that are NaN, infinite or positive"
            )
        scores[position] = reduce(values)
    return softmax(scores)


def semantic_entropy(cluster_ids: np.ndarray, weights: np.ndarray) -> float:
    """Semantic entropy −Σ_C p(C) log p(C), p(C) = Σ_{i ∈ C} w_i (Farquhar et al.; SePer §3.3)."""
    mass = np.bincount(cluster_ids, weights=weights)
    mass = mass[mass > 0]
    return float(-(mass * np.log(mass)).sum())


def nli_text(text: str, question: str | None) -> str:
    """The text an NLI model sees for ``text`` answering ``question``: ``"{q}? {text}"``."""
    if question is None:
        return text
    q = question if question.endswith("?") else f"{question}?"
    return f"{q} {text}"


def equivalent(label_ab: int, label_ba: int, strict: bool) -> bool:
    """Whether two texts are one meaning by their NLI labels both ways (strict or loose rule)."""
    if strict:
        return label_ab == ENTAILMENT and label_ba == ENTAILMENT
    return CONTRADICTION not in (label_ab, label_ba) and (label_ab, label_ba) != (NEUTRAL, NEUTRAL)


def _rules_out(forward: int, strict: bool) -> bool:
    """Whether the forward label alone makes two texts not equivalent under the rule."""
    return forward != ENTAILMENT if strict else forward == CONTRADICTION


Label = Callable[[str, str], "int | None"]
"""NLI label of (premise, hypothesis), or None while the pair has not been judged."""


def _greedy_clusters(
    texts: Sequence[str], label: Label, strict: bool, unjudged: set | None = None
) -> np.ndarray | None:
    """The semantic-entropy code's greedy clustering (``get_semantic_ids``): each response not yet
    assigned opens a cluster and takes every later response equivalent to it.

    With ``unjudged``, ``label`` may answer None: the walk stops at the first opener whose
    comparisons need unjudged pairs, adds those pairs to ``unjudged`` and returns None."""
    ids = [-1] * len(texts)
    next_id = 0
    for i, first in enumerate(texts):
        if ids[i] != -1:
            continue
        ids[i] = next_id
        needed: set[tuple[str, str]] = set()
        members = []
        for j in range(i + 1, len(texts)):
            forward = label(first, texts[j])
            if forward is None:
                needed.add((first, texts[j]))
                continue
            if _rules_out(forward, strict):
                continue
            backward = label(texts[j], first)
            if backward is None:
                needed.add((texts[j], first))
            elif equivalent(forward, backward, strict):
                members.append(j)
        if needed:
            if unjudged is None:
                raise KeyError(f"NLI pairs not judged: {sorted(needed)[:3]}")
            unjudged |= needed
            return None
        for j in members:
            ids[j] = next_id
        next_id += 1
    return np.asarray(ids, dtype=np.int64)


@dataclass(frozen=True)
class _Prepared:
    texts: list[str]  # NLI form of each response
    golds: list[str]  # NLI form of each gold answer
    weights: np.ndarray


def _prepare(item: SePerInput, position: int, length_norm: LengthNorm) -> _Prepared:
    where = f"question #{position}" + (f" ({item.question!r})" if item.question else "")
    if isinstance(item.responses, str):
        raise TypeError(f"{where}: responses must be a list of strings, not one string")
    if len(item.responses) == 0:
        raise ValueError(f"{where}: no responses")
    if len(item.responses) != len(item.token_logprobs):
        raise ValueError(
            f"{where}: {len(item.responses)} responses but {len(item.token_logprobs)} token log-prob lists"
        )
    try:
        golds = gold_aliases(item.gold_answers)
        weights = response_weights(item.token_logprobs, length_norm)
    except ValueError as err:
        raise type(err)(f"{where}: {err}") from err
    return _Prepared(
        texts=[nli_text(r, item.question) for r in item.responses],
        golds=[nli_text(g, item.question) for g in golds],
        weights=weights,
    )


def _unjudged_pairs(
    prepared: _Prepared, labels: dict[tuple[str, str], int], strict: bool
) -> set[tuple[str, str]]:
    """The pairs ``prepared`` needs next that ``labels`` lacks: every response both ways against
    every gold answer, and the clustering's pairs as far as the judged labels lead."""
    needed = {
        pair
        for gold in prepared.golds
        for text in prepared.texts
        for pair in ((text, gold), (gold, text))
        if pair not in labels
    }
    _greedy_clusters(prepared.texts, lambda *pair: labels.get(pair), strict, needed)
    return needed


def judge_pairs(
    items: Sequence[SePerInput],
    entail: EntailFn,
    *,
    strict: bool = True,
    length_norm: LengthNorm = "mean",
) -> dict[tuple[str, str], np.ndarray]:
    """Every (premise, hypothesis) pair :func:`seper_batch` reads for ``items``, judged by
    ``entail`` in rounds (one call per round for all items) → [contradiction, neutral, entailment]
    probabilities per pair — for computing NLI ahead of scoring (and caching it)."""
    prepared = [_prepare(item, position, length_norm) for position, item in enumerate(items)]
    return _judge(prepared, entail, strict)


def _judge(
    prepared: Sequence[_Prepared], entail: EntailFn, strict: bool
) -> dict[tuple[str, str], np.ndarray]:
    table: dict[tuple[str, str], np.ndarray] = {}
    labels: dict[tuple[str, str], int] = {}  # each pair's argmax, taken once per round
    waiting = list(prepared)
    while True:
        needs = [(p, _unjudged_pairs(p, labels, strict)) for p in waiting]
        # An item with nothing to judge stays complete: later rounds only add pairs.
        waiting = [p for p, needed in needs if needed]
        pending = set().union(*(needed for _, needed in needs))
        if not pending:
            return table
        ordered = sorted(pending)
        probs = _entail_pairs(entail, ordered)
        table.update(zip(ordered, probs))
        labels.update(zip(ordered, np.argmax(probs, axis=1).tolist()))


def combine_gold_answers(
    match: np.ndarray, mass: np.ndarray, gold_reduce: GoldReduce
) -> tuple[float, np.ndarray]:
    """SePer of one question (eqs. 9–10, Σ_u k(u, a*) p(u)) from ``match[u, g]`` — how far unit u
    matches gold answer g: the soft kernel's k_i for each response, the hard kernel's 0 / 1 for
    each cluster — and each unit's probability mass p(u).

    Returns the score and the per-answer scores Σ_u p(u) match[u, g]. ``gold_reduce``:
    ``"any"`` counts each unit once, by its best answer, Σ_u p(u) max_g match[u, g] (for the
    hard kernel: the mass of the clusters matching any gold answer); ``"max"`` keeps the best
    per-answer score; ``"mean"`` averages them. With one gold answer the three agree.
    """
    per_gold = mass @ match
    if gold_reduce == "any":
        return float(mass @ match.max(axis=1)), per_gold
    return float(per_gold.max() if gold_reduce == "max" else per_gold.mean()), per_gold


def unit_credits(match: np.ndarray, per_gold: np.ndarray, gold_reduce: GoldReduce) -> np.ndarray:
    """Each unit's credit c(u) under ``gold_reduce``, so that the score of
    :func:`combine_gold_answers` is Σ_u p(u) c(u): its best match (``"any"``), its match with the
    best-scoring answer (``"max"``), or its mean match (``"mean"``)."""
    if gold_reduce == "any":
        return match.max(axis=1)
    return match[:, int(np.argmax(per_gold))] if gold_reduce == "max" else match.mean(axis=1)


# A Jeffreys prior Beta(½, ½) on SePer read as a proportion: its posterior standard deviation
# floors the standard error, so a few agreeing samples do not claim certainty (SE 0).
JEFFREYS_PRIOR = 0.5


def seper_standard_error(credits: Sequence[float], weights: Sequence[float]) -> float:
    """Standard error of SePer = Σ_i w_i c_i over its N samples (``credits`` c_i in [0, 1] from
    :attr:`SePerResult.credits`, ``weights`` w_i summing to 1).

    SePer is a self-normalised weighted mean of the samples' credits; its delta-method variance
    is N / (N − 1) · Σ_i w_i² (c_i − SePer)². That is 0 whenever the samples agree, so the SE is
    floored by the posterior standard deviation of a proportion under a Jeffreys prior, with
    SePer · n_eff successes in n_eff = 1 / Σ w_i² effective samples (Kish): 4 equally weighted
    agreeing samples give SE 0.122, 10 give 0.060. One sample has no spread to estimate: SE 0.5
    (the prior's)."""
    c, w = np.asarray(credits, dtype=np.float64), np.asarray(weights, dtype=np.float64)
    if c.shape != w.shape or c.size == 0:
        raise ValueError(
            f"{c.size} credits for {w.size} weights; need one per sample, at least one"
        )
    if not np.isclose(w.sum(), 1.0) or np.any(w < 0):
        raise ValueError(f"weights must be non-negative and sum to 1 (sum {w.sum():.6g})")
    n = c.size
    if n == 1:
        return JEFFREYS_PRIOR
    score = float(w @ c)
    delta = float(np.sqrt(n / (n - 1) * np.sum(w**2 * (c - score) ** 2)))
    return max(delta, _jeffreys_floor(score, 1.0 / float(np.sum(w**2))))


def _jeffreys_floor(score: float, n_eff: float) -> float:
    """The posterior standard deviation of a proportion ``score`` over ``n_eff`` samples under
    the Jeffreys prior: the floor of :func:`seper_standard_error`."""
    a = score * n_eff + JEFFREYS_PRIOR
    b = (1.0 - score) * n_eff + JEFFREYS_PRIOR
    return float(np.sqrt(a * b / ((a + b) ** 2 * (a + b + 1))))


def least_standard_error(n: int) -> float:
    """The smallest :func:`seper_standard_error` ``n`` samples can have: ``n`` equally weighted
    samples that agree (SePer 0 or 1), where the Jeffreys floor is lowest — 0.060 for 10, 0.0101
    for 68. A stop target below it cannot be met with ``n`` samples."""
    if n < 1:
        raise ValueError(f"n = {n}: a standard error needs at least one sample")
    return JEFFREYS_PRIOR if n == 1 else _jeffreys_floor(1.0, n)


def _score(
    prepared: _Prepared,
    probs: Callable[[str, str], np.ndarray],
    kernel: Kernel,
    gold_reduce: GoldReduce,
    strict: bool,
) -> SePerResult:
    def label(premise: str, hypothesis: str) -> int:
        return int(np.argmax(probs(premise, hypothesis)))

    cluster_ids = _greedy_clusters(prepared.texts, label, strict)
    assert cluster_ids is not None  # every label is known: no walk stops early
    weights = prepared.weights
    if kernel == "soft":
        match = np.array(
            [
                [
                    max(probs(t, gold)[ENTAILMENT], probs(gold, t)[ENTAILMENT])
                    for gold in prepared.golds
                ]
                for t in prepared.texts
            ]
        )
        mass = weights
    else:
        firsts = [
            prepared.texts[int(np.flatnonzero(cluster_ids == c)[0])]
            for c in range(int(cluster_ids.max()) + 1)
        ]
        match = np.array(
            [
                [
                    equivalent(label(first, gold), label(gold, first), False)
                    for gold in prepared.golds
                ]
                for first in firsts
            ],
            dtype=np.float64,
        )
        mass = np.bincount(cluster_ids, weights=weights)
    score, per_gold = combine_gold_answers(match, mass, gold_reduce)
    credits = unit_credits(match, per_gold, gold_reduce)
    return SePerResult(
        score=score,
        per_gold=per_gold,
        weights=weights,
        cluster_ids=cluster_ids,
        semantic_entropy=semantic_entropy(cluster_ids, weights),
        credits=credits if kernel == "soft" else credits[cluster_ids],
    )


def _gold_reduce(kernel: str, gold_reduce: str | None) -> GoldReduce:
    """The checked options: ``gold_reduce`` or, when None, the authors' rule for ``kernel``."""
    if kernel not in ("soft", "hard"):
        raise ValueError(f"kernel must be 'soft' or 'hard', got {kernel!r}")
    if gold_reduce is None:
        return AUTHORS_GOLD_REDUCE[kernel]
    if gold_reduce not in ("any", "max", "mean"):
        raise ValueError(f"gold_reduce must be 'any', 'max' or 'mean', got {gold_reduce!r}")
    return gold_reduce  # type: ignore[return-value]


def _entail_pairs(entail: EntailFn, pairs: list[tuple[str, str]]) -> np.ndarray:
    premises = [p for p, _ in pairs]
    hypotheses = [h for _, h in pairs]
    result = np.asarray(entail(premises, hypotheses), dtype=np.float64)
    if result.shape != (len(pairs), 3):
        raise ValueError(
            f"entail returned shape {result.shape} for {len(pairs)} pairs; expected ({len(pairs)}, 3) "
            "probabilities [contradiction, neutral, entailment]"
        )
    if not np.all(np.isfinite(result)) or np.any(result < 0) or np.any(result > 1):
        raise ValueError("entail returned values outside [0, 1] or NaN; expected probabilities")
    return result


def seper_batch(
    items: Sequence[SePerInput],
    entail: EntailFn,
    *,
    kernel: Kernel = "soft",
    gold_reduce: GoldReduce | None = None,
    strict: bool = True,
    length_norm: LengthNorm = "mean",
) -> list[SePerResult]:
    """SePer for many questions (or conditions) with a single ``entail`` call.

    Each distinct (premise, hypothesis) pair over all items is sent once, in rounds of one
    ``entail`` call each (:func:`judge_pairs`). Use this for a whole evaluation: pairs repeat
    heavily across samples, conditions and questions. ``gold_reduce`` None (the default) takes
    the authors' rule for the kernel (``AUTHORS_GOLD_REDUCE``: hard ``"any"``, soft ``"max"``).
    """
    gold_reduce = _gold_reduce(kernel, gold_reduce)
    prepared = [_prepare(item, position, length_norm) for position, item in enumerate(items)]
    table = _judge(prepared, entail, strict)

    def probs(premise: str, hypothesis: str) -> np.ndarray:
        return table[(premise, hypothesis)]

    return [_score(p, probs, kernel, gold_reduce, strict) for p in prepared]


def seper(
    responses: Sequence[str],
    token_logprobs: Sequence[Sequence[float]],
    gold_answers: Sequence[str] | str,
    entail: EntailFn,
    question: str | None = None,
    kernel: Kernel = "soft",
    gold_reduce: GoldReduce | None = None,
    strict: bool = True,
    length_norm: LengthNorm = "mean",
) -> SePerResult:
    """SePer_S (``kernel="soft"``) or SePer_H (``kernel="hard"``) of one question — eqs. 9–10.

    ``responses`` are N sampled answers, ``token_logprobs`` their per-token log-probabilities
    under the model, ``gold_answers`` one or several gold aliases, ``entail`` the NLI model.
    """
    golds = (gold_answers,) if isinstance(gold_answers, str) else tuple(gold_answers)
    item = SePerInput(responses, token_logprobs, golds, question)
    return seper_batch(
        [item],
        entail,
        kernel=kernel,
        gold_reduce=gold_reduce,
        strict=strict,
        length_norm=length_norm,
    )[0]


def delta_seper(with_context: Scores, without_context: Scores) -> float | np.ndarray | pl.Expr:
    """ΔSePer = SePer(a* | q, D) − SePer(a* | q) — eq. 11, the retrieval utility of D.

    Takes two results or two scores, or two columns of scores (numpy arrays, polars
    expressions: one score per question or per document), subtracted elementwise."""

    def score(value: Scores) -> float | np.ndarray | pl.Expr:
        return value.score if isinstance(value, SePerResult) else value

    return score(with_context) - score(without_context)


CONTEXT_TOKENS_UNIT = 100
"""ΔSePer is reported per this many context tokens (:func:`delta_seper_per_context_tokens`)."""


def delta_seper_per_context_tokens(
    delta: Sequence[float], context_tokens: Sequence[float]
) -> float:
    """ΔSePer per 100 context tokens: 100 · mean ΔSePer / mean context tokens over the same
    questions — the utility the context adds per unit of its cost, by which SePer §5.4 (RQ3,
    Fig. 5b) weighs prompt compressors (ΔSePer kept against the prompt length saved). A ratio
    of means, so a question with a near-empty context does not dominate; NaN when no question is
    given or the contexts have no token."""
    delta, tokens = np.asarray(delta, dtype=float), np.asarray(context_tokens, dtype=float)
    if delta.shape != tokens.shape:
        raise ValueError(f"{delta.size} ΔSePer values for {tokens.size} context token counts")
    if not delta.size or tokens.sum() <= 0:
        return float("nan")
    return float(CONTEXT_TOKENS_UNIT * delta.mean() / tokens.mean())
