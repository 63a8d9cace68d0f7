"""Which retrieval evaluation predicts the RAG system's downstream performance? eRAG Table 1 (one
k) and Figure 1 (k varying), with ragutil's utility metrics beside eRAG's approaches.

Per query, every approach scores the top-k list (a *predictor*); each predictor is then rank-
correlated over queries with the downstream performance of the ``rag`` condition (the *target*:
EM, as eRAG for QA, or has_answer) — Kendall's τ-b and Spearman's ρ with bootstrap intervals
(:func:`ragutil_dagster.metrics.stats.rank_correlation`).

Approaches (``approach`` / ``measure`` columns):

* ``erag`` — eRAG's labels G_q[d] (eq. 1 with EM, KILT's metric for QA; ``erag_label`` of the
  documents table) aggregated by P, R, MAP, MRR, NDCG and Hit at k; ``erag_has_answer`` the same
  with has_answer labels.
* ``provenance`` — the same six measures over the qrels' relevance (Table 1's "KILT Provenance").
* ``answers`` — the same six over "the passage contains a gold answer" (Table 1's "Containing
  the Answer"; DPR ``has_answer`` on the passage text).
* ``gold_utility`` — the same six over LLM-specific utility's gold utilitarian passages (§3.2.1).
* ``delta_seper_s_per_doc`` — per-document ΔSePer_S aggregated as eRAG aggregates non-binary
  labels: P (sum over the top k / k, footnote a of Table 1), Hit (max, footnote b), and NDCG with
  gain max(ΔSePer_S, 0) and the ideal from the same list (:func:`~ragutil_dagster.metrics.ranking.graded_ndcg`).
* ``delta_seper_s`` / ``query`` — ΔSePer_S of the rag condition (SePer eq. 11).
* ``mirage_context_acceptability`` / ``CA`` — MIRAGE eq. 3 per question: 1 when the oracle and the
  mixed (= rag) answers are both correct, else 0; null without an oracle answer.

Every approach labels only the retrieved top k, as eRAG's G_q is defined on R_k: recall is then
relative to the relevant documents among the k, so R@k equals Hit@k — as Table 1 prints for every
approach at its k = 50. A query without a retrieved document scores 0 on every list measure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import polars as pl

from ragutil_dagster.metrics.answers import has_answer
from ragutil_dagster.metrics.erag import erag_scores
from ragutil_dagster.metrics.ranking import graded_ndcg, ir_measures, ranks_to_run
from ragutil_dagster.metrics.stats import RankCorrelation, rank_correlation
from ragutil_dagster.tables import (
    ANSWER_CONTAINMENT_SCHEMA,
    PREDICTOR_SCHEMA,
    RETRIEVAL_CORRELATION_SCHEMA,
)

# eRAG Table 1's measure names → pytrec_eval measures at cut-off k (the list is already cut at k).
LIST_MEASURES: dict[str, str] = {
    "P": "P_{k}",
    "R": "recall_{k}",
    "MAP": "map_cut_{k}",
    "MRR": "recip_rank",
    "NDCG": "ndcg_cut_{k}",
    "Hit": "success_{k}",
}
# Approaches whose per-document labels are integers, each from its column of the labelled documents.
LABELLED_APPROACHES: dict[str, str] = {
    "erag": "erag_label",
    "erag_has_answer": "erag_label_has_answer",
    "provenance": "relevance",
    "answers": "contains_answer",
    "gold_utility": "gold_utility",
}
# The downstream performance of the rag condition: per-query columns of evaluation.paper_scores.query_scores.
TARGETS: dict[str, str] = {"em": "em_rag", "has_answer": "has_answer_rag"}


def answer_containment(
    documents: pl.DataFrame, passages: pl.DataFrame, queries: pl.DataFrame
) -> pl.DataFrame:
    """Per retrieved document: does its passage text contain a gold answer of the query (DPR
    ``has_answer``)? The labels of eRAG Table 1's "Containing the Answer" (``ANSWER_CONTAINMENT_SCHEMA``).

    ``documents`` has ``query_id, doc_id``; ``passages`` ``id, text`` (e.g. ``retrieved_passages``);
    ``queries`` ``query_id, answers``."""
    texts = dict(passages.select("id", "text").iter_rows())
    golds = dict(queries.select("query_id", "answers").iter_rows())
    rows = []
    for qid, doc in documents.select("query_id", "doc_id").iter_rows():
        if doc not in texts:
            raise KeyError(f"query {qid!r}: retrieved passage {doc!r} is not among the passages")
        if qid not in golds:
            raise KeyError(f"query {qid!r} has retrieved passages but no gold answers")
        rows.append((qid, doc, has_answer(texts[doc], golds[qid])))
    return pl.DataFrame(rows, schema=ANSWER_CONTAINMENT_SCHEMA, orient="row")


def labelled_documents(
    documents: pl.DataFrame, qrels: pl.DataFrame, containment: pl.DataFrame, k: int
) -> pl.DataFrame:
    """The documents ranked 1..k with one integer label column per approach of
    ``LABELLED_APPROACHES`` and ``delta_seper_s``. Truncating a deeper list at k assumes a
    document's labels do not depend on k: each is judged alone (eRAG eq. 1, the ``per_doc``
    condition), and the top k of a run is the prefix of its top K > k."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    depth = documents["rank"].max()
    if depth is None or k > depth:
        raise ValueError(f"k = {k} exceeds the depth of the documents table ({depth})")
    top = documents.filter(pl.col("rank") <= k)
    missing = top.join(containment, on=["query_id", "doc_id"], how="anti")
    if missing.height:
        row = missing.row(0, named=True)
        raise ValueError(
            f"query {row['query_id']!r}, document {row['doc_id']!r}: no answer-containment label"
        )
    return (
        top.join(
            qrels.select("query_id", "doc_id", "relevance"), on=["query_id", "doc_id"], how="left"
        )
        .join(containment, on=["query_id", "doc_id"], how="left")
        .with_columns(
            pl.col("relevance").fill_null(0).cast(pl.Int64),
            pl.col("contains_answer").cast(pl.Int64),
            pl.col("erag_label").cast(pl.Int64),
            pl.col("erag_label_has_answer").cast(pl.Int64),
            pl.col("gold_utility").cast(pl.Int64),
        )
        .select("query_id", "doc_id", "rank", *LABELLED_APPROACHES.values(), "delta_seper_s")
        .sort("query_id", "rank")
    )


