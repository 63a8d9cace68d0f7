"""LLM-specific utility through the asset graph with a generator that reads: the package's shipped
reader of the synthetic world on the CI world, BM25 at k = 1 and eight utility candidates. Unlike
the untrained tiny LM it answers from its passages, so gold utility (eq. 1) is non-empty and the
set and ranking metrics over the candidates have values to check against the tables they come
from."""

from __future__ import annotations

import math

import polars as pl
import pytest

from ragutil_dagster.config import Setting
from ragutil_dagster.embedded import layout
from ragutil_dagster.embedded.shipped import SHIPPED_DIR
from ragutil_dagster.evaluation.transfer import gold_context, gold_sets
from ragutil_dagster.tracking.compare import PartitionScores, build_comparison

CANDIDATES = 8


@pytest.fixture(scope="module")
def reader_run(run_shipped_reader):
    store, _ = run_shipped_reader(
        "utility-home",
        utility={"candidates": CANDIDATES},
        generators=[
            {"name": "reader", "model": str(SHIPPED_DIR / layout.READER)},
            {"name": "copy", "model": str(SHIPPED_DIR / layout.READER)},
        ],
    )
    key = "reader|world__bm25__k1"
    return (
        store,
        key,
        store.read_table("candidate_scores", key),
        store.read_json("metric_scores", key, "summary"),
    )


def _gold(scores: pl.DataFrame) -> dict[str, set[str]]:
    gold: dict[str, set[str]] = {qid: set() for qid in scores["query_id"].unique()}
    for qid, doc in scores.filter(pl.col("gold_utility")).select("query_id", "doc_id").iter_rows():
        gold[qid].add(doc)
    return gold


def test_gold_utility_is_eq_1_over_every_candidate(reader_run) -> None:
    store, key, scores, _ = reader_run
    assert scores["rank"].max() == CANDIDATES
    closed = dict(
        store.read_table("metric_scores", key).select("query_id", "answer_has_closed").iter_rows()
    )
    expected = [
        has and not closed[qid] for qid, has in scores.select("query_id", "answer_has").iter_rows()
    ]
    assert scores["gold_utility"].to_list() == expected
    # Gold passages exist beyond the RAG top k = 1: what the candidates add over the top k.
    assert scores.filter(pl.col("gold_utility") & (pl.col("rank") > 1)).height > 0


def test_likelihood_set_and_ranking_metrics_are_over_the_candidates(reader_run) -> None:
    _, _, scores, summary = reader_run
    gold = _gold(scores)
    scored = scores.filter(pl.col("likelihood").is_not_null())
    with_gold = [q for q in scored["query_id"].unique() if gold[q]]
    precisions, recalls, hits, ndcgs = [], [], [], []
    for qid in with_gold:
        rows = scored.filter(pl.col("query_id") == qid).sort("likelihood", descending=True)
        chosen = set(rows.filter(pl.col("likelihood_selected"))["doc_id"])
        precisions.append(len(chosen & gold[qid]) / len(chosen) if chosen else 0.0)
        recalls.append(len(chosen & gold[qid]) / len(gold[qid]))
        top = rows["doc_id"].to_list()[:5]
        hits.append(len(set(top) & gold[qid]) / len(gold[qid]))
        dcg = sum(1 / math.log2(i + 2) for i, d in enumerate(top) if d in gold[qid])
        ndcgs.append(dcg / sum(1 / math.log2(i + 2) for i in range(min(5, len(gold[qid])))))
    assert (
        summary["n_utility_likelihood_f1"]
        == summary["n_utility_likelihood_recall_at_k"]
        == len(with_gold)
        > 0
    )
    assert summary["utility_likelihood_precision"] == pytest.approx(
        sum(precisions) / len(with_gold)
    )
    assert summary["utility_likelihood_recall"] == pytest.approx(sum(recalls) / len(with_gold))
    assert summary["utility_likelihood_recall_5"] == pytest.approx(sum(hits) / len(with_gold))
    assert summary["utility_likelihood_ndcg_5"] == pytest.approx(sum(ndcgs) / len(with_gold))
    # At k = 1 a ranking cut at k scored Recall@1 = NDCG@1 = 1; over the candidates it does not.
    assert (
        summary["utility_likelihood_recall_5"] < 1.0 and summary["utility_likelihood_ndcg_5"] < 1.0
    )


