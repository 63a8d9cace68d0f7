"""Hybrid fusion of BM25 and MiniLM runs, and cross-encoder reranking top-N → k."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ragutil_dagster.data.corpus import indexed_texts
from ragutil_dagster.retrieval.fusion import reciprocal_rank_fusion
from ragutil_dagster.retrieval.rerank import rerank
from ragutil_dagster.retrieval.runs import evaluate_run


def test_hybrid_run_keeps_the_source_passage_on_top(bm25_run, dense_run, world) -> None:
    fused = reciprocal_rank_fusion([bm25_run, dense_run], top=10)
    _, mean = evaluate_run(
        pl.concat([bm25_run, dense_run, fused]), world.qrels, ["success_1", "recall_10"]
    )
    by_retriever = {row["retriever"]: row for row in mean.to_dicts()}
    assert set(by_retriever) == {"bm25", "minilm", "rrf"}
    assert by_retriever["rrf"]["success_1"] >= 0.9
    assert (
        by_retriever["rrf"]["recall_10"]
        >= max(by_retriever["bm25"]["recall_10"], by_retriever["minilm"]["recall_10"]) - 0.01
    )
    # Every fused passage was retrieved by at least one of the inputs.
    inputs = set(zip(bm25_run["query_id"], bm25_run["doc_id"])) | set(
        zip(dense_run["query_id"], dense_run["doc_id"])
    )
    assert set(zip(fused["query_id"], fused["doc_id"])) <= inputs


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory):
    from ragutil_dagster.models.rerank import CrossEncoderReranker
    from ragutil_dagster.testing.tiny import build_cross_encoder

    directory: Path = build_cross_encoder(tmp_path_factory.mktemp("models") / "cross-encoder")
    return CrossEncoderReranker(str(directory), device="cpu", show_progress=False)


def test_rerank_orders_top_n_by_cross_encoder_scores(cross_encoder, bm25_run, world) -> None:
    some = world.queries.head(6)
    first_stage = bm25_run.filter(pl.col("query_id").is_in(some["id"].implode()))
    reranked = rerank(first_stage, some, world.corpus, cross_encoder, top_n=8, k=3)
    assert reranked["retriever"].unique().to_list() == ["bm25+rerank"]
    assert reranked.group_by("query_id").len()["len"].to_list() == [3] * 6
    texts = dict(zip(world.corpus["id"], indexed_texts(world.corpus)))
    for query_id, question in some.iter_rows():
        candidates = first_stage.filter((pl.col("query_id") == query_id) & (pl.col("rank") <= 8))[
            "doc_id"
        ].to_list()
        scores = cross_encoder.score(question, [texts[doc] for doc in candidates])
        expected = [candidates[i] for i in np.argsort(-scores, kind="stable")[:3]]
        mine = reranked.filter(pl.col("query_id") == query_id).sort("rank")
        assert mine["doc_id"].to_list() == expected
        np.testing.assert_allclose(mine["score"].to_numpy(), np.sort(scores)[::-1][:3], rtol=1e-5)


def test_rerank_checks_its_inputs(cross_encoder, bm25_run, world) -> None:
    with pytest.raises(ValueError, match="1 <= k <= top_n"):
        rerank(bm25_run, world.queries, world.corpus, cross_encoder, top_n=5, k=6)
    with pytest.raises(ValueError, match="query_id absent from the queries"):
        rerank(bm25_run, world.queries.head(1), world.corpus, cross_encoder, top_n=2, k=1)
    with pytest.raises(ValueError, match="doc_id absent from the passages"):
        rerank(bm25_run.head(3), world.queries, world.corpus.tail(5), cross_encoder, top_n=2, k=1)
