"""From generation rows to every paper's metric: NLI, clusters, per-group, per-document, per-query
scores and the headline summary of one setting × generator.

A *group* is the N samples of one (query, condition, doc) prompt. MIRAGE, eRAG, gold utility
and the known / unknown split judge one output per prompt: the greedy answer (``decoding`` =
greedy, as the papers decide their labels) or, with ``labels: most_likely``, the most likely of
the N samples — the highest SePer weight, i.e. the highest mean token log-probability.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from ragutil_dagster.evaluation.conditions import (
    UTILITY_PER_CANDIDATE,
    UTILITY_PSEUDO_ANSWER,
    utility_rag_condition,
)
from ragutil_dagster.metrics import answers as answer_metrics
from ragutil_dagster.metrics import catalog
from ragutil_dagster.metrics import consens as consens_metrics
from ragutil_dagster.metrics.erag import (
    BINARY_DOWNSTREAM_METRICS,
    DOWNSTREAM_METRICS,
    DownstreamMetric,
    erag_labels,
    erag_measure_names,
    erag_scores,
)
from ragutil_dagster.metrics.mirage import adaptability
from ragutil_dagster.metrics.seper import (
    EntailFn,
    SePerInput,
    SePerResult,
    delta_seper,
    delta_seper_per_context_tokens,
    judge_pairs,
    seper_batch,
    seper_standard_error,
)
from ragutil_dagster.metrics.stats import pearson
from ragutil_dagster.metrics.utility import RANK_CUTOFF, SELECTION_METHODS, rank_metrics, set_metrics
from ragutil_dagster.tables import (
    CANDIDATE_SCHEMA,
    DECODING_GREEDY,
    DECODING_SAMPLE,
    GROUP_KEYS,
    GROUP_SCORE_SCHEMA,
    NLI_SCHEMA,
    QA_QUERY_OPTIONAL_SCHEMA,
    QUERY_CONDITION_COLUMNS,
    QUERY_CONDITIONS,
    SIGNAL_SCHEMA,
)


def answer_token_logprobs() -> pl.Expr:
    """The token log-probs SePer weighs a sample by: the answer's own tokens, without the token
    that ended it (end-of-sequence, or the one completing a stop string), as the authors' code
    scores them. An answer of that token alone keeps it (nothing else to weigh)."""
    logprobs = pl.col("token_logprobs")
    ended = (pl.col("finish_reason") == "stop") & (logprobs.list.len() > 1)
    return pl.when(ended).then(logprobs.list.slice(0, logprobs.list.len() - 1)).otherwise(logprobs)


def _groups(generations: pl.DataFrame, queries: pl.DataFrame) -> tuple[list[tuple], list[SePerInput]]:
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
        return dict(greedy.group_by("query_id", maintain_order=True).agg(pl.col("text").first()).iter_rows())
    ranked = rows.with_columns(answer_token_logprobs().list.mean().alias("_mean_logprob")).sort(
        ["query_id", "_mean_logprob", "sample_index"], descending=[False, True, False]
    )
    return dict(ranked.group_by("query_id", maintain_order=True).agg(pl.col("text").first()).iter_rows())


def _greedy_answers(generations: pl.DataFrame) -> dict[tuple, str]:
    """The greedy answer of every (query, condition, doc) prompt that has one."""
    greedy = generations.filter(pl.col("decoding") == DECODING_GREEDY)
    return {(qid, condition, doc_id): text for qid, condition, doc_id, text in greedy.select(*GROUP_KEYS, "text").iter_rows()}


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
        for p, h, *row in nli.select("premise", "hypothesis", "p_contradiction", "p_neutral", "p_entailment").iter_rows()
    }

    def entail(premises: Sequence[str], hypotheses: Sequence[str]) -> np.ndarray:
        try:
            return np.array([table[(p, h)] for p, h in zip(premises, hypotheses)]).reshape(len(premises), 3)
        except KeyError as err:
            raise KeyError(f"NLI pair missing from the entailment table: {err.args[0]!r}") from None

    return entail


def soft_seper(generations: pl.DataFrame, queries: pl.DataFrame, entail: EntailFn) -> dict[tuple, SePerResult]:
    """SePer_S of every (query_id, condition, doc_id) group of samples."""
    keys, items = _groups(generations, queries)
    return dict(zip(keys, seper_batch(items, entail, kernel="soft")))


def seper_standard_errors(generations: pl.DataFrame, queries: pl.DataFrame, entail: EntailFn) -> dict[tuple, float]:
    """The standard error of SePer_S of every (query_id, condition, doc_id) group of samples
    (:func:`~ragutil_dagster.metrics.seper.seper_standard_error`): adaptive sampling's stop rule
    reads it between rounds."""
    return {
        key: seper_standard_error(result.credits, result.weights)
        for key, result in soft_seper(generations, queries, entail).items()
    }


def cluster_table(generations: pl.DataFrame, queries: pl.DataFrame, nli: pl.DataFrame) -> pl.DataFrame:
    """Semantic cluster and SePer weight of every sample (bidirectional strict entailment)."""
    keys, items = _groups(generations, queries)
    results = seper_batch(items, table_entail(nli))
    rows = [
        (qid, condition, doc_id, index, int(cluster), float(weight))
        for (qid, condition, doc_id), result in zip(keys, results)
        for index, (cluster, weight) in enumerate(zip(result.cluster_ids, result.weights))
    ]
    schema = {"query_id": pl.String, "condition": pl.String, "doc_id": pl.String,
              "sample_index": pl.Int32, "cluster_id": pl.Int32, "weight": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def group_scores(generations: pl.DataFrame, queries: pl.DataFrame, nli: pl.DataFrame) -> pl.DataFrame:
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
                qid, condition, doc_id, s.score, h.score, s.semantic_entropy,
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


def _condition(groups: pl.DataFrame, condition: str) -> pl.DataFrame:
    """The query table's columns of ``condition`` (``QUERY_CONDITIONS``), from its groups."""
    suffix = QUERY_CONDITIONS[condition]
    return (
        groups.filter(pl.col("condition") == condition)
        .select("query_id", *QUERY_CONDITION_COLUMNS)
        .rename({c: f"{c}_{suffix}" for c in QUERY_CONDITION_COLUMNS})
    )


