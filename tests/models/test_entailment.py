"""Entailment: label reordering from id2label, dedup, on-disk cache, and use by metrics.seper."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from ragutil_dagster.models.entailment import Entailment, nli_label_order
from ragutil_dagster.testing.tiny import TINY_NLI_LABELS

PREMISES = ["the cat sat on the mat", "paris is in france", "the cat sat on the mat", "water boils"]
HYPOTHESES = ["an animal sat", "paris is in germany", "an animal sat", "water is hot"]


@pytest.fixture()
def nli(tiny_models, tmp_path: Path) -> Entailment:
    return Entailment(
        str(tiny_models.nli),
        device="cpu",
        dtype="float32",  # compared with the float32 forward pass below
        batch_size=2,
        cache=tmp_path / "nli.sqlite",
        show_progress=False,
    )


def test_probabilities_match_model_forward_after_reordering(nli: Entailment, tiny_models) -> None:
    got = nli(PREMISES, HYPOTHESES)
    tok = AutoTokenizer.from_pretrained(tiny_models.nli)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_models.nli).eval()
    with torch.no_grad():
        logits = model(**tok(PREMISES, HYPOTHESES, padding=True, return_tensors="pt")).logits
    probs = torch.softmax(logits, -1).numpy()
    by_name = {name: probs[:, i] for i, name in TINY_NLI_LABELS.items()}
    expected = np.stack(
        [by_name["contradiction"], by_name["neutral"], by_name["entailment"]], axis=1
    )
    assert got.shape == (4, 3)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert not np.allclose(got, probs, atol=1e-3)  # the reordering really moved columns


def test_duplicates_computed_once_and_cache_reused(
    nli: Entailment, tiny_models, monkeypatch
) -> None:
    seen: list[int] = []
    original = nli._predict

    def counting(premises, hypotheses):
        seen.append(len(premises))
        return original(premises, hypotheses)

    monkeypatch.setattr(nli, "_predict", counting)
    first = nli(PREMISES, HYPOTHESES)
    assert seen == [3]  # 4 pairs, one duplicated
    np.testing.assert_array_equal(first[0], first[2])
    # A new instance (say, another process) on the same cache file runs no pair through the model.
    again = Entailment(
        str(tiny_models.nli),
        device="cpu",
        dtype="float32",
        cache=nli.cache.path,
        show_progress=False,
    )
    monkeypatch.setattr(again, "_predict", lambda *_: pytest.fail("cached pairs were recomputed"))
    np.testing.assert_array_equal(again(PREMISES[::-1], HYPOTHESES[::-1]), first[::-1])
    assert (again.stats.pairs, again.stats.unique_pairs, again.stats.cache_hits) == (4, 3, 3)


def test_damaged_cache_rows_are_recomputed(nli: Entailment) -> None:
    first = nli(PREMISES[:1], HYPOTHESES[:1])
    with sqlite3.connect(nli.cache.path) as db:
        db.execute("UPDATE nli SET c = 5.0")
    again = nli(PREMISES[:1], HYPOTHESES[:1])
    np.testing.assert_allclose(again, first)
    assert nli.stats.computed == 2


def test_label_order_is_read_not_assumed() -> None:
    assert nli_label_order({0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"}) == [0, 1, 2]
    assert nli_label_order({"0": "entailment", "1": "neutral", "2": "contradiction"}) == [2, 1, 0]
    with pytest.raises(ValueError, match="'contradiction'"):
        nli_label_order({0: "entailment", 1: "not_entailment"}, "two-way")
    with pytest.raises(ValueError, match="LABEL_0"):
        nli_label_order({0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"})


def test_is_the_entail_callable_of_seper(nli: Entailment) -> None:
    from ragutil_dagster.metrics.seper import seper

    responses = ["paris", "paris", "the capital is paris"]
    result = seper(responses, [[-0.1], [-0.1], [-0.5, -0.2, -0.3, -0.1]], "paris", nli)
    assert 0.0 <= result.score <= 1.0 and len(result.cluster_ids) == 3
    assert result.weights.sum() == pytest.approx(1.0)
    assert nli.stats.pairs > 0 and nli.stats.unique_pairs <= nli.stats.pairs


def _writer(path: str, worker: int) -> int:
    """Store 100 rows for this worker, then read every worker's rows that exist so far."""
    from ragutil_dagster.models.entailment import NLICache

    cache = NLICache(path)
    rows = [(f"{worker}-{i}", np.array([0.2, 0.3, 0.5])) for i in range(100)]
    for start in range(0, 100, 10):
        cache.put("m", rows[start : start + 10])
    keys = [f"{w}-{i}" for w in range(4) for i in range(100)]
    return len(cache.get("m", keys))


@pytest.mark.slow
def test_cache_is_safe_for_concurrent_processes(tmp_path: Path) -> None:
    import multiprocessing

    path = str(tmp_path / "shared.sqlite")
    # Spawned, not forked: a child forked from this multi-threaded process (torch's thread pool)
    # can inherit a held lock and hang.
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        seen = pool.starmap(_writer, [(path, w) for w in range(4)])
    assert all(100 <= s <= 400 for s in seen)
    from ragutil_dagster.models.entailment import NLICache

    assert len(NLICache(path).get("m", [f"{w}-{i}" for w in range(4) for i in range(100)])) == 400


