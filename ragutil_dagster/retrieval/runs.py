"""Retrieval runs as polars tables, TREC run files, and IR evaluation of runs.

Run table schema (one row per retrieved passage):
``query_id`` (String), ``rank`` (Int32, 1-based, contiguous within a query and retriever),
``doc_id`` (String), ``score`` (Float64, higher is better), ``retriever`` (String, a tag such as
``"bm25"`` or ``"e5+bge-reranker"``; one table may hold several retrievers).

The IR measures themselves live in :mod:`ragutil_dagster.metrics.ranking`; this module only
turns tables into its inputs and its outputs back into tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import polars as pl

from ragutil_dagster.data.run_files import read_trec_rows
from ragutil_dagster.infra.files import atomic_write
from ragutil_dagster.metrics.answers import Golds
from ragutil_dagster.metrics.mirage import retriever_metrics
from ragutil_dagster.metrics.ranking import answer_hits_at_k, ir_measures, ranks_to_run
from ragutil_dagster.tables import MIRAGE_RETRIEVAL_SCHEMA, RUN_SCHEMA

DEFAULT_MEASURES: tuple[str, ...] = (
    "recall_1",
    "recall_5",
    "recall_10",
    "ndcg_cut_5",
    "ndcg_cut_10",
    "recip_rank",
    "map",
)


def run_from_arrays(
    query_ids: Sequence[str],
    doc_ids: Sequence[Sequence[str]],
    scores: Sequence[Sequence[float]] | np.ndarray,
    retriever: str,
) -> pl.DataFrame:
    """Build a run table from per-query ranked doc ids and scores (best first).

    Rows may have different lengths (a query can have fewer hits than k).
    """
    if not (len(query_ids) == len(doc_ids) == len(scores)):
        raise ValueError(
            f"{len(query_ids)} query ids, {len(doc_ids)} doc-id lists and {len(scores)} score lists must pair up"
        )
    lengths = np.fromiter((len(docs) for docs in doc_ids), dtype=np.int64, count=len(doc_ids))
    for position, (docs, values) in enumerate(zip(doc_ids, scores)):
        if len(docs) != len(values):
            raise ValueError(
                f"query {query_ids[position]!r}: {len(docs)} doc ids but {len(values)} scores"
            )
    flat_docs = [doc for docs in doc_ids for doc in docs]
    flat_scores = (
        np.concatenate([np.asarray(values, dtype=np.float64) for values in scores])
        if flat_docs
        else []
    )
    ranks = (
        np.concatenate([np.arange(1, n + 1, dtype=np.int32) for n in lengths]) if flat_docs else []
    )
    return pl.DataFrame(
        {
            "query_id": np.repeat(np.asarray(query_ids, dtype=object), lengths).tolist(),
            "rank": ranks,
            "doc_id": flat_docs,
            "score": flat_scores,
            "retriever": [retriever] * len(flat_docs),
        },
        schema=RUN_SCHEMA,
    )


def run_from_matrix(
    query_ids: Sequence[str],
    doc_ids: pl.Series,
    positions: np.ndarray,
    scores: np.ndarray,
    keep: np.ndarray,
    retriever: str,
) -> pl.DataFrame:
    """Build a run table from a search engine's ``(queries, k)`` result matrices, best first per
    row: ``positions`` index into ``doc_ids``; entries where ``keep`` is false (no hit, zero
    score) are dropped and the remaining ones ranked 1, 2, ... in row order. Vectorised, so
    large corpora cost no per-passage Python work."""
    keep = np.asarray(keep, dtype=bool)
    if not (positions.shape == scores.shape == keep.shape and positions.shape[0] == len(query_ids)):
        raise ValueError(
            f"result matrices {positions.shape}, {scores.shape}, {keep.shape} do not match {len(query_ids)} queries"
        )
    rows = np.repeat(np.arange(len(query_ids)), keep.sum(axis=1))
    return pl.DataFrame(
        {
            "query_id": pl.Series(list(query_ids), dtype=pl.String()).gather(rows),
            "rank": np.cumsum(keep, axis=1, dtype=np.int32)[keep],
            "doc_id": doc_ids.gather(positions[keep]),
            "score": scores[keep].astype(np.float64),
            "retriever": pl.repeat(retriever, len(rows), dtype=pl.String(), eager=True),
        },
        schema=RUN_SCHEMA,
    )


def validate_run(run: pl.DataFrame) -> pl.DataFrame:
    """Check a run table's columns, types and ranks; returns it in column order."""
    missing = [column for column in RUN_SCHEMA if column not in run.columns]
    if missing:
        raise ValueError(f"run table lacks columns {missing}; expected {list(RUN_SCHEMA)}")
    run = run.select(list(RUN_SCHEMA)).cast(RUN_SCHEMA)  # type: ignore[arg-type]
    bad = (
        run.group_by("retriever", "query_id")
        .agg(
            (pl.col("rank").sort() == pl.int_range(1, pl.len() + 1)).all().alias("contiguous"),
            pl.col("doc_id").n_unique().alias("unique_docs"),
            pl.len().alias("rows"),
        )
        .filter(~pl.col("contiguous") | (pl.col("unique_docs") != pl.col("rows")))
    )
    if bad.height:
        row = bad.row(0, named=True)
        raise ValueError(
            f"run table: retriever {row['retriever']!r}, query {row['query_id']!r} has ranks that are not "
            "1..n or repeats a doc id"
        )
    return run


