"""Each paper's per-query and per-document scores, from the per-group scores
(:func:`~ragutil_dagster.evaluation.groups.group_scores`): SePer / ΔSePer, eRAG's labels,
MIRAGE's per-question correctness, gold utility, ConSens and its leave-one-out hits."""

from __future__ import annotations

import polars as pl

from ragutil_dagster.evaluation.utility_scores import gold_utility
from ragutil_dagster.metrics import catalog
from ragutil_dagster.metrics import consens as consens_metrics
from ragutil_dagster.metrics.erag import BINARY_DOWNSTREAM_METRICS, DOWNSTREAM_METRICS, erag_labels
from ragutil_dagster.metrics.seper import delta_seper
from ragutil_dagster.tables import (
    QA_QUERY_OPTIONAL_SCHEMA,
    QUERY_CONDITION_COLUMNS,
    QUERY_CONDITIONS,
)


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
    metric: "erag_label" if metric == "exact_match" else f"erag_label_{metric}"
    for metric in DOWNSTREAM_METRICS
}


def erag_label_table(
    groups: pl.DataFrame, queries: pl.DataFrame, condition: str = "per_doc"
) -> pl.DataFrame:
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
        columns.append(
            pl.Series(column, [labels[qid][doc_id] for qid, doc_id in keys.iter_rows()]).cast(dtype)
        )
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
            leave_one_out.rename({"attribution": "consens_attribution"}),
            on=["query_id", "doc_id"],
            how="left",
        )
    return table.sort("query_id", "rank")


def leave_one_out_hits(documents: pl.DataFrame, qrels: pl.DataFrame) -> pl.DataFrame:
    """ConSens Experiment 3 (§3.3) per retrieval hit: the queries whose documents scored with
    the leave-one-out contexts (``consens_without`` of :func:`document_scores`) hold a relevant
    one (qrels relevance > 0) and another — the paper keeps the retrieval hits only. Per query,
    in rank order: ``consens_without``, ``consens_attribution`` and ``relevant`` as lists, and
    ``consens_loo_lowest`` (:func:`~ragutil_dagster.metrics.consens.removal_lowest`)."""
    positives = qrels.filter(pl.col("relevance") > 0).select(
        "query_id", "doc_id", pl.lit(True).alias("relevant")
    )
    scored = (
        documents.filter(pl.col("consens_without").is_not_null())
        .join(positives, on=["query_id", "doc_id"], how="left")
        .with_columns(pl.col("relevant").fill_null(False))
        .sort("query_id", "rank")
        .group_by("query_id", maintain_order=True)
        .agg("consens_without", "consens_attribution", "relevant")
        .filter(pl.col("relevant").list.any() & ~pl.col("relevant").list.all())
    )
    lowest = [
        consens_metrics.removal_lowest(v, r)
        for v, r in scored.select("consens_without", "relevant").iter_rows()
    ]
    return scored.with_columns(pl.Series("consens_loo_lowest", lowest, dtype=pl.Float64))


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
            *passages.columns,
            "delta_seper_s",
            "delta_seper_h",
            *ERAG_LABEL_COLUMNS.values(),
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
            on=["query_id", "doc_id"],
            how="left",
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
    tokens before and after compression (``contexts``: ``CONTEXT_SCHEMA``); then the column of
    every registered metric computed from these (``metrics/catalog.register``)."""
    table = (
        queries.select("query_id", *[c for c in QA_QUERY_OPTIONAL_SCHEMA if c in queries.columns])
        .join(_condition(groups, "closed_book"), on="query_id", how="left")
        .join(_condition(groups, "rag"), on="query_id", how="left")
        .join(
            groups.filter(pl.col("condition") == "oracle").select(
                "query_id", pl.col("answer_loose").alias("answer_loose_oracle")
            ),
            on="query_id",
            how="left",
        )
        .with_columns(
            delta_seper(pl.col("seper_s_rag"), pl.col("seper_s_closed")).alias("delta_seper_s"),
            delta_seper(pl.col("seper_h_rag"), pl.col("seper_h_closed")).alias("delta_seper_h"),
        )
    )
    if consens is not None:
        table = table.join(consens, on="query_id", how="left")
    if leave_one_out is not None:
        table = table.join(
            leave_one_out.select("query_id", "consens_loo_lowest"), on="query_id", how="left"
        )
    if contexts is not None:
        table = table.join(
            contexts.select("query_id", "context_tokens_before", "context_tokens_after"),
            on="query_id",
            how="left",
        )
    for entry in catalog.query_columns():
        table = table.with_columns(entry.query_column(table).cast(entry.dtype).alias(entry.name))
    return table.sort("query_id")
