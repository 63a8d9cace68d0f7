"""Run tables, TREC run files, IR evaluation and reciprocal rank fusion."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest

from ragutil_dagster.retrieval.fusion import reciprocal_rank_fusion
from ragutil_dagster.retrieval.runs import (
    answer_recall,
    evaluate_run,
    mirage_retrieval,
    passages_to_documents,
    read_trec,
    run_from_arrays,
    top_k,
    validate_run,
    write_trec,
)


@pytest.fixture()
def run() -> pl.DataFrame:
    return run_from_arrays(
        ["q1", "q2", "q3"],
        [["a", "b", "c"], ["c", "a"], []],
        [[3.5, 2.0, 0.25], [1.0, 1.0], []],
        "bm25",
    )


def test_run_table_rows_and_validation(run: pl.DataFrame) -> None:
    assert run.rows() == [
        ("q1", 1, "a", 3.5, "bm25"),
        ("q1", 2, "b", 2.0, "bm25"),
        ("q1", 3, "c", 0.25, "bm25"),
        ("q2", 1, "c", 1.0, "bm25"),
        ("q2", 2, "a", 1.0, "bm25"),
    ]
    assert top_k(run, 1)["doc_id"].to_list() == ["a", "c"]
    with pytest.raises(ValueError, match="query 'q1' has ranks that are not 1..n"):
        validate_run(
            run.with_columns(
                pl.when(pl.col("rank") == 3).then(5).otherwise(pl.col("rank")).alias("rank")
            )
        )
    with pytest.raises(ValueError, match="repeats a doc id"):
        validate_run(run.with_columns(pl.lit("a").alias("doc_id")))
    with pytest.raises(ValueError, match="lacks columns"):
        validate_run(run.drop("score"))


def test_trec_round_trip(run: pl.DataFrame, tmp_path: Path) -> None:
    path = tmp_path / "run.trec"
    write_trec(run, path)
    assert path.read_text().splitlines()[:2] == ["q1 Q0 a 1 3.5 bm25", "q1 Q0 b 2 2.0 bm25"]
    assert read_trec(path).equals(run)
    write_trec(run, path, tag="mine")
    assert read_trec(path)["retriever"].unique().to_list() == ["mine"]
    with pytest.raises(ValueError, match="whitespace"):
        write_trec(
            run.with_columns(pl.format("doc {}", "doc_id").alias("doc_id")), tmp_path / "bad.trec"
        )
    assert not (tmp_path / "bad.trec").exists()


def test_evaluation_follows_table_order_and_definitions(run: pl.DataFrame) -> None:
    qrels = pl.DataFrame(
        {
            "query_id": ["q1", "q1", "q2", "q4"],
            "doc_id": ["b", "c", "a", "z"],
            "relevance": [1, 1, 1, 1],
        }
    )
    other = run.with_columns(pl.lit("dense").alias("retriever"))
    per_query, mean = evaluate_run(
        pl.concat([run, other]), qrels, ["recip_rank", "recall_2", "ndcg_cut_3", "map"]
    )
    bm25 = {
        row["query_id"]: row for row in per_query.filter(pl.col("retriever") == "bm25").to_dicts()
    }
    # q2 ties at score 1.0: the table's order (c then a) must decide, not trec_eval's doc-id tie-break.
    assert bm25["q2"]["recip_rank"] == 0.5
    assert bm25["q1"]["recip_rank"] == 0.5
    assert bm25["q1"]["recall_2"] == 0.5
    ideal = 1 + 1 / math.log2(3)
    assert bm25["q1"]["ndcg_cut_3"] == pytest.approx((1 / math.log2(3) + 1 / math.log2(4)) / ideal)
    assert bm25["q1"]["map"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert bm25["q4"]["recip_rank"] == 0.0  # judged but never retrieved counts as 0
    assert "q3" not in bm25  # retrieved but unjudged is not evaluated
    assert mean["retriever"].to_list() == ["bm25", "dense"]
    assert mean.row(0, named=True)["recip_rank"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)


def test_answer_recall_uses_dpr_has_answer(run: pl.DataFrame) -> None:
    passages = pl.DataFrame(
        {
            "id": ["a", "b", "c"],
            "text": ["Paris is big.", "The Eiffel Tower, Paris", "Lyon's river"],
            "title": [None] * 3,
        }
    )
    answers = {"q1": ["Eiffel tower"], "q2": ["lyon"], "q3": ["Paris"]}
    recall = answer_recall(run, passages, answers, ks=(1, 2))
    assert recall.rows() == [("bm25", 1, pytest.approx(1 / 3)), ("bm25", 2, pytest.approx(2 / 3))]


def test_reciprocal_rank_fusion_scores() -> None:
    lexical = run_from_arrays(["q"], [["x", "y", "z"]], [[9.0, 5.0, 1.0]], "bm25")
    dense = run_from_arrays(["q"], [["z", "y"]], [[0.9, 0.8]], "dense")
    fused = reciprocal_rank_fusion([lexical, dense], k=60)
    expected = {"x": 1 / 61, "y": 1 / 62 + 1 / 62, "z": 1 / 63 + 1 / 61}
    assert fused["doc_id"].to_list() == sorted(expected, key=expected.get, reverse=True)
    assert dict(zip(fused["doc_id"], fused["score"])) == pytest.approx(expected)
    assert fused["rank"].to_list() == [1, 2, 3]
    shallow = reciprocal_rank_fusion(pl.concat([lexical, dense]), k=60, depth=1, top=1)
    assert shallow.rows() == [("q", 1, "x", pytest.approx(1 / 61), "rrf")]


def test_passage_runs_map_to_documents_by_best_passage() -> None:
    passages = pl.DataFrame(
        {
            "id": ["d1#0", "d1#1", "d2#0", "d3#0"],
            "text": ["a", "b", "c", "d"],
            "doc_id": ["d1", "d1", "d2", "d3"],
        }
    )
    run = run_from_arrays(["q"], [["d1#1", "d2#0", "d1#0", "d3#0"]], [[0.9, 0.8, 0.7, 0.1]], "bm25")
    documents = passages_to_documents(run, passages)
    assert documents.rows() == [
        ("q", 1, "d1", 0.9, "bm25"),
        ("q", 2, "d2", 0.8, "bm25"),
        ("q", 3, "d3", 0.1, "bm25"),
    ]
    with pytest.raises(ValueError, match="absent from the passages, e.g. 'd1#1'"):
        passages_to_documents(run, passages.tail(2))
    with pytest.raises(ValueError, match="lack a doc_id"):
        passages_to_documents(run, passages.drop("doc_id"))


def test_mirage_retrieval_by_hand() -> None:
    run = run_from_arrays(
        ["q1", "q2"], [["a", "b", "c"], ["d", "e", "f"]], [[3, 2, 1], [3, 2, 1]], "bm25"
    )
    qrels = pl.DataFrame(
        {
            "query_id": ["q1", "q1", "q2", "q3", "q4"],
            "doc_id": ["b", "z", "f", "x", "y"],
            "relevance": [1, 1, 1, 1, 0],
        }
    )
    # q1: b at rank 2 of positives {b, z}; q2: f at rank 3; q3 not retrieved (0); q4 no positive.
    row = mirage_retrieval(run, qrels, 3).row(0, named=True)
    inv = 1 / math.log2(3)
    assert row["queries"] == 3
    assert row["precision"] == pytest.approx((1 / 3 + 1 / 3 + 0) / 3)
    assert row["recall"] == pytest.approx((1 / 2 + 1 + 0) / 3)
    assert row["f1"] == pytest.approx((0.4 + 0.5 + 0) / 3)  # mean of per-query F1 (Table 2)
    assert row["ndcg"] == pytest.approx((inv / (1 + inv) + 0.5 + 0) / 3)
    assert row["ndcg_retrieved"] == pytest.approx(
        (inv + 0.5 + 0) / 3
    )  # ideal from the list's labels
    no_positive = qrels.with_columns(pl.lit(0).alias("relevance"))
    assert mirage_retrieval(run, no_positive, 3).is_empty()