def top_k(run: pl.DataFrame, k: int) -> pl.DataFrame:
    """Keep ranks 1..k of every query."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    return run.filter(pl.col("rank") <= k)


def _ranked_lists(run: pl.DataFrame) -> dict[str, list[str]]:
    grouped = run.sort("query_id", "rank").group_by("query_id", maintain_order=True).agg("doc_id")
    return dict(zip(grouped["query_id"].to_list(), grouped["doc_id"].to_list()))


def run_to_dict(run: pl.DataFrame) -> dict[str, dict[str, float]]:
    """The run in pytrec_eval's form. Scores are replaced by rank-derived ones so that trec_eval
    (which orders ties by doc id) sees exactly the table's order."""
    if run["retriever"].n_unique() > 1:
        raise ValueError("run table holds several retrievers; select one first")
    return ranks_to_run(_ranked_lists(run))


def qrels_to_dict(qrels: pl.DataFrame) -> dict[str, dict[str, int]]:
    """Qrels table (``query_id, doc_id, relevance``) in pytrec_eval's nested-dict form."""
    nested: dict[str, dict[str, int]] = {}
    for query_id, doc_id, relevance in qrels.select("query_id", "doc_id", "relevance").iter_rows():
        nested.setdefault(query_id, {})[doc_id] = int(relevance)
    return nested