# The documents table's eRAG label column of each downstream metric (eRAG eq. 1): EM, the
# paper's metric for QA, in ``erag_label``; each other metric in ``erag_label_<metric>``.
ERAG_LABEL_COLUMNS: dict[str, str] = {
    metric: "erag_label" if metric == "exact_match" else f"erag_label_{metric}" for metric in DOWNSTREAM_METRICS
}


def erag_label_table(groups: pl.DataFrame, queries: pl.DataFrame, condition: str = "per_doc") -> pl.DataFrame:
    """eRAG's label of every document judged alone (eq. 1, through
    :func:`~ragutil_dagster.metrics.erag.erag_labels`): the judged answer of its ``condition``
    group scored against the query's gold answers by each downstream metric, one column per
    metric (``ERAG_LABEL_COLUMNS``; Int32 for binary metrics, Float64 for token F1)."""
    per_doc = groups.filter(pl.col("condition") == condition).select("query_id", "doc_id", "answer")
    outputs: dict[str, dict[str, str]] = {}
    for qid, doc_id, answer in per_doc.iter_rows():
        outputs.setdefault(qid, {})[doc_id] = answer
    golds = dict(queries.select("query_id", "answers").iter_rows())
    keys = per_doc.select("query_id", "doc_id")
    columns = []
    for metric, column in ERAG_LABEL_COLUMNS.items():
        labels = erag_labels(outputs, golds, DOWNSTREAM_METRICS[metric])
        dtype = pl.Int32 if metric in BINARY_DOWNSTREAM_METRICS else pl.Float64
        columns.append(pl.Series(column, [labels[qid][doc_id] for qid, doc_id in keys.iter_rows()]).cast(dtype))
    return keys.with_columns(columns)