def _rows(approach: str, measure: str, k: int, values: Mapping[str, float | None]) -> list[tuple]:
    return [(qid, approach, measure, k, value) for qid, value in values.items()]


def _list_predictors(labelled: pl.DataFrame, query_ids: Iterable[str], k: int) -> list[tuple]:
    """Rows of every ranked-list approach; queries without a retrieved document score 0."""
    query_ids = list(query_ids)
    ranked = {
        qid: docs
        for qid, docs in labelled.group_by("query_id", maintain_order=True)
        .agg("doc_id")
        .iter_rows()
    }
    pytrec = {name: template.format(k=k) for name, template in LIST_MEASURES.items()}
    rows: list[tuple] = []
    for approach, column in LABELLED_APPROACHES.items():
        judged = {qid: {} for qid in query_ids}
        for qid, doc, label in labelled.select("query_id", "doc_id", column).iter_rows():
            if qid in judged:
                judged[qid][doc] = int(label)
        per_query, _ = ir_measures(ranks_to_run(ranked), judged, pytrec.values())
        for name, key in pytrec.items():
            rows += _rows(approach, name, k, {qid: per_query[qid][key] for qid in query_ids})
    utility = {qid: {} for qid in query_ids}
    for qid, doc, value in labelled.select("query_id", "doc_id", "delta_seper_s").iter_rows():
        if qid in utility:
            utility[qid][doc] = float(value)
    lists = {qid: ranked.get(qid, []) for qid in query_ids}
    scores = erag_scores(lists, utility, [f"P_{k}", f"success_{k}"]).per_query
    rows += _rows("delta_seper_s_per_doc", "P", k, {q: scores[q][f"P_{k}"] for q in query_ids})
    rows += _rows(
        "delta_seper_s_per_doc", "Hit", k, {q: scores[q][f"success_{k}"] for q in query_ids}
    )
    ndcg = {
        q: graded_ndcg([max(utility[q][d], 0.0) for d in lists[q]], k) if lists[q] else 0.0
        for q in query_ids
    }
    rows += _rows("delta_seper_s_per_doc", "NDCG", k, ndcg)
    return rows


def predictor_table(
    per_query: pl.DataFrame,
    documents: pl.DataFrame,
    qrels: pl.DataFrame,
    containment: pl.DataFrame,
    k: int,
) -> pl.DataFrame:
    """Every approach's per-query score at cut-off k (``PREDICTOR_SCHEMA``: one row per query ×
    approach × measure), for the queries of ``per_query`` (the per-query table of
    :func:`~ragutil_dagster.evaluation.paper_scores.query_scores`); ``documents`` is the documents table
    of :func:`~ragutil_dagster.evaluation.paper_scores.document_scores` (at a depth ≥ k), ``containment``
    that of :func:`answer_containment`."""
    query_ids = per_query["query_id"].to_list()
    rows = _list_predictors(labelled_documents(documents, qrels, containment, k), query_ids, k)
    rows += _rows(
        "delta_seper_s", "query", k, dict(per_query.select("query_id", "delta_seper_s").iter_rows())
    )
    if "answer_loose_oracle" in per_query.columns:
        acceptable = per_query.select(
            "query_id",
            pl.when(pl.col("answer_loose_oracle").is_not_null()).then(
                (pl.col("answer_loose_oracle") & pl.col("answer_loose_rag")).cast(pl.Float64)
            ),
        )
        rows += _rows("mirage_context_acceptability", "CA", k, dict(acceptable.iter_rows()))
    return pl.DataFrame(rows, schema=PREDICTOR_SCHEMA, orient="row")