def evaluate_run(
    run: pl.DataFrame, qrels: pl.DataFrame, measures: Sequence[str] = DEFAULT_MEASURES
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """IR measures (pytrec_eval names: ``recall_10``, ``ndcg_cut_10``, ``recip_rank``, ``map``...)
    of each retriever in ``run`` against ``qrels``.

    Returns ``(per_query, mean)``: ``per_query`` has ``retriever, query_id`` and one column per
    measure; ``mean`` has one row per retriever. Judged queries missing from a run score 0.
    """
    run = validate_run(run)
    judged = qrels_to_dict(qrels)
    per_query_tables: list[pl.DataFrame] = []
    mean_rows: list[dict[str, float | str]] = []
    for (retriever,), part in run.group_by("retriever", maintain_order=True):
        per_query, mean = ir_measures(run_to_dict(part), judged, measures)
        per_query_tables.append(
            pl.DataFrame(
                [
                    {"retriever": retriever, "query_id": qid, **scores}
                    for qid, scores in per_query.items()
                ]
            )
        )
        mean_rows.append({"retriever": retriever, **mean})
    return pl.concat(per_query_tables), pl.DataFrame(mean_rows)


def mirage_retrieval(run: pl.DataFrame, qrels: pl.DataFrame, k: int) -> pl.DataFrame:
    """MIRAGE Table 2: precision, recall, F1 and NDCG@k of each retriever in ``run`` against the
    positives (relevance > 0) of ``qrels`` — both NDCG variants of
    :func:`~ragutil_dagster.metrics.mirage.retriever_metrics` (``ndcg``: ideal from the query's
    positives; ``ndcg_retrieved``: ideal from the retrieved list's labels, MIRAGE's code). A
    setting's run holds its top k only, so for 1 < k < 5 ``ndcg_retrieved`` is what MIRAGE's code
    gives retrieving k (``top_k: k``), not Table 2's Top-k column, scored within a top 5.

    Each column is the mean over the queries with a positive of the per-query value; F1 too is
    a per-query mean, as in Table 2, whose F1 is not the harmonic mean of its P and R columns
    (BGE-S, Top-1: 63.03, against 64.25 from P = 67.87, R = 60.99). A judged query the run
    misses scores 0. One row per retriever (``MIRAGE_RETRIEVAL_SCHEMA``); no row when no query
    has a positive, as recall and NDCG are then undefined.
    """
    run = validate_run(run)
    positives = qrels_to_dict(qrels.filter(pl.col("relevance") > 0))
    rows = []
    if not positives:
        return pl.DataFrame(rows, schema=MIRAGE_RETRIEVAL_SCHEMA)
    for (retriever,), part in run.group_by("retriever", maintain_order=True):
        ranked = _ranked_lists(part)
        scores = [
            (
                retriever_metrics(ranked.get(qid, []), set(docs), k),
                retriever_metrics(ranked.get(qid, []), set(docs), k, ndcg="mirage").ndcg,
            )
            for qid, docs in positives.items()
        ]
        rows.append(
            {
                "retriever": retriever,
                "k": k,
                "queries": len(scores),
                "precision": float(np.mean([s.precision for s, _ in scores])),
                "recall": float(np.mean([s.recall for s, _ in scores])),
                "f1": float(np.mean([s.f1 for s, _ in scores])),
                "ndcg": float(np.mean([s.ndcg for s, _ in scores])),
                "ndcg_retrieved": float(np.mean([ndcg for _, ndcg in scores])),
            }
        )
    return pl.DataFrame(rows, schema=MIRAGE_RETRIEVAL_SCHEMA)


def answer_recall(
    run: pl.DataFrame,
    passages: pl.DataFrame,
    answers: Mapping[str, Golds],
    ks: Sequence[int] = (1, 5, 10, 20),
) -> pl.DataFrame:
    """Answer recall@k (DPR / FlashRAG top-k accuracy): the share of queries whose top-k passages
    contain a gold answer (DPR ``has_answer``), per retriever and k.

    ``answers`` maps every query id to its gold answers; ``passages`` supplies the texts.
    Queries with answers but no retrieved passage count as misses.
    """
    run = validate_run(run)
    texts = dict(zip(passages["id"].to_list(), passages["text"].to_list()))
    unknown = run.filter(~pl.col("doc_id").is_in(passages["id"].implode()))
    if unknown.height:
        raise ValueError(
            f"run names doc ids absent from the passages, e.g. {unknown['doc_id'][0]!r}"
        )
    query_ids = list(answers)
    rows: list[dict[str, float | str | int]] = []
    for (retriever,), part in run.group_by("retriever", maintain_order=True):
        ranked = _ranked_lists(part)
        ranked_texts = [[texts[doc] for doc in ranked.get(qid, [])] for qid in query_ids]
        golds = [answers[qid] for qid in query_ids]
        for k in ks:
            hits = answer_hits_at_k(ranked_texts, golds, k)
            rows.append({"retriever": retriever, "k": k, "answer_recall": float(hits.mean())})
    return pl.DataFrame(rows)


def write_trec(run: pl.DataFrame, path: str | Path, tag: str | None = None) -> None:
    """Write a TREC run file (``qid Q0 docid rank score tag``), atomically.

    ``tag`` defaults to the run's ``retriever`` column. Ids and tags must not contain whitespace.
    """
    run = validate_run(run).sort("retriever", "query_id", "rank")
    if tag is not None:
        run = run.with_columns(pl.lit(tag).alias("retriever"))
    for column in ("query_id", "doc_id", "retriever"):
        spaced = run.filter(pl.col(column).str.contains(r"\s"))
        if spaced.height:
            raise ValueError(
                f"TREC run files cannot hold {column} values with whitespace: {spaced[column][0]!r}"
            )
    lines = run.select(
        pl.format(
            "{} Q0 {} {} {} {}",
            "query_id",
            "doc_id",
            "rank",
            pl.col("score").cast(pl.String()),
            "retriever",
        )
    ).to_series()

    def write(temporary: Path) -> None:
        temporary.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")

    atomic_write(path, write)


def read_trec(path: str | Path) -> pl.DataFrame:
    """Read a TREC run file into a run table (the tag becomes ``retriever``), its ranks as written."""
    rows = read_trec_rows(Path(path))
    return validate_run(
        rows.select("query_id", "rank", "doc_id", "score", pl.col("tag").alias("retriever"))
    )


def passages_to_documents(run: pl.DataFrame, passages: pl.DataFrame) -> pl.DataFrame:
    """Turn a passage-level run into a document-level one (MaxP: a document takes the score and
    position of its best passage), for judging chunked corpora against document-level qrels such
    as BEIR's. ``passages`` must carry ``doc_id`` (see :mod:`~ragutil_dagster.data.chunking`).
    """
    if "doc_id" not in passages.columns:
        raise ValueError("passages lack a doc_id column: only chunked corpora map to documents")
    run = validate_run(run)
    mapping = passages.select(pl.col("id").alias("passage_id"), pl.col("doc_id").alias("source"))
    joined = run.rename({"doc_id": "passage_id"}).join(mapping, on="passage_id", how="left")
    unknown = joined.filter(pl.col("source").is_null())
    if unknown.height:
        raise ValueError(
            f"run names passage ids absent from the passages, e.g. {unknown['passage_id'][0]!r}"
        )
    return (
        joined.sort("retriever", "query_id", "rank")
        .unique(["retriever", "query_id", "source"], keep="first", maintain_order=True)
        .with_columns(
            pl.int_range(1, pl.len() + 1, dtype=pl.Int32)
            .over("retriever", "query_id")
            .alias("rank")
        )
        .select("query_id", "rank", pl.col("source").alias("doc_id"), "score", "retriever")
    )
