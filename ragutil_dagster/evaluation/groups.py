"""From generation rows to the groups of samples: NLI, clusters and the per-group scores.

A *group* is the N samples of one (query, condition, doc) prompt. MIRAGE, eRAG, gold utility
and the known / unknown split judge one output per prompt: the greedy answer (``decoding`` =
greedy, as the papers decide their labels) or, with ``labels: most_likely``, the most likely of
the N samples — the highest SePer weight, i.e. the highest mean token log-probability.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from ragutil_dagster.metrics import answers as answer_metrics
from ragutil_dagster.metrics.seper import (
    EntailFn,
    SePerInput,
    SePerResult,
    judge_pairs,
    seper_batch,
    seper_standard_error,
)
from ragutil_dagster.tables import (
    DECODING_GREEDY,
    DECODING_SAMPLE,
    GROUP_KEYS,
    GROUP_SCORE_SCHEMA,
    NLI_SCHEMA,
)


def answer_token_logprobs() -> pl.Expr:
    """The token log-probs SePer weighs a sample by: the answer's own tokens, without the token
    that ended it (end-of-sequence, or the one completing a stop string), as the authors' code
    scores them. An answer of that token alone keeps it (nothing else to weigh)."""
    logprobs = pl.col("token_logprobs")
    ended = (pl.col("finish_reason") == "stop") & (logprobs.list.len() > 1)
    return pl.when(ended).then(logprobs.list.slice(0, logprobs.list.len() - 1)).otherwise(logprobs)


def _groups(
    generations: pl.DataFrame, queries: pl.DataFrame
) -> tuple[list[tuple], list[SePerInput]]:
    """The SePer input of every (query, condition, doc) group, samples in index order."""
    golds = dict(queries.select("query_id", "answers").iter_rows())
    questions = dict(queries.select("query_id", "question").iter_rows())
    grouped = (
        generations.filter(pl.col("decoding") == DECODING_SAMPLE)
        .sort([*GROUP_KEYS, "sample_index"], nulls_last=True)
        .with_columns(answer_token_logprobs())
        .group_by(GROUP_KEYS, maintain_order=True)
        .agg("text", "token_logprobs")
    )
    keys, items = [], []
    for qid, condition, doc_id, texts, logprobs in grouped.iter_rows():
        if qid not in golds:
            raise KeyError(f"generations name query {qid!r}, which is not among the queries")
        keys.append((qid, condition, doc_id))
        items.append(SePerInput(texts, logprobs, golds[qid], questions[qid]))
    return keys, items


def judged_answers(generations: pl.DataFrame, condition: str) -> dict[str, str]:
    """Per query, the one answer of ``condition`` the papers judge: its greedy answer when the
    rows hold one, else the most likely sample (highest mean token log-probability — the
    largest SePer weight; the first such sample on ties)."""
    rows = generations.filter(pl.col("condition") == condition)
    greedy = rows.filter(pl.col("decoding") == DECODING_GREEDY)
    if greedy.height:
        return dict(
            greedy.group_by("query_id", maintain_order=True).agg(pl.col("text").first()).iter_rows()
        )
    ranked = rows.with_columns(answer_token_logprobs().list.mean().alias("_mean_logprob")).sort(
        ["query_id", "_mean_logprob", "sample_index"], descending=[False, True, False]
    )
    return dict(
        ranked.group_by("query_id", maintain_order=True).agg(pl.col("text").first()).iter_rows()
    )


def _greedy_answers(generations: pl.DataFrame) -> dict[tuple, str]:
    """The greedy answer of every (query, condition, doc) prompt that has one."""
    greedy = generations.filter(pl.col("decoding") == DECODING_GREEDY)
    return {
        (qid, condition, doc_id): text
        for qid, condition, doc_id, text in greedy.select(*GROUP_KEYS, "text").iter_rows()
    }


def compute_nli(generations: pl.DataFrame, queries: pl.DataFrame, entail: EntailFn) -> pl.DataFrame:
    """Every distinct NLI pair SePer reads for these generations, with its probabilities."""
    _, items = _groups(generations, queries)
    judged = judge_pairs(items, entail)
    if not judged:
        return pl.DataFrame(schema=NLI_SCHEMA)
    pairs = sorted(judged)
    probs = np.stack([judged[pair] for pair in pairs])
    return pl.DataFrame(
        {
            "premise": [p for p, _ in pairs],
            "hypothesis": [h for _, h in pairs],
            "p_contradiction": probs[:, 0],
            "p_neutral": probs[:, 1],
            "p_entailment": probs[:, 2],
        },
        schema=NLI_SCHEMA,
    )


def table_entail(nli: pl.DataFrame) -> EntailFn:
    """An ``entail`` that looks pairs up in a precomputed NLI table (no model call)."""
    table = {
        (p, h): np.array(row)
        for p, h, *row in nli.select(
            "premise", "hypothesis", "p_contradiction", "p_neutral", "p_entailment"
        ).iter_rows()
    }

    def entail(premises: Sequence[str], hypotheses: Sequence[str]) -> np.ndarray:
        try:
            return np.array([table[(p, h)] for p, h in zip(premises, hypotheses)]).reshape(
                len(premises), 3
            )
        except KeyError as err:
            raise KeyError(f"NLI pair missing from the entailment table: {err.args[0]!r}") from None

    return entail


def soft_seper(
    generations: pl.DataFrame, queries: pl.DataFrame, entail: EntailFn
) -> dict[tuple, SePerResult]:
    """SePer_S of every (query_id, condition, doc_id) group of samples."""
    keys, items = _groups(generations, queries)
    return dict(zip(keys, seper_batch(items, entail, kernel="soft")))


def seper_standard_errors(
    generations: pl.DataFrame, queries: pl.DataFrame, entail: EntailFn
) -> dict[tuple, float]:
    """The standard error of SePer_S of every (query_id, condition, doc_id) group of samples
    (:func:`~ragutil_dagster.metrics.seper.seper_standard_error`): adaptive sampling's stop rule
    reads it between rounds."""
    return {
        key: seper_standard_error(result.credits, result.weights)
        for key, result in soft_seper(generations, queries, entail).items()
    }


def cluster_table(
    generations: pl.DataFrame, queries: pl.DataFrame, nli: pl.DataFrame
) -> pl.DataFrame:
    """Semantic cluster and SePer weight of every sample (bidirectional strict entailment)."""
    keys, items = _groups(generations, queries)
    results = seper_batch(items, table_entail(nli))
    rows = [
        (qid, condition, doc_id, index, int(cluster), float(weight))
        for (qid, condition, doc_id), result in zip(keys, results)
        for index, (cluster, weight) in enumerate(zip(result.cluster_ids, result.weights))
    ]
    schema = {
        "query_id": pl.String,
        "condition": pl.String,
        "doc_id": pl.String,
        "sample_index": pl.Int32,
        "cluster_id": pl.Int32,
        "weight": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema, orient="row")


def group_scores(
    generations: pl.DataFrame, queries: pl.DataFrame, nli: pl.DataFrame
) -> pl.DataFrame:
    """Per (query, condition, doc): SePer_S, SePer_H, semantic entropy, mean EM / F1 /
    has_answer over the samples, and the judged answer (greedy, else the most likely sample)
    with its correctness."""
    keys, items = _groups(generations, queries)
    greedy = _greedy_answers(generations)
    entail = table_entail(nli)
    soft = seper_batch(items, entail, kernel="soft")
    hard = seper_batch(items, entail, kernel="hard")
    rows = []
    for (qid, condition, doc_id), item, s, h in zip(keys, items, soft, hard):
        golds = item.gold_answers
        top = greedy.get((qid, condition, doc_id), item.responses[int(np.argmax(s.weights))])
        mean_logprobs = [float(np.mean(lp)) for lp in item.token_logprobs]
        rows.append(
            (
                qid,
                condition,
                doc_id,
                s.score,
                h.score,
                s.semantic_entropy,
                int(s.cluster_ids.max()) + 1,
                float(np.mean([answer_metrics.exact_match(r, golds) for r in item.responses])),
                float(np.mean([answer_metrics.f1(r, golds) for r in item.responses])),
                float(np.mean([answer_metrics.has_answer(r, golds) for r in item.responses])),
                # Token-level baselines of SePer Table 2: perplexity and predictive entropy.
                float(np.mean([np.exp(-m) for m in mean_logprobs])),
                float(-np.mean([np.sum(lp) for lp in item.token_logprobs])),
                top,
                answer_metrics.exact_match(top, golds) == 1.0,
                answer_metrics.has_answer(top, golds),
                answer_metrics.loose_match(top, golds),
            )
        )
    return pl.DataFrame(rows, schema=GROUP_SCORE_SCHEMA, orient="row")
