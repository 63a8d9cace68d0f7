"""The headline summary of one setting × generator, each number with its n: means over queries,
MIRAGE, eRAG aggregates, LLM-specific utility's set and ranking metrics, ConSens' AUCs, SePer
Table 2's validity correlations, compression and the retriever's MIRAGE Table 2."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from ragutil_dagster.evaluation.paper_scores import ERAG_LABEL_COLUMNS
from ragutil_dagster.evaluation.utility_scores import UtilityScores
from ragutil_dagster.metrics import catalog
from ragutil_dagster.metrics import consens as consens_metrics
from ragutil_dagster.metrics.catalog import SummaryKey
from ragutil_dagster.metrics.erag import DownstreamMetric, erag_measures, erag_scores
from ragutil_dagster.metrics.mirage import adaptability
from ragutil_dagster.metrics.seper import delta_seper_per_context_tokens
from ragutil_dagster.metrics.stats import pearson
from ragutil_dagster.metrics.utility import (
    RANK_CUTOFF,
    SELECTION_METHODS,
    rank_metrics,
    set_metrics,
)
from ragutil_dagster.tables import SIGNAL_SCHEMA


def _leave_one_out_summary(hits: pl.DataFrame) -> _Summary:
    """ConSens Experiment 3's ROC AUC over the retrieval hits (``leave_one_out_auc``: contexts
    keeping the relevant document against those leaving it out, as Fig. 3 pairs them) and the
    per-document attribution AUC (``attribution_auc``), each with its n of queries."""
    out = _Summary()
    if hits.height:
        relevant = hits["relevant"].to_list()
        without, attributions = (
            hits["consens_without"].to_list(),
            hits["consens_attribution"].to_list(),
        )
        out.add(
            SummaryKey("consens_loo_auc"),
            consens_metrics.leave_one_out_auc(without, relevant),
            hits.height,
        )
        out.add(
            SummaryKey("consens_loo_attribution_auc"),
            consens_metrics.attribution_auc(attributions, relevant),
            hits.height,
        )
    return out


def _judgment_metrics(
    source: str,
    subset: str,
    gold: dict[str, set[str]],
    cut: int,
    selected: dict[str, list[str]] | None = None,
    ranked: dict[str, list[str]] | None = None,
) -> dict[SummaryKey, tuple[float, int]]:
    """LLM-specific utility §3.4 for one source of judgments over the queries of ``gold`` (those
    of ``subset``): set metrics of its ``selected`` passages, ranking metrics (NDCG / Recall at
    ``cut``) of its ``ranked`` ones; each with the number of queries it averages over (P / R / F1
    and the rankings: those with a non-empty gold set; accuracy: those with an empty one)."""
    out: dict[SummaryKey, tuple[float, int]] = {}
    if not gold:
        return out
    if selected is not None:
        chosen = set_metrics(selected, gold)
        for part, value, n in (
            ("precision", chosen.precision, chosen.n_nonempty),
            ("recall", chosen.recall, chosen.n_nonempty),
            ("f1", chosen.f1, chosen.n_nonempty),
            ("accuracy_empty", chosen.accuracy_empty, chosen.n_empty),
        ):
            out[SummaryKey(catalog.utility_metric(source, part, subset))] = (value, n)
    if ranked is not None and any(gold.values()):
        ranking = rank_metrics(ranked, gold, cut)
        for part, value in (("ndcg", ranking.ndcg), ("recall", ranking.recall)):
            metric = catalog.utility_metric(source, part, subset, at_k=True)
            out[SummaryKey(metric, cut)] = (value, ranking.n_queries)
    return out


def _signal_metrics(
    candidates: pl.DataFrame, gold: dict[str, set[str]], signal: str, subset: str, cut: int
) -> dict[SummaryKey, tuple[float, int]]:
    """:func:`_judgment_metrics` of a teacher-forced signal: the candidates ordered by it, and
    selected by ``<signal>_selected`` where the signal has a selection rule (likelihood).

    Queries without the signal (no pseudo-answer to score; or a backend without attention
    weights) are left out; within a query, a candidate without it (dropped from the prompt to
    fit the context) ranks last."""
    scored = candidates.filter(
        pl.col("query_id").is_in(
            candidates.filter(pl.col(signal).is_not_null())["query_id"].unique().implode()
        )
    )
    selection = f"{signal}_selected"
    selected = None
    if selection in SIGNAL_SCHEMA:
        selected = dict(
            scored.filter(pl.col(selection)).group_by("query_id").agg("doc_id").iter_rows()
        )
    ranked = dict(
        scored.sort(signal, descending=True, nulls_last=True)
        .group_by("query_id", maintain_order=True)
        .agg("doc_id")
        .iter_rows()
    )
    return _judgment_metrics(signal, subset, {q: gold[q] for q in ranked}, cut, selected, ranked)


def _utility_summary(queries_table: pl.DataFrame, utility: UtilityScores) -> _Summary:
    """Every LLM-specific utility number over the candidates, over all queries, the known /
    unknown ones (answered, or not, by the judged closed-book answer, §3.4) and the queries whose
    gold-utility set is empty / not (how the authors' code splits known and unknown): set and ranking
    metrics of the signals and of each verbalized method, has_answer of RAG with each method's
    passages (Tables 3 and 7); and each method's parse-failure rate (over its judgments)."""
    table = utility.candidates
    cut = min(RANK_CUTOFF, int(table["rank"].max()))
    gold: dict[str, set[str]] = {
        qid: set() for qid in table["query_id"].unique(maintain_order=True)
    }
    for qid, doc in table.filter(pl.col("gold_utility")).select("query_id", "doc_id").iter_rows():
        gold[qid].add(doc)
    known = set(queries_table.filter(pl.col("answer_has_closed"))["query_id"])
    empty = {qid for qid, docs in gold.items() if not docs}
    # The queries of each of catalog.UTILITY_SUBSETS: all, known, unknown, empty / non-empty gold.
    members = (gold.keys(), known, gold.keys() - known, empty, gold.keys() - empty)
    out = _Summary()
    for subset, member in zip(catalog.UTILITY_SUBSETS, members, strict=True):
        results: dict[SummaryKey, tuple[float, int]] = {}
        part = table.filter(pl.col("query_id").is_in(list(member)))
        for signal in ("likelihood", "attention"):
            results.update(_signal_metrics(part, gold, signal, subset, cut))
        for method, rows in utility.judgments.filter(
            pl.col("query_id").is_in(list(member))
        ).group_by("method"):
            selection = method[0] in SELECTION_METHODS
            judged = dict(
                rows.select("query_id", "selected" if selection else "ranking").iter_rows()
            )
            results.update(
                _judgment_metrics(
                    method[0],
                    subset,
                    {q: gold[q] for q in judged},
                    cut,
                    *((judged, None) if selection else (None, judged)),
                )
            )
        for source, rows in utility.rag.filter(pl.col("query_id").is_in(list(member))).group_by(
            "source"
        ):
            results[SummaryKey(catalog.utility_metric(source[0], "rag_has_answer", subset))] = (
                rows["has_answer"].mean(),
                rows.height,
            )
        for key, (value, n) in results.items():
            out.add(key, value, n)
    for method, judgments, unparseable in (
        utility.judgments.group_by("method")
        .agg(pl.col("judgments").sum(), pl.col("unparseable").sum())
        .iter_rows()
    ):
        if judgments:
            out.add(
                SummaryKey(catalog.utility_metric(method, "parse_failure_rate")),
                unparseable / judgments,
                judgments,
            )
    return out


class _Summary(dict[SummaryKey, float]):
    """Summary numbers by their structured keys, each with the count it aggregates (its ``n``
    key); :meth:`flat` names them as the summary does, in the order they were added."""

    def add(self, key: SummaryKey, value: float, n: int) -> None:
        if math.isnan(value):
            return
        self[key] = float(value)
        self[key.n] = float(n)

    def flat(self) -> dict[str, float]:
        return {key.flat: value for key, value in self.items()}


def _validity_correlations(queries_table: pl.DataFrame, documents: pl.DataFrame) -> _Summary:
    """SePer Table 2's protocol: Pearson r between per-document ΔSePer and ground-truth utility
    over judged passages only, leaving out the questions the generator answers closed book (its
    judged closed-book answer holds a gold answer), over all questions and per question type
    (single- / multi-hop, where the dataset gives ``n_hops``)."""
    hops = ["n_hops"] if "n_hops" in queries_table.columns else []
    judged = documents.filter(pl.col("true_utility").is_not_null()).join(
        queries_table.filter(~pl.col("answer_has_closed")).select("query_id", *hops), on="query_id"
    )
    parts = [judged]  # the questions of catalog.VALIDITY_QUESTIONS: all, then by type if typed
    if hops:
        parts += [judged.filter(pl.col("n_hops") == 1), judged.filter(pl.col("n_hops") > 1)]
    out = _Summary()
    for questions, part in zip(catalog.VALIDITY_QUESTIONS, parts):
        truth = part["true_utility"].to_numpy()
        for kernel in ("s", "h"):
            values = part[f"delta_seper_{kernel}"].to_numpy()
            if part.height >= 3 and np.ptp(values) > 0 and np.ptp(truth) > 0:
                out.add(
                    SummaryKey(catalog.validity_metric(kernel, questions)),
                    pearson(values, truth).statistic,
                    part.height,
                )
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
        out.add(SummaryKey("compression_ratio"), after / before, counted.height)
    for kernel in ("s", "h"):
        value = delta_seper_per_context_tokens(
            counted[f"delta_seper_{kernel}"], counted["context_tokens_after"]
        )
        out.add(SummaryKey(f"delta_seper_{kernel}_per_100_context_tokens"), value, counted.height)
    return out


def retriever_summary(table: pl.DataFrame) -> dict[str, float]:
    """The summary numbers of MIRAGE Table 2 of the setting's retriever (``table``:
    ``retrieval.runs.mirage_retrieval`` of its run) — precision, recall, F1 and both NDCG@k —
    each with its n (queries with positives)."""
    out = _Summary()
    for row in table.iter_rows(named=True):
        for name in catalog.MIRAGE_RETRIEVER_MEASURES:
            out.add(
                SummaryKey(catalog.mirage_retriever_metric(name), row["k"]),
                row[name],
                row["queries"],
            )
    return out.flat()


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
    :func:`~ragutil_dagster.metrics.erag.erag_measures` defines for them),
    LLM-specific utility over its candidates when ``utility`` is given (:func:`_utility_summary`),
    ConSens, Experiment 3's AUCs over the retrieval hits when ``leave_one_out``
    (:func:`leave_one_out_hits`) is given (:func:`_leave_one_out_summary`), — when the
    dataset has ground-truth utility — SePer
    Table 2's validity correlations (:func:`_validity_correlations`), and — when the per-query
    table counts context tokens — the compression ratio and ΔSePer per 100 context tokens
    (:func:`_compression_summary`)."""
    summary = _Summary()
    for column in catalog.per_query_means():
        if column in queries_table.columns:
            values = queries_table[column].drop_nulls()
            if values.len():
                summary.add(SummaryKey(column), values.mean(), values.len())
    with_oracle = queries_table.filter(pl.col("answer_loose_oracle").is_not_null())
    if with_oracle.height:
        mirage = adaptability(
            with_oracle["answer_loose_closed"].to_list(),
            with_oracle["answer_loose_oracle"].to_list(),
            with_oracle["answer_loose_rag"].to_list(),
        )
        for name, value in mirage.as_dict().items():
            summary.add(SummaryKey(f"mirage_{name}"), value, with_oracle.height)
        # The questions behind each share (its two groups G(b, o, m), eqs. 2–5).
        summary.update(
            {
                SummaryKey(f"mirage_{name}", kind="count"): float(count)
                for name, count in mirage.counts().items()
            }
        )
    # Every query, ranked or not: one the retriever returned nothing for scores 0 (trec_eval's -c).
    listed = dict(
        documents.sort("rank").group_by("query_id", maintain_order=True).agg("doc_id").iter_rows()
    )
    ranked = {qid: listed.get(qid, []) for qid in queries_table["query_id"]}
    labels: dict[str, dict[str, float]] = {qid: {} for qid in ranked}
    for qid, doc, label in documents.select(
        "query_id", "doc_id", ERAG_LABEL_COLUMNS[erag_label]
    ).iter_rows():
        labels.setdefault(qid, {})[doc] = float(label)
    measures = erag_measures(erag_label)
    erag = erag_scores(ranked, labels, [m.at(k) for m in measures])
    for measure in measures:
        key = SummaryKey(catalog.erag_metric(measure), k if measure.at_k else None)
        summary.add(key, erag.mean[measure.at(k)], len(ranked))
    if utility is not None:
        summary.update(_utility_summary(queries_table, utility))
    if leave_one_out is not None:
        summary.update(_leave_one_out_summary(leave_one_out))
    if "true_utility" in documents.columns:
        summary.update(_validity_correlations(queries_table, documents))
    summary.update(_compression_summary(queries_table))
    return {
        "queries": float(queries_table.height),
        "documents": float(documents.height),
        **summary.flat(),
    }