def correlation_table(
    predictors: pl.DataFrame, per_query: pl.DataFrame, n_resamples: int = 1000, seed: int = 0
) -> pl.DataFrame:
    """Kendall's τ-b and Spearman's ρ of each predictor (approach × measure × k) with each target
    of ``TARGETS`` over the queries where both are known, with percentile bootstrap 95 %
    intervals (``RETRIEVAL_CORRELATION_SCHEMA``). Every cell resamples with the same ``seed``, so
    cells over the same queries share their resamples. Undefined correlations are null with the
    reason in ``undefined``."""
    targets = per_query.select("query_id", *[pl.col(c).alias(t) for t, c in TARGETS.items()])
    joined = predictors.join(targets, on="query_id", how="inner")
    rows = []
    # Measures often agree query by query (at k = 1 every list measure is the label itself):
    # identical value pairs get the identical cell, computed once.
    cells: dict[bytes, RankCorrelation] = {}
    for (approach, measure, k), part in joined.group_by(
        "approach", "measure", "k", maintain_order=True
    ):
        for target in TARGETS:
            pairs = part.select("value", target).drop_nulls()
            x, y = pairs["value"].to_numpy(), pairs[target].to_numpy()
            key = x.tobytes() + b"|" + y.tobytes()
            if key not in cells:
                cells[key] = rank_correlation(x, y, n_resamples=n_resamples, seed=seed)
            cell = cells[key]
            rows.append(
                (
                    approach,
                    measure,
                    target,
                    k,
                    cell.tau,
                    cell.tau_low,
                    cell.tau_high,
                    cell.rho,
                    cell.rho_low,
                    cell.rho_high,
                    cell.n,
                    cell.resamples,
                    cell.undefined,
                )
            )
    return pl.DataFrame(rows, schema=RETRIEVAL_CORRELATION_SCHEMA, orient="row")


def retrieval_predictors_table(
    per_query: pl.DataFrame,
    documents: pl.DataFrame,
    qrels: pl.DataFrame,
    containment: pl.DataFrame,
    k: int,
    n_resamples: int = 1000,
    seed: int = 0,
) -> pl.DataFrame:
    """eRAG Table 1 for one setting × generator: every approach's correlation with the rag
    condition's EM and has_answer over queries, at the setting's k."""
    return correlation_table(
        predictor_table(per_query, documents, qrels, containment, k), per_query, n_resamples, seed
    )


def _with_interval(value: str, low: str, high: str) -> pl.Expr:
    return (
        pl.when(pl.col(value).is_null())
        .then(pl.lit("—"))
        .otherwise(pl.format("{} [{}, {}]", *(pl.col(c).round(2) for c in (value, low, high))))
    )


def table_one(correlations: pl.DataFrame, target: str = "em") -> pl.DataFrame:
    """eRAG Table 1's layout of one setting × generator: per approach and measure, τ and ρ with
    their bootstrap intervals against ``target``, the queries they are over, and why a cell is
    undefined."""
    return correlations.filter(pl.col("target") == target).select(
        "approach",
        "measure",
        _with_interval("kendall_tau", "tau_ci_low", "tau_ci_high").alias("Kendall τ [95% CI]"),
        _with_interval("spearman_rho", "rho_ci_low", "rho_ci_high").alias("Spearman ρ [95% CI]"),
        pl.col("n_queries").alias("n"),
        "undefined",
    )


def figure_one(correlations: pl.DataFrame, target: str = "em") -> pl.DataFrame:
    """eRAG Figure 1 as a table: Kendall τ against ``target`` as k varies — one row per dataset,
    retriever, generator, approach and measure, one column per k. ``correlations`` holds the
    Table 1 rows of several settings with their ``dataset``, ``retriever`` and ``generator``;
    each k's cell is that setting's own (its retrieval and its rag condition at k)."""
    keys = ["dataset", "retriever", "generator", "approach", "measure"]
    return (
        correlations.filter(pl.col("target") == target)
        .sort("k")
        .with_columns(pl.format("τ k={}", "k").alias("cell"))
        .pivot(
            "cell",
            index=keys,
            values="kendall_tau",
            aggregate_function="first",
            maintain_order=True,
        )
        .sort(keys)
    )