def test_directory_without_a_model_fails_clearly(tmp_path: Path) -> None:
    from ragutil_dagster.errors import ModelUnavailableError

    (tmp_path / "README").write_text("empty")
    with pytest.raises(ModelUnavailableError, match="could not be loaded as an NLI classifier"):
        Entailment(str(tmp_path), cache=False)


def test_length_batches_do_not_change_probabilities(tiny_models, tmp_path: Path) -> None:
    """Pairs of very different lengths batched by token length (several per batch, padded to
    the batch's width) get the probabilities each pair gets alone."""
    premises = [f"{'the cat sat on the mat ' * k}and slept" for k in (1, 12, 2, 30, 1, 7)]
    hypotheses = ["an animal slept", "a cat", "nothing happened", "the mat sat", "x", "slept"]
    batched = Entailment(
        str(tiny_models.nli),
        device="cpu",
        dtype="float32",
        batch_size=4,
        max_batch_tokens=256,
        cache=False,
        show_progress=False,
    )
    alone = Entailment(
        str(tiny_models.nli),
        device="cpu",
        dtype="float32",
        batch_size=1,
        cache=False,
        show_progress=False,
    )
    np.testing.assert_allclose(
        batched(premises, hypotheses), alone(premises, hypotheses), atol=1e-5
    )


def test_a_call_on_cpu_compiles_the_model_when_its_eager_rest_would_take_longer(
    tiny_models,
) -> None:
    """The model is compiled before a batch once the eager pace measured so far projects the
    call's rest past ``compile_after_seconds``; a call with no pace yet (the first batch) and a
    limit no projection reaches stay eager, and the probabilities do not change."""

    def nli(after: float | None) -> Entailment:
        return Entailment(
            str(tiny_models.nli),
            device="cpu",
            dtype="float32",
            cache=False,
            show_progress=False,
            batch_size=1,
            compile_after_seconds=after,
        )

    eager, patient, compiled = nli(None), nli(1e9), nli(1e-9)
    reference = eager(PREMISES, HYPOTHESES)
    for model in (patient, compiled):
        first = model(PREMISES[:1], HYPOTHESES[:1])  # one batch: nothing timed before it
        assert model.model is model.eager_model
        np.testing.assert_allclose(first, reference[:1], atol=1e-5)
        np.testing.assert_allclose(model(PREMISES, HYPOTHESES), reference, atol=1e-5)
    assert patient.model is patient.eager_model  # a rest of milliseconds never pays
    assert compiled.model is not compiled.eager_model and compiled.compile_after_seconds is None


def test_a_compiled_model_that_fails_falls_back_to_eager_with_a_warning(
    tiny_models, monkeypatch
) -> None:
    def broken(model, **_):
        def run(**batch):
            raise RuntimeError("no C++ compiler")

        return run

    monkeypatch.setattr(torch, "compile", broken)
    nli = Entailment(
        str(tiny_models.nli),
        device="cpu",
        dtype="float32",
        cache=False,
        show_progress=False,
        compile_after_seconds=0,
    )
    with pytest.warns(
        RuntimeWarning, match="torch.compile failed .*no C\\+\\+ compiler.*running it eagerly"
    ):
        got = nli(PREMISES, HYPOTHESES)
    assert nli.model is nli.eager_model
    reference = Entailment(
        str(tiny_models.nli),
        device="cpu",
        dtype="float32",
        cache=False,
        show_progress=False,
        compile_after_seconds=None,
    )
    np.testing.assert_allclose(got, reference(PREMISES, HYPOTHESES), atol=1e-6)


@pytest.mark.parametrize("flags", [{"amx_bf16": True}, {}])
@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_the_cpu_default_is_float32_and_each_dtype_compiles_where_it_pays(
    tiny_models, monkeypatch, flags, dtype
) -> None:
    from ragutil_dagster.models.entailment import COMPILE_AFTER_SECONDS

    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: flags)
    nli = Entailment(
        str(tiny_models.nli), device="cpu", dtype=dtype, cache=False, show_progress=False
    )
    expected = torch.bfloat16 if dtype else torch.float32
    assert nli.dtype == expected and next(nli.model.parameters()).dtype == expected
    assert nli.cache_key.endswith(f"dtype={str(expected).removeprefix('torch.')}")
    assert nli.compile_after_seconds == COMPILE_AFTER_SECONDS[expected]
    probabilities = nli(PREMISES, HYPOTHESES)
    assert probabilities.shape == (4, 3) and np.allclose(probabilities.sum(axis=1), 1.0)


def test_loading_on_cpu_runs_one_discarded_pass_first(tiny_models, monkeypatch) -> None:
    """docs/reliability.md, Determinism: a fresh process's first forward pass may differ."""
    from ragutil_dagster.models import entailment

    passes = []
    monkeypatch.setattr(
        entailment,
        "warm_up_on_cpu",
        lambda model, device: passes.append((type(model), device.type)),
    )
    Entailment(str(tiny_models.nli), device="cpu", cache=False, show_progress=False)
    assert passes == [
        (AutoModelForSequenceClassification.from_pretrained(tiny_models.nli).__class__, "cpu")
    ]
