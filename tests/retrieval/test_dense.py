"""Dense retrieval: MiniLM + FAISS on the written corpus, index options, save/load, mismatches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ragutil_dagster.data.corpus import corpus_fingerprint
from ragutil_dagster.errors import IndexMismatchError
from ragutil_dagster.retrieval.dense import (
    DenseConfig,
    DenseRetriever,
    FaissIndexSpec,
    embed_corpus,
    gpu_available,
)
from ragutil_dagster.retrieval.runs import evaluate_run

from .conftest import HashEncoder


def test_minilm_finds_the_source_passage_first(dense_run: pl.DataFrame, world) -> None:
    _, mean = evaluate_run(dense_run, world.qrels, ["success_1", "recall_10"])
    assert mean["success_1"][0] >= 0.9
    assert mean["recall_10"][0] >= 0.95
    # Normalised embeddings under inner product: scores are cosines, best first.
    assert dense_run["score"].max() <= 1.0 + 1e-5
    first = dense_run.filter(pl.col("query_id") == "q000")["score"].to_numpy()
    assert np.all(np.diff(first) <= 0)


def test_dense_save_load_identical_and_manifest(
    dense: DenseRetriever, dense_run: pl.DataFrame, world, minilm, tmp_path: Path
) -> None:
    dense.save(tmp_path / "dense")
    manifest = json.loads((tmp_path / "dense" / "manifest.json").read_text())
    assert (manifest["dim"], manifest["metric"], manifest["size"]) == (
        384,
        "ip",
        world.corpus.height,
    )
    assert manifest["encoder_identity"] == minilm.identity
    assert manifest["corpus_fingerprint"] == corpus_fingerprint(world.corpus)
    assert manifest["config"]["index"]["kind"] == "flat"
    loaded = DenseRetriever.load(tmp_path / "dense", minilm, corpus=world.corpus)
    assert isinstance(loaded.embeddings, np.memmap)
    assert loaded.search(world.queries, k=20, name="minilm").equals(dense_run)


def test_dense_load_with_other_model_or_corpus_fails(
    dense: DenseRetriever, world, tmp_path: Path
) -> None:
    dense.save(tmp_path / "dense")
    with pytest.raises(
        IndexMismatchError, match="index built with encoder .* given encoder other-model"
    ):
        DenseRetriever.load(tmp_path / "dense", HashEncoder(dim=384, identity="other-model"))
    with pytest.raises(IndexMismatchError, match="different ids or texts"):
        DenseRetriever.load(tmp_path / "dense", None, corpus=world.corpus.reverse())
    vectors_only = DenseRetriever.load(tmp_path / "dense", None)
    with pytest.raises(ValueError, match="loaded without an encoder"):
        vectors_only.search(world.queries)
    first = vectors_only.search_vectors(["x"], np.asarray(dense.embeddings[:1]), k=1)
    assert first["doc_id"].to_list() == [world.corpus["id"][0]]


@pytest.fixture(scope="module")
def random_index() -> tuple[DenseRetriever, np.ndarray]:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((3000, 32)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = vectors[:50] + 0.3 * rng.standard_normal((50, 32)).astype(np.float32)
    ids = [f"p{i}" for i in range(len(vectors))]
    flat = DenseRetriever.from_embeddings(
        ids, vectors, "random", "sha256:none", DenseConfig(device="cpu")
    )
    return flat, queries


def _overlap(run: pl.DataFrame, reference: pl.DataFrame) -> float:
    pairs = set(zip(run["query_id"], run["doc_id"]))
    return len(pairs & set(zip(reference["query_id"], reference["doc_id"]))) / reference.height


@pytest.mark.parametrize(
    ("spec", "minimum_overlap"),
    [
        (FaissIndexSpec(kind="ivf", nlist=16, nprobe=16), 1.0),  # every list probed: exact
        (FaissIndexSpec(kind="ivf", nlist=16, nprobe=4), 0.6),
        (FaissIndexSpec(kind="hnsw", hnsw_m=16, ef_search=64), 0.9),
        (FaissIndexSpec(kind="ivfpq", nlist=16, nprobe=16, pq_m=8), 0.3),
        (FaissIndexSpec(kind="ivfpq", nlist=16, nprobe=16, pq_m=8, rescore=100), 0.9),
    ],
)
def test_approximate_indexes_against_flat(
    random_index: tuple[DenseRetriever, np.ndarray], spec: FaissIndexSpec, minimum_overlap: float
) -> None:
    flat, queries = random_index
    query_ids = [f"q{i}" for i in range(len(queries))]
    exact = flat.search_vectors(query_ids, queries, k=10)
    approximate = flat.with_index(spec)
    assert approximate.index.ntotal == len(flat)
    assert approximate.embeddings is flat.embeddings  # re-indexed, not re-embedded
    assert _overlap(approximate.search_vectors(query_ids, queries, k=10), exact) >= minimum_overlap


def test_ivf_index_round_trips_its_parameters(random_index, tmp_path: Path) -> None:
    flat, queries = random_index
    ivf = flat.with_index(FaissIndexSpec(kind="ivf", nlist=16, nprobe=3))
    ivf.save(tmp_path / "ivf")
    loaded = DenseRetriever.load(tmp_path / "ivf", None, device="cpu")
    assert loaded.config.index == ivf.config.index
    query_ids = [f"q{i}" for i in range(len(queries))]
    assert loaded.search_vectors(query_ids, queries, 10).equals(
        ivf.search_vectors(query_ids, queries, 10)
    )


def test_index_option_errors(random_index, world, hash_encoder) -> None:
    flat, _ = random_index
    with pytest.raises(ValueError, match="pq_m to divide the dimension"):
        flat.with_index(FaissIndexSpec(kind="ivfpq", nlist=16, pq_m=7))
    with pytest.raises(ValueError, match="needs at least that many vectors"):
        DenseRetriever.build(
            world.corpus.head(20),
            hash_encoder,
            DenseConfig(index=FaissIndexSpec(kind="ivf", nlist=64)),
        )
    if not gpu_available():
        with pytest.raises(RuntimeError, match="device='cuda'"):
            DenseRetriever.build(world.corpus.head(20), hash_encoder, DenseConfig(device="cuda"))


def test_embeddings_stream_to_a_memory_mapped_file(world, hash_encoder, tmp_path: Path) -> None:
    config = DenseConfig(block_size=64, passage_prefix="passage: ")
    mapped = embed_corpus(world.corpus, hash_encoder, config, tmp_path / "emb.npy")
    assert isinstance(mapped, np.memmap) and mapped.shape == (world.corpus.height, hash_encoder.dim)
    in_memory = embed_corpus(world.corpus, hash_encoder, config)
    np.testing.assert_array_equal(np.asarray(mapped), in_memory)
    expected = hash_encoder.encode(
        [f"passage: {world.corpus['title'][0]}\n{world.corpus['text'][0]}"]
    )
    np.testing.assert_array_equal(in_memory[:1], expected)


@pytest.mark.gpu
@pytest.mark.parametrize("gpus", ["one", "replicas", "shards"])
@pytest.mark.parametrize(
    "spec", [FaissIndexSpec(), FaissIndexSpec(kind="ivfpq", nlist=16, nprobe=16, pq_m=8)]
)
def test_gpu_index_matches_cpu(
    random_index, spec: FaissIndexSpec, gpus: str, tmp_path: Path
) -> None:
    """GPU 0 alone, or replicas / shards over every GPU (one GPU is enough to run them)."""
    if not gpu_available():
        pytest.skip("needs faiss with GPU support and a CUDA device")
    flat, queries = random_index
    query_ids = [f"q{i}" for i in range(len(queries))]
    cpu = flat.with_index(spec)
    gpu = DenseRetriever.from_embeddings(
        flat.ids, flat.embeddings, "random", "", DenseConfig(index=spec, device="cuda", gpus=gpus)
    )
    exact = flat.search_vectors(query_ids, queries, 10)
    expected = _overlap(cpu.search_vectors(query_ids, queries, 10), exact)
    assert _overlap(gpu.search_vectors(query_ids, queries, 10), exact) >= expected - 0.05
    gpu.save(tmp_path / "gpu")
    # Saved from the GPUs, it loads on the CPU, or spread over them again.
    reloaded = DenseRetriever.load(
        tmp_path / "gpu", None, device="cpu" if gpus == "one" else "cuda", gpus=gpus
    )
    assert _overlap(reloaded.search_vectors(query_ids, queries, 10), exact) >= expected - 0.05


def test_a_corpus_record_checks_an_index_without_hashing_the_corpus(
    dense: DenseRetriever, world, minilm, tmp_path: Path, monkeypatch
) -> None:
    """The corpus asset writes its record (fingerprint, rows) once; loading an index against
    that record reads no passage and hashes nothing."""
    from ragutil_dagster.data.corpus import corpus_record
    from ragutil_dagster.retrieval import io

    dense.save(tmp_path / "dense")
    record = corpus_record(world.corpus)

    def no_hashing(corpus):
        raise AssertionError("the corpus was hashed again")

    monkeypatch.setattr(io, "corpus_fingerprint", no_hashing)
    assert len(DenseRetriever.load(tmp_path / "dense", minilm, record)) == world.corpus.height
    with pytest.raises(IndexMismatchError, match="given corpus sha256:0+ "):
        DenseRetriever.load(
            tmp_path / "dense", None, {**record, "fingerprint": "sha256:" + "0" * 64}
        )
    with pytest.raises(IndexMismatchError, match="given a corpus of 3"):
        DenseRetriever.load(tmp_path / "dense", None, {**record, "rows": 3})


def test_gpu_layouts_say_what_is_missing(random_index, world, hash_encoder) -> None:
    flat, _ = random_index
    with pytest.raises(ValueError, match="gpus='shards' .* device='cpu'"):
        DenseRetriever.from_embeddings(
            flat.ids, flat.embeddings, "random", "", DenseConfig(device="cpu", gpus="shards")
        )
    with pytest.raises(ValueError, match="FAISS has no GPU HNSW"):
        DenseRetriever.from_embeddings(
            flat.ids,
            flat.embeddings,
            "random",
            "",
            DenseConfig(index=FaissIndexSpec(kind="hnsw"), gpus="replicas"),
        )
    if not gpu_available():
        with pytest.raises(RuntimeError, match="gpus='replicas' but faiss has no GPU support"):
            DenseRetriever.build(world.corpus.head(20), hash_encoder, DenseConfig(gpus="replicas"))
