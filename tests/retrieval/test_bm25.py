"""BM25 (bm25s, numba backend) on the written corpus; save/load and corpus mismatch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from ragutil_dagster.errors import IndexFormatError, IndexMismatchError
from ragutil_dagster.retrieval.bm25 import BM25Config, BM25Retriever
from ragutil_dagster.retrieval.runs import answer_recall, evaluate_run


def test_bm25_finds_the_source_passage_first(bm25_run: pl.DataFrame, world) -> None:
    _, mean = evaluate_run(bm25_run, world.qrels, ["success_1", "recall_10"])
    assert mean["success_1"][0] >= 0.9
    assert mean["recall_10"][0] >= 0.95
    recall = answer_recall(bm25_run, world.corpus, world.answers, ks=(5,))
    assert recall["answer_recall"][0] >= 0.9
    assert bm25_run["retriever"].unique().to_list() == ["bm25"]
    assert (bm25_run["score"] > 0).all()


def test_bm25_save_load_gives_identical_results(
    bm25: BM25Retriever, bm25_run: pl.DataFrame, world, tmp_path: Path
) -> None:
    bm25.save(tmp_path / "bm25")
    manifest = json.loads((tmp_path / "bm25" / "manifest.json").read_text())
    assert manifest["size"] == world.corpus.height
    assert manifest["config"] == {
        "k1": 0.9,
        "b": 0.4,
        "method": "lucene",
        "stopwords": "en",
        "stemmer": "english",
        "include_title": True,
    }
    for mmap in (False, True):
        loaded = BM25Retriever.load(tmp_path / "bm25", corpus=world.corpus, mmap=mmap)
        assert loaded.search(world.queries, k=20).equals(bm25_run)
    bm25.save(tmp_path / "bm25")  # overwriting an index replaces it whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bm25"]


def test_bm25_load_against_another_corpus_fails(bm25: BM25Retriever, world, tmp_path: Path) -> None:
    bm25.save(tmp_path / "bm25")
    edited = world.corpus.with_columns(
        pl.when(pl.int_range(pl.len()) == 5)
        .then(pl.lit("changed"))
        .otherwise(pl.col("text"))
        .alias("text")
    )
    with pytest.raises(IndexMismatchError, match="same size, different ids or texts"):
        BM25Retriever.load(tmp_path / "bm25", corpus=edited)
    with pytest.raises(
        IndexMismatchError, match=f"over {world.corpus.height} passages, given a corpus of 10"
    ):
        BM25Retriever.load(tmp_path / "bm25", corpus=world.corpus.head(10))
    with pytest.raises(IndexFormatError, match="no manifest.json"):
        BM25Retriever.load(tmp_path / "missing")


def test_bm25_options_and_no_match() -> None:
    corpus = pl.DataFrame(
        {
            "id": ["a", "b"],
            "text": ["red apples grow", "green pears grow"],
            "title": ["Fruit", None],
        }
    )
    retriever = BM25Retriever.build(corpus, BM25Config(include_title=False, stemmer=None))
    run = retriever.search(
        pl.DataFrame({"id": ["q1", "q2", "q3"], "text": ["apples", "fruit", "grow"]}), k=5
    )
    assert run.filter(pl.col("query_id") == "q1")["doc_id"].to_list() == ["a"]
    assert run.filter(pl.col("query_id") == "q2").height == 0  # titles not indexed, no shared term
    assert run.filter(pl.col("query_id") == "q3").height == 2


@pytest.mark.slow
def test_importing_the_retrievers_does_not_load_numba() -> None:
    """vLLM 0.32's engine processes are spawned, re-import the calling script's top-level
    imports, and fail at start in a process holding numba's llvmlite library object: a script
    importing the retrievers at its top must still be able to start an in-process engine."""
    probe = (
        "import sys, ragutil_dagster.retrieval.bm25, ragutil_dagster.retrieval.dense, "
        "ragutil_dagster.definitions; print('llvmlite.binding.ffi' in sys.modules)"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300
    ).stdout.split()[-1]
    assert loaded == "False"
