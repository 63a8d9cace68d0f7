"""Teacher-forced signals of the generator about its own answer: ConSens and the likelihood- and
attention-based passage utility of the LLM-specific-utility paper (§3.3.2, eqs. 6–7).

ConSens scores the pseudo-answer of the ``rag`` condition — its greedy answer (or, with
``labels: most_likely``, its most likely sample) — and, with ``consens.leave_one_out``, the
same answer with each passage of its context left out (Experiment 3, §3.3). Passage utility
scores the pseudo-answer the caller gives (``evaluation.verbalized``: the greedy answer over the
utility candidates, as §3.4 generates it from the top 20). Selection for the set metrics is
ragutil's own rule, which the paper does not define: a passage is selected by likelihood when
P(a | q, d) > P(a | q).
Attention only ranks passages (§3.3.2): no selection rule is applied to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import polars as pl

from ragutil_dagster.evaluation.conditions import (
    CONSENS_CONDITIONS,
    CONSENS_LEAVE_OUT,
    CONSENS_PASSAGE,
)
from ragutil_dagster.evaluation.groups import judged_answers
from ragutil_dagster.metrics.consens import consens, content_token_mask, leave_one_out_attribution
from ragutil_dagster.models.token_scoring import ScoredContinuation, TokenScorer
from ragutil_dagster.tables import (
    ALONE_SIGNAL_SCHEMA,
    CONSENS_LEAVE_ONE_OUT_SCHEMA,
    CONSENS_SCHEMA,
    SIGNAL_SCHEMA,
)


def passage_spans(prompt: str, passages: list[str]) -> list[tuple[int, int]]:
    """Character spans of each passage text inside the prompt, searched left to right."""
    spans, cursor = [], 0
    for position, text in enumerate(passages):
        start = prompt.find(text, cursor)
        if start < 0:
            raise ValueError(
                f"passage #{position} does not appear in the prompt after position {cursor}"
            )
        spans.append((start, start + len(text)))
        cursor = start + len(text)
    return spans


def _pseudo_answers(generations: pl.DataFrame) -> dict[str, str]:
    return {qid: text for qid, text in judged_answers(generations, "rag").items() if text.strip()}


def _prompts(prompts: pl.DataFrame, condition: str, qids: list[str]) -> pl.DataFrame:
    return prompts.filter((pl.col("condition") == condition) & pl.col("query_id").is_in(qids))


@dataclass(frozen=True)
class ConsensScores:
    """ConSens of each query's pseudo-answer (``per_query``: ``CONSENS_SCHEMA``) and, where its
    context was scored with each passage left out, per passage (``leave_one_out``:
    ``CONSENS_LEAVE_ONE_OUT_SCHEMA``, empty otherwise)."""

    per_query: pl.DataFrame
    leave_one_out: pl.DataFrame


def consens_scores(
    prompts: pl.DataFrame, generations: pl.DataFrame, queries: pl.DataFrame, scorer: TokenScorer
) -> ConsensScores:
    """ConSens of each query's pseudo-answer: the same answer tokens teacher-forced after the
    evaluator prompt with the context empty and with the rag passages (the ``consens_*``
    conditions of ``prompts``; without them, after the closed-book and the rag prompt), content
    words only. Where ``prompts`` hold ``consens_leave_out`` prompts (Experiment 3, §3.3), also
    ConSens with each passage left out and the passage's attribution
    (:func:`~ragutil_dagster.metrics.consens.leave_one_out_attribution`), under the same empty
    context and content words."""
    answers = _pseudo_answers(generations)
    questions = dict(queries.select("query_id", "question").iter_rows())
    evaluator = prompts.filter(pl.col("condition") == CONSENS_CONDITIONS[0]).height > 0
    empty_condition, context_condition = CONSENS_CONDITIONS if evaluator else ("closed_book", "rag")
    by_condition = {
        condition: dict(
            _prompts(prompts, condition, list(answers)).select("query_id", "prompt").iter_rows()
        )
        for condition in (empty_condition, context_condition)
    }
    qids = [q for q in answers if all(q in table for table in by_condition.values())]
    leave_out = _prompts(prompts, CONSENS_LEAVE_OUT, qids)
    batch = [(by_condition[c][q], q) for c in by_condition for q in qids]
    batch += list(zip(leave_out["prompt"], leave_out["query_id"]))
    # Each distinct (prompt, answer) is scored once, so equal prompts score equally: the context of
    # a query the retriever returned nothing for is the empty one, and its ConSens exactly 0 (r = 0).
    pairs = [(prompt, answers[q]) for prompt, q in batch]
    distinct = list(dict.fromkeys(pairs))
    by_pair = dict(zip(distinct, scorer.score([p for p, _ in distinct], [a for _, a in distinct])))
    scored = [by_pair[pair] for pair in pairs]
    empties, contexts = scored[: len(qids)], scored[len(qids) : 2 * len(qids)]
    rows, full, masks = [], {}, {}
    for qid, empty, with_ctx in zip(qids, empties, contexts):
        masks[qid] = content_token_mask(empty.tokens, questions[qid], empty.word_ids)
        value = (
            consens(empty.token_logprobs, with_ctx.token_logprobs, masks[qid])
            if masks[qid].any()
            else None
        )
        rows.append({"query_id": qid, "consens": value})
        full[qid] = (empty, value)
    without: dict[str, list[tuple[str, float]]] = {}
    for (qid, doc), left_out in zip(
        leave_out.select("query_id", "doc_id").iter_rows(), scored[2 * len(qids) :]
    ):
        empty, value = full[qid]
        if value is not None:
            value = consens(empty.token_logprobs, left_out.token_logprobs, masks[qid])
            without.setdefault(qid, []).append((doc, value))
    attributed = [
        {"query_id": qid, "doc_id": doc, "consens_without": value, "attribution": float(a)}
        for qid, pairs in without.items()
        for (doc, value), a in zip(
            pairs, leave_one_out_attribution(full[qid][1], [v for _, v in pairs])
        )
    ]
    return ConsensScores(
        pl.DataFrame(rows, schema=CONSENS_SCHEMA),
        pl.DataFrame(attributed, schema=CONSENS_LEAVE_ONE_OUT_SCHEMA),
    )


def passage_utility(
    prompts: pl.DataFrame,
    answers: Mapping[str, str],
    corpus: pl.DataFrame,
    scorer: TokenScorer,
    alone: str,
    together: str,
) -> pl.DataFrame:
    """Likelihood-based (eq. 7: log P(a | q, d), each passage alone under the ``alone`` prompts of
    ``prompts``) and attention-based (eq. 6, normalised over the passages of the query's
    ``together`` prompt) utility of every passage, for the pseudo-answers ``answers``;
    ``likelihood_selected`` when log P(a | q, d) exceeds log P(a | q) under the ``closed_book``
    prompt. Queries whose pseudo-answer is blank get no signals (nothing to score)."""
    answers = {qid: text for qid, text in answers.items() if text.strip()}
    closed = _prompts(prompts, "closed_book", list(answers))
    closed_logprob = {
        qid: s.logprob
        for qid, s in zip(
            closed["query_id"],
            scorer.score(closed["prompt"].to_list(), [answers[q] for q in closed["query_id"]]),
        )
    }
    qids = [q for q in answers if q in closed_logprob]
    texts = dict(corpus.select("id", "text").iter_rows())
    each = _prompts(prompts, alone, qids)
    likelihood = scorer.score(each["prompt"].to_list(), [answers[q] for q in each["query_id"]])
    likelihoods: dict[str, dict[str, float]] = {}
    for (qid, doc), scored in zip(each.select("query_id", "doc_id").iter_rows(), likelihood):
        likelihoods.setdefault(qid, {})[doc] = scored.logprob
    context = {
        qid: (prompt, docs, cut)
        for qid, prompt, docs, cut in _prompts(prompts, together, qids)
        .select("query_id", "prompt", "doc_ids", "last_passage_chars")
        .iter_rows()
    }
    qids = [q for q in qids if q in context]

    def passages_in_prompt(qid: str) -> list[str]:
        _, docs, cut = context[qid]
        shown = [texts[d] for d in docs]
        if cut is not None:  # the prompt was fitted to the generator by cutting the last passage
            shown[-1] = shown[-1][:cut]
        return shown

    # A backend without attention weights (vLLM, servers) leaves the attention columns null;
    # the summary then reports no attention metric rather than a made-up one.
    attention_raw = (
        scorer.passage_attention(
            [context[q][0] for q in qids],
            [answers[q] for q in qids],
            [passage_spans(context[q][0], passages_in_prompt(q)) for q in qids],
        )
        if scorer.supports_attention
        else [None] * len(qids)
    )
    rows = []
    for qid, masses in zip(qids, attention_raw):
        docs = context[qid][1]
        shares = dict.fromkeys(docs)
        if masses is not None:
            total = float(np.sum(masses))
            shares = dict(
                zip(docs, masses / total if total > 0 else np.full(len(docs), 1 / len(docs)))
            )
        for doc, lp in likelihoods.get(qid, {}).items():
            share = shares.get(doc)
            rows.append(
                {
                    "query_id": qid,
                    "doc_id": doc,
                    "likelihood": lp,
                    "likelihood_selected": lp > closed_logprob[qid],
                    "attention": None if share is None else float(share),
                }
            )
    return pl.DataFrame(rows, schema=SIGNAL_SCHEMA)


def _consens_of(
    empty: ScoredContinuation, with_context: ScoredContinuation, question: str
) -> float | None:
    """ConSens (§2) of one answer scored with the context left empty and with the context, over
    its content words absent from the question; None when it has none."""
    keep = content_token_mask(empty.tokens, question, empty.word_ids)
    return consens(empty.token_logprobs, with_context.token_logprobs, keep) if keep.any() else None


def alone_signals(
    prompts: pl.DataFrame,
    answers: Mapping[str, str],
    queries: pl.DataFrame,
    scorer: TokenScorer,
    condition: str,
) -> pl.DataFrame:
    """Teacher-forced signals of every passage shown alone under ``condition`` (its prompts in
    ``prompts``) for the pseudo-answers ``answers`` (``ALONE_SIGNAL_SCHEMA``): likelihood utility
    (eq. 7: log P(a | q, d)) and the passage's own ConSens — a with the context left empty
    against a with the passage as the context, under ConSens's evaluator template (the
    ``consens_empty`` and ``consens_passage`` prompts of ``prompts``; without them, under the
    ``closed_book`` prompt and the passage's own prompt). Queries whose pseudo-answer is blank
    get no signals."""
    answers = {qid: text for qid, text in answers.items() if text.strip()}
    questions = dict(queries.select("query_id", "question").iter_rows())
    evaluator = (prompts["condition"] == CONSENS_PASSAGE).any()
    empty = dict(
        _prompts(prompts, CONSENS_CONDITIONS[0] if evaluator else "closed_book", list(answers))
        .select("query_id", "prompt")
        .iter_rows()
    )
    alone = _prompts(prompts, condition, list(empty))
    keys = list(alone.select("query_id", "doc_id").iter_rows())
    qids = list(dict.fromkeys(qid for qid, _ in keys))
    batch = [(prompt, answers[qid]) for (qid, _), prompt in zip(keys, alone["prompt"])]
    batch += [(empty[qid], answers[qid]) for qid in qids]
    if evaluator:
        with_passage = {
            (qid, doc): prompt
            for qid, doc, prompt in _prompts(prompts, CONSENS_PASSAGE, qids)
            .select("query_id", "doc_id", "prompt")
            .iter_rows()
        }
        batch += [(with_passage[key], answers[key[0]]) for key in keys]
    scored = scorer.score([prompt for prompt, _ in batch], [answer for _, answer in batch])
    likelihood, empties = (
        scored[: len(keys)],
        dict(zip(qids, scored[len(keys) : len(keys) + len(qids)])),
    )
    contexts = scored[len(keys) + len(qids) :] if evaluator else likelihood
    rows = [
        {
            "query_id": qid,
            "doc_id": doc,
            "likelihood": alone_scored.logprob,
            "consens": _consens_of(empties[qid], context, questions[qid]),
        }
        for (qid, doc), alone_scored, context in zip(keys, likelihood, contexts)
    ]
    return pl.DataFrame(rows, schema=ALONE_SIGNAL_SCHEMA)