def document_scores(
    groups: pl.DataFrame,
    queries: pl.DataFrame,
    run: pl.DataFrame,
    utility_signals: pl.DataFrame | None = None,
    ground_truth: pl.DataFrame | None = None,
    leave_one_out: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """The :func:`passage_scores` of every retrieved document of ``run`` (the setting's top k;
    each document's ``per_doc`` group), with its rank and — when ``leave_one_out``
    (``CONSENS_LEAVE_ONE_OUT_SCHEMA``) is given — ConSens of the pseudo-answer with the document
    left out of the context (``consens_without``) and its attribution (``consens_attribution``,
    ConSens §3.3; null where it was not scored)."""
    retrieved = run.select("query_id", "doc_id", "rank")
    table = passage_scores(groups, queries, retrieved, "per_doc", utility_signals, ground_truth)
    if leave_one_out is not None:
        table = table.join(
            leave_one_out.rename({"attribution": "consens_attribution"}), on=["query_id", "doc_id"], how="left"
        )
    return table.sort("query_id", "rank")


def leave_one_out_hits(documents: pl.DataFrame, qrels: pl.DataFrame) -> pl.DataFrame:
    """ConSens Experiment 3 (§3.3) per retrieval hit: the queries whose documents scored with
    the leave-one-out contexts (``consens_without`` of :func:`document_scores`) hold a relevant
    one (qrels relevance > 0) and another — the paper keeps the retrieval hits only. Per query,
    in rank order: ``consens_without``, ``consens_attribution`` and ``relevant`` as lists, and
    ``consens_loo_lowest`` (:func:`~ragutil_dagster.metrics.consens.removal_lowest`)."""
    positives = qrels.filter(pl.col("relevance") > 0).select("query_id", "doc_id", pl.lit(True).alias("relevant"))
    scored = (
        documents.filter(pl.col("consens_without").is_not_null())
        .join(positives, on=["query_id", "doc_id"], how="left")
        .with_columns(pl.col("relevant").fill_null(False))
        .sort("query_id", "rank")
        .group_by("query_id", maintain_order=True)
        .agg("consens_without", "consens_attribution", "relevant")
        .filter(pl.col("relevant").list.any() & ~pl.col("relevant").list.all())
    )
    lowest = [consens_metrics.removal_lowest(v, r) for v, r in scored.select("consens_without", "relevant").iter_rows()]
    return scored.with_columns(pl.Series("consens_loo_lowest", lowest, dtype=pl.Float64))


def _leave_one_out_summary(hits: pl.DataFrame) -> _Summary:
    """ConSens Experiment 3's ROC AUC over the retrieval hits (``leave_one_out_auc``: contexts
    keeping the relevant document against those leaving it out, as Fig. 3 pairs them) and the
    per-document attribution AUC (``attribution_auc``), each with its n of queries."""
    out = _Summary()
    if hits.height:
        relevant = hits["relevant"].to_list()
        without, attributions = hits["consens_without"].to_list(), hits["consens_attribution"].to_list()
        out.add("consens_loo_auc", consens_metrics.leave_one_out_auc(without, relevant), hits.height)
        out.add("consens_loo_attribution_auc", consens_metrics.attribution_auc(attributions, relevant), hits.height)
    return out


def passage_scores(
    groups: pl.DataFrame,
    queries: pl.DataFrame,
    passages: pl.DataFrame,
    condition: str,
    utility_signals: pl.DataFrame | None = None,
    ground_truth: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Per passage of ``passages`` (``query_id``, ``doc_id`` and any columns to keep) shown alone
    under ``condition`` (``per_doc``: a retrieved document; ``validity``: a validity passage):
    ΔSePer_S/H (SePer eq. 11 with the passage as the context), its eRAG labels (eRAG eq. 1,
    :func:`erag_label_table`: EM, KILT's metric for QA, in ``erag_label``; has_answer and token
    F1 beside it), gold utility
    (LLM-specific utility eq. 1), and — when given — likelihood / attention utility signals
    and ground-truth utility. ``queries`` gives the gold answers (``query_id``, ``answers``)."""
    closed = _condition(groups, "closed_book").select(
        "query_id", "seper_s_closed", "seper_h_closed", "answer_has_closed"
    )
    alone = groups.filter(pl.col("condition") == condition).select(
        "query_id", "doc_id", "seper_s", "seper_h", "answer_has"
    )
    table = (
        passages.join(alone, on=["query_id", "doc_id"], how="left")
        .join(erag_label_table(groups, queries, condition), on=["query_id", "doc_id"], how="left")
        .join(closed, on="query_id", how="left")
        .with_columns(
            delta_seper(pl.col("seper_s"), pl.col("seper_s_closed")).alias("delta_seper_s"),
            delta_seper(pl.col("seper_h"), pl.col("seper_h_closed")).alias("delta_seper_h"),
            gold_utility(),
        )
        .select(
            *passages.columns, "delta_seper_s", "delta_seper_h", *ERAG_LABEL_COLUMNS.values(),
            "gold_utility",
        )
    )
    if table["delta_seper_s"].null_count():
        missing = table.filter(pl.col("delta_seper_s").is_null()).row(0, named=True)
        raise ValueError(
            f"query {missing['query_id']!r}, document {missing['doc_id']!r}: no {condition} or closed-book samples"
        )
    if utility_signals is not None:
        table = table.join(utility_signals, on=["query_id", "doc_id"], how="left")
    if ground_truth is not None:
        table = table.join(
            ground_truth.select("query_id", "doc_id", pl.col("utility").alias("true_utility")),
            on=["query_id", "doc_id"], how="left",
        )  # null: a passage the ground truth does not judge
    return table


def query_scores(
    groups: pl.DataFrame,
    queries: pl.DataFrame,
    consens: pl.DataFrame | None = None,
    leave_one_out: pl.DataFrame | None = None,
    contexts: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Per query: SePer with and without context and ΔSePer_S/H (eq. 11), semantic entropy,
    EM / F1 / has_answer, MIRAGE's per-question correctness (base, oracle, mixed = rag), and
    when given ConSens (``consens``: ``CONSENS_SCHEMA``), Experiment 3's removal-lowest share
    of the retrieval hits (``leave_one_out``: :func:`leave_one_out_hits`) and the rag context's
    tokens before and after compression (``contexts``: ``CONTEXT_SCHEMA``)."""
    table = (
        queries.select("query_id", *[c for c in QA_QUERY_OPTIONAL_SCHEMA if c in queries.columns])
        .join(_condition(groups, "closed_book"), on="query_id", how="left")
        .join(_condition(groups, "rag"), on="query_id", how="left")
        .join(
            groups.filter(pl.col("condition") == "oracle").select("query_id", pl.col("answer_loose").alias("answer_loose_oracle")),
            on="query_id", how="left",
        )
        .with_columns(
            delta_seper(pl.col("seper_s_rag"), pl.col("seper_s_closed")).alias("delta_seper_s"),
            delta_seper(pl.col("seper_h_rag"), pl.col("seper_h_closed")).alias("delta_seper_h"),
        )
    )
    if consens is not None:
        table = table.join(consens, on="query_id", how="left")
    if leave_one_out is not None:
        table = table.join(leave_one_out.select("query_id", "consens_loo_lowest"), on="query_id", how="left")
    if contexts is not None:
        table = table.join(
            contexts.select("query_id", "context_tokens_before", "context_tokens_after"), on="query_id", how="left"
        )
    return table.sort("query_id")


def gold_utility() -> pl.Expr:
    """LLM-specific utility eq. 1: the judged answer with the passage alone holds a gold answer
    (``answer_has``) and the judged closed-book answer does not (``answer_has_closed``)."""
    return (pl.col("answer_has") & ~pl.col("answer_has_closed")).alias("gold_utility")


@dataclass(frozen=True)
class UtilityScores:
    """LLM-specific utility of one setting × generator, judged against the gold answers:
    ``candidates`` (``CANDIDATE_SCHEMA``: per candidate its judged answer alone, gold utility and
    signals), the generator's ``judgments`` (``UTILITY_JUDGMENT_SCHEMA``) and ``rag``: per query
    and ``source`` — a verbalized method, or ``candidates`` (all of them, the pseudo-answer's
    prompt) — has_answer of the greedy answer with that source's passages."""

    candidates: pl.DataFrame
    judgments: pl.DataFrame
    rag: pl.DataFrame


def utility_scores(
    groups: pl.DataFrame,
    queries: pl.DataFrame,
    candidates: pl.DataFrame,
    generations: pl.DataFrame,
    signals: pl.DataFrame,
    judgments: pl.DataFrame,
) -> UtilityScores:
    """Judge the utility step's outputs (``evaluation.verbalized``): each candidate's answer alone
    is its ``per_doc`` group's judged answer within the top k, else its ``per_candidate`` greedy
    answer; gold utility (eq. 1) against the judged closed-book answer; RAG with a method's
    passages is its ``rag_<method>`` answer, or the closed-book one when it chose none."""
    golds = dict(queries.select("query_id", "answers").iter_rows())

    greedy = generations.filter(pl.col("decoding") == DECODING_GREEDY)

    def answered(condition: pl.Expr, *keys: str) -> pl.DataFrame:
        """The greedy answers of ``condition`` with has_answer against the gold answers."""
        rows = greedy.filter(condition).select(*keys, pl.col("text").alias("answer"))
        return rows.with_columns(pl.Series("answer_has", [
            answer_metrics.has_answer(text, golds[qid]) for qid, text in rows.select("query_id", "answer").iter_rows()
        ], dtype=pl.Boolean))

    alone = pl.concat([
        groups.filter(pl.col("condition") == "per_doc").select("query_id", "doc_id", "answer", "answer_has"),
        answered(pl.col("condition") == UTILITY_PER_CANDIDATE, "query_id", "doc_id"),
    ])
    closed = groups.filter(pl.col("condition") == "closed_book").select(
        "query_id", pl.col("answer_has").alias("answer_has_closed")
    )
    table = (
        candidates.select("query_id", "doc_id", "rank")
        .join(alone, on=["query_id", "doc_id"], how="left")
        .join(closed, on="query_id", how="left")
        .with_columns(gold_utility())
        .join(signals, on=["query_id", "doc_id"], how="left")
        .select(*CANDIDATE_SCHEMA)
        .cast(CANDIDATE_SCHEMA)
        .sort("query_id", "rank")
    )
    if table["gold_utility"].null_count():
        missing = table.filter(pl.col("gold_utility").is_null()).row(0, named=True)
        raise ValueError(
            f"query {missing['query_id']!r}, candidate {missing['doc_id']!r} (rank {missing['rank']}): no answer "
            "with it alone (per_doc within the top k, per_candidate beyond) or no closed-book answer"
        )
    rag_conditions = [utility_rag_condition(m) for m in judgments["method"].unique()]
    with_passages = {
        (qid, condition): has
        for qid, condition, _, has in answered(pl.col("condition").is_in(rag_conditions), "query_id", "condition").iter_rows()
    }
    closed_has = dict(closed.iter_rows())
    rag = [
        (qid, method, with_passages[(qid, utility_rag_condition(method))] if docs else closed_has[qid])
        for qid, method, docs in judgments.select("query_id", "method", "rag_doc_ids").iter_rows()
    ]
    pseudo = answered(pl.col("condition") == UTILITY_PSEUDO_ANSWER, "query_id")
    rag.extend((qid, UTILITY_PSEUDO_ANSWER, has) for qid, _, has in pseudo.iter_rows())
    schema = {"query_id": pl.String, "source": pl.String, "has_answer": pl.Boolean}
    rag_table = pl.DataFrame(rag, schema=schema, orient="row")
    return UtilityScores(table, judgments, rag_table)


def _judgment_metrics(
    source: str,
    gold: dict[str, set[str]],
    cut: int,
    selected: dict[str, list[str]] | None = None,
    ranked: dict[str, list[str]] | None = None,
) -> dict[str, tuple[float, int]]:
    """LLM-specific utility §3.4 for one source of judgments over the queries of ``gold``: set
    metrics of its ``selected`` passages, ranking metrics (NDCG / Recall at ``cut``) of its
    ``ranked`` ones; each with the number of queries it averages over (P / R / F1 and the
    rankings: those with a non-empty gold set; accuracy: those with an empty one)."""
    out: dict[str, tuple[float, int]] = {}
    if not gold:
        return out
    if selected is not None:
        chosen = set_metrics(selected, gold)
        out.update({
            f"utility_{source}_precision": (chosen.precision, chosen.n_nonempty),
            f"utility_{source}_recall": (chosen.recall, chosen.n_nonempty),
            f"utility_{source}_f1": (chosen.f1, chosen.n_nonempty),
            f"utility_{source}_accuracy_empty": (chosen.accuracy_empty, chosen.n_empty),
        })
    if ranked is not None and any(gold.values()):
        ranking = rank_metrics(ranked, gold, cut)
        out[f"utility_{source}_ndcg_{cut}"] = (ranking.ndcg, ranking.n_queries)
        out[f"utility_{source}_recall_{cut}"] = (ranking.recall, ranking.n_queries)
    return out


def _signal_metrics(
    candidates: pl.DataFrame, gold: dict[str, set[str]], signal: str, cut: int
) -> dict[str, tuple[float, int]]:
    """:func:`_judgment_metrics` of a teacher-forced signal: the candidates ordered by it, and
    selected by ``<signal>_selected`` where the signal has a selection rule (likelihood).

    Queries without the signal (no pseudo-answer to score; or a backend without attention
    weights) are left out; within a query, a candidate without it (dropped from the prompt to
    fit the context) ranks last."""
    scored = candidates.filter(pl.col("query_id").is_in(
        candidates.filter(pl.col(signal).is_not_null())["query_id"].unique().implode()
    ))
    selection = f"{signal}_selected"
    selected = None
    if selection in SIGNAL_SCHEMA:
        selected = dict(scored.filter(pl.col(selection)).group_by("query_id").agg("doc_id").iter_rows())
    ranked = dict(scored.sort(signal, descending=True, nulls_last=True).group_by("query_id", maintain_order=True)
                  .agg("doc_id").iter_rows())
    return _judgment_metrics(signal, {q: gold[q] for q in ranked}, cut, selected, ranked)


def _utility_summary(queries_table: pl.DataFrame, utility: UtilityScores) -> _Summary:
    """Every LLM-specific utility number over the candidates, over all queries, the known /
    unknown ones (answered, or not, by the judged closed-book answer, §3.4) and the queries whose
    gold-utility set is empty / not (how the authors' code splits known and unknown): set and ranking
    metrics of the signals and of each verbalized method, has_answer of RAG with each method's
    passages (Tables 3 and 7); and each method's parse-failure rate (over its judgments)."""
    table = utility.candidates
    cut = min(RANK_CUTOFF, int(table["rank"].max()))
    gold: dict[str, set[str]] = {qid: set() for qid in table["query_id"].unique(maintain_order=True)}
    for qid, doc in table.filter(pl.col("gold_utility")).select("query_id", "doc_id").iter_rows():
        gold[qid].add(doc)
    known = set(queries_table.filter(pl.col("answer_has_closed"))["query_id"])
    empty = {qid for qid, docs in gold.items() if not docs}
    subsets = {"": gold.keys(), "known": known, "unknown": gold.keys() - known,
               "empty_gold": empty, "nonempty_gold": gold.keys() - empty}
    out = _Summary()
    for subset, member in subsets.items():
        results: dict[str, tuple[float, int]] = {}
        part = table.filter(pl.col("query_id").is_in(list(member)))
        for signal in ("likelihood", "attention"):
            results.update(_signal_metrics(part, gold, signal, cut))
        for method, rows in utility.judgments.filter(pl.col("query_id").is_in(list(member))).group_by("method"):
            selection = method[0] in SELECTION_METHODS
            judged = dict(rows.select("query_id", "selected" if selection else "ranking").iter_rows())
            results.update(_judgment_metrics(
                method[0], {q: gold[q] for q in judged}, cut, *((judged, None) if selection else (None, judged))
            ))
        for source, rows in utility.rag.filter(pl.col("query_id").is_in(list(member))).group_by("source"):
            results[f"utility_{source[0]}_rag_has_answer"] = (rows["has_answer"].mean(), rows.height)
        for name, (value, n) in results.items():
            out.add(_subset_name(name, subset) if subset else name, value, n)
    for method, judgments, unparseable in (
        utility.judgments.group_by("method").agg(pl.col("judgments").sum(), pl.col("unparseable").sum()).iter_rows()
    ):
        if judgments:
            out.add(f"utility_{method}_parse_failure_rate", unparseable / judgments, judgments)
    return out


def _subset_name(name: str, subset: str) -> str:
    """``utility_likelihood_f1`` → ``utility_likelihood_f1_known``; a cut-off stays last
    (``utility_likelihood_ndcg_5`` → ``utility_likelihood_ndcg_known_5``)."""
    entry = catalog.metric(name)
    if entry is not None and "{k}" in entry.name:
        stem, _, cut = name.rpartition("_")
        return f"{stem}_{subset}_{cut}"
    return f"{name}_{subset}"


class _Summary(dict):
    """Summary numbers, each with the count it aggregates stored as ``n_<generic name>``."""

    def add(self, name: str, value: float, n: int) -> None:
        if math.isnan(value):
            return
        self[name] = float(value)
        self[f"n_{catalog.generic_name(name)}"] = float(n)


def _validity_correlations(queries_table: pl.DataFrame, documents: pl.DataFrame) -> _Summary:
    """SePer Table 2's protocol: Pearson r between per-document ΔSePer and ground-truth utility
    over judged passages only, leaving out the questions the generator answers closed book (its
    judged closed-book answer holds a gold answer), over all questions and per question type
    (single- / multi-hop, where the dataset gives ``n_hops``)."""
    hops = ["n_hops"] if "n_hops" in queries_table.columns else []
    judged = documents.filter(pl.col("true_utility").is_not_null()).join(
        queries_table.filter(~pl.col("answer_has_closed")).select("query_id", *hops), on="query_id"
    )
    parts = {"": judged}
    if hops:
        parts.update({"_single_hop": judged.filter(pl.col("n_hops") == 1), "_multi_hop": judged.filter(pl.col("n_hops") > 1)})
    out = _Summary()
    for suffix, part in parts.items():
        truth = part["true_utility"].to_numpy()
        for kernel in ("s", "h"):
            values = part[f"delta_seper_{kernel}"].to_numpy()
            if part.height >= 3 and np.ptp(values) > 0 and np.ptp(truth) > 0:
                out.add(f"pearson_delta_seper_{kernel}_true_utility{suffix}", pearson(values, truth).statistic, part.height)
    return out


def _compression_summary(queries_table: pl.DataFrame) -> _Summary:
    """SePer §5.4 (RQ3) per context token, over the queries whose rag context was counted:
    ``compression_ratio`` (context tokens after / before, summed over queries: 1 uncompressed)
    and ΔSePer_S/H per 100 context tokens after compression
    (:func:`~ragutil_dagster.metrics.seper.delta_seper_per_context_tokens`)."""
    out = _Summary()
    if "context_tokens_after" not in queries_table.columns:
        return out
    counted = queries_table.filter(pl.col("context_tokens_after").is_not_null())
    before, after = counted["context_tokens_before"].sum(), counted["context_tokens_after"].sum()
    if counted.height and before:
        out.add("compression_ratio", after / before, counted.height)
    for kernel in ("s", "h"):
        value = delta_seper_per_context_tokens(counted[f"delta_seper_{kernel}"], counted["context_tokens_after"])
        out.add(f"delta_seper_{kernel}_per_100_context_tokens", value, counted.height)
    return out


def retriever_summary(table: pl.DataFrame) -> dict[str, float]:
    """The summary numbers of MIRAGE Table 2 of the setting's retriever (``table``:
    ``retrieval.runs.mirage_retrieval`` of its run) — precision, recall, F1 and both NDCG@k —
    each with its n (queries with positives)."""
    out = _Summary()
    for row in table.iter_rows(named=True):
        for name in ("precision", "recall", "f1", "ndcg", "ndcg_retrieved"):
            out.add(f"mirage_retriever_{name}_{row['k']}", row[name], row["queries"])
    return dict(out)


def summarize(
    queries_table: pl.DataFrame,
    documents: pl.DataFrame,
    k: int,
    erag_label: DownstreamMetric = "exact_match",
    utility: UtilityScores | None = None,
    leave_one_out: pl.DataFrame | None = None,
) -> dict[str, float]:
    """Headline numbers of one setting × generator, each with its n (``n_<name>``): means over
    queries, MIRAGE's four metrics, eRAG aggregates of the ``erag_label`` labels (the measures
    :func:`~ragutil_dagster.metrics.erag.erag_measure_names` defines for them),
    LLM-specific utility over its candidates when ``utility`` is given (:func:`_utility_summary`),
    ConSens, Experiment 3's AUCs over the retrieval hits when ``leave_one_out``
    (:func:`leave_one_out_hits`) is given (:func:`_leave_one_out_summary`), — when the
    dataset has ground-truth utility — SePer
    Table 2's validity correlations (:func:`_validity_correlations`), and — when the per-query
    table counts context tokens — the compression ratio and ΔSePer per 100 context tokens
    (:func:`_compression_summary`)."""
    summary = _Summary(queries=float(queries_table.height), documents=float(documents.height))
    for column in catalog.per_query_means():
        if column in queries_table.columns:
            values = queries_table[column].drop_nulls()
            if values.len():
                summary.add(column, values.mean(), values.len())
    with_oracle = queries_table.filter(pl.col("answer_loose_oracle").is_not_null())
    if with_oracle.height:
        mirage = adaptability(
            with_oracle["answer_loose_closed"].to_list(),
            with_oracle["answer_loose_oracle"].to_list(),
            with_oracle["answer_loose_rag"].to_list(),
        )
        for name, value in mirage.as_dict().items():
            summary.add(f"mirage_{name}", value, with_oracle.height)
        # The questions behind each share (its two groups G(b, o, m), eqs. 2–5).
        summary.update({f"count_mirage_{name}": float(count) for name, count in mirage.counts().items()})
    # Every query, ranked or not: one the retriever returned nothing for scores 0 (trec_eval's -c).
    listed = dict(documents.sort("rank").group_by("query_id", maintain_order=True).agg("doc_id").iter_rows())
    ranked = {qid: listed.get(qid, []) for qid in queries_table["query_id"]}
    labels: dict[str, dict[str, float]] = {qid: {} for qid in ranked}
    for qid, doc, label in documents.select("query_id", "doc_id", ERAG_LABEL_COLUMNS[erag_label]).iter_rows():
        labels.setdefault(qid, {})[doc] = float(label)
    erag = erag_scores(ranked, labels, erag_measure_names(erag_label, k))
    for name, value in erag.mean.items():
        summary.add(f"erag_{name}", value, len(ranked))
    if utility is not None:
        summary.update(_utility_summary(queries_table, utility))
    if leave_one_out is not None:
        summary.update(_leave_one_out_summary(leave_one_out))
    if "true_utility" in documents.columns:
        summary.update(_validity_correlations(queries_table, documents))
    summary.update(_compression_summary(queries_table))
    return dict(summary)