def test_verbalized_judgments_report_their_parse_failures_and_fall_back(reader_run) -> None:
    store, key, scores, summary = reader_run
    judgments = store.read_table("utility_judgments", key)
    for method, rows in judgments.group_by("method"):
        rate = summary[f"utility_{method[0]}_parse_failure_rate"]
        assert 0.0 <= rate <= 1.0
        assert rate == pytest.approx(rows["unparseable"].sum() / rows["judgments"].sum())
    # The reader was never taught the judgment formats: none of its rankings parses, so each
    # falls back to the retrieval order, and RAG with its top k is RAG with the first candidate.
    ranking = judgments.filter(pl.col("method") == "ranking_answer")  # a default method
    assert ranking.height > 0 and (ranking["unparseable"] == 1).all()
    first = scores.filter(pl.col("rank") == 1)
    assert summary["utility_ranking_answer_rag_has_answer"] == pytest.approx(
        first["answer_has"].mean()
    )
    gold = _gold(scores)
    hits = [
        len(set(docs[:5]) & gold[q]) / len(gold[q])
        for q, docs in ranking.select("query_id", "ranking").iter_rows()
        if gold[q]
    ]
    assert summary["utility_ranking_answer_recall_5"] == pytest.approx(sum(hits) / len(hits))


def test_table_one_reads_each_context_of_the_same_questions(reader_run) -> None:
    store, key, scores, _ = reader_run
    table = store.read_table("utility_transfer", key)
    per_query = store.read_table("metric_scores", key)
    contexts = [
        "none",
        "top_k",
        "candidates",
        "human",
        gold_context("reader"),
        gold_context("copy"),
    ]
    assert (
        table.group_by("query_id").agg("context")["context"].to_list()
        == [contexts] * table["query_id"].n_unique()
    )
    has = {(q, c): h for q, c, h in table.select("query_id", "context", "has_answer").iter_rows()}
    closed = dict(per_query.select("query_id", "answer_has_closed").iter_rows())
    rag = dict(per_query.select("query_id", "answer_has_rag").iter_rows())
    gold = gold_sets(scores)
    assert table["query_id"].n_unique() == len(gold) > 0
    for qid, docs in gold.items():
        assert has[(qid, "none")] == closed[qid] and has[(qid, "top_k")] == rag[qid]
        if not docs:  # no gold passage: no context, the closed-book answer
            assert has[(qid, gold_context("reader"))] == closed[qid]
        elif len(docs) == 1:  # one gold passage: the prompt of that candidate alone, which answered
            assert has[(qid, gold_context("reader"))]
    # Gold passages help the reader over its closed book on the questions that have them.
    assert any(gold.values())
    with_gold = [q for q, docs in gold.items() if docs]
    assert sum(has[(q, gold_context("reader"))] for q in with_gold) > sum(
        closed[q] for q in with_gold
    )


def test_the_same_reader_under_two_names_has_the_same_gold_sets(reader_run) -> None:
    store, key, scores, _ = reader_run
    copy_key = key.replace("reader|", "copy|")
    assert gold_sets(scores) == gold_sets(store.read_table("candidate_scores", copy_key))
    table = store.read_table("utility_transfer", key)
    own, theirs = (table.filter(pl.col("context") == gold_context(g)) for g in ("reader", "copy"))
    assert own.select("query_id", "passages", "has_answer").equals(
        theirs.select("query_id", "passages", "has_answer")
    )
    overlap = store.read_table("utility_transfer", key, "overlap")
    assert overlap["other"].to_list() == ["copy"]
    row = overlap.row(0, named=True)
    assert (
        row["jaccard"] == 1.0 and row["useful_only_to_this"] == row["useful_only_to_other"] == 0.0
    )
    assert (
        row["gold_passages_this"]
        == row["gold_passages_other"]
        == sum(len(d) for d in gold_sets(scores).values())
    )


def test_the_comparison_prints_table_one_and_the_overlap(reader_run) -> None:
    store, key, _, summary = reader_run
    partitions = []
    for generator in ("reader", "copy"):
        partition = key.replace("reader|", f"{generator}|")
        partitions.append(
            PartitionScores(
                setting=Setting("world", "bm25", 1),
                generator=generator,
                summary=summary,
                per_query=store.read_table("metric_scores", partition),
                transfer=store.read_table("utility_transfer", partition),
                overlap=store.read_table("utility_transfer", partition, "overlap"),
            )
        )
    comparison = build_comparison(partitions)
    table_one = comparison.tables["utility_table1"]
    assert table_one["generator"].to_list() == ["copy", "reader"]
    transfer = store.read_table("utility_transfer", key)
    expected = 100 * transfer.filter(pl.col("context") == "human")["has_answer"].mean()
    assert table_one.filter(pl.col("generator") == "reader")["human"].item() == pytest.approx(
        expected
    )
    assert comparison.tables["utility_overlap"].select("generator", "other").rows() == [
        ("copy", "reader"),
        ("reader", "copy"),
    ]
