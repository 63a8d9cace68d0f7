"""Resources: a model is loaded once per process; tables are written atomically."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
import torch

from ragutil_dagster.config import GeneratorConfig, NliConfig
from ragutil_dagster.models.backend_contract import Placement
from ragutil_dagster.models.backends import BACKENDS
from ragutil_dagster.resources import ArtifactStore, ModelLoader
from ragutil_dagster.sampling import SamplingParams


def test_models_are_loaded_once_per_process(tiny_world) -> None:
    _, _, models = tiny_world
    loader = ModelLoader(show_progress=False)
    spec = GeneratorConfig(name="lm", model=str(models.causal_lm))
    assert loader.generator(spec) is ModelLoader(show_progress=False).generator(spec)
    assert loader.scorer(spec).lm is loader.generator(spec).lm
    nli = NliConfig(model=str(models.nli))
    assert loader.entailment(nli) is loader.entailment(nli)
    assert loader.identity(str(models.nli)).startswith("sha256:")


@pytest.mark.parametrize("backend", ["vllm", "openai"])
def test_engine_scoring_shows_its_bar_behind_the_generation_cache(backend: str) -> None:
    """Behind the cache the generator's own bar is off (the cache draws one); token scoring
    (ConSens, likelihood utility) has no other bar, so it keeps the loader's setting."""
    generator_behind_cache = SimpleNamespace(
        show_progress=False, tokenizer="its tokenizer", probe_prompt_logprobs=lambda: True
    )
    placement = Placement(device=None, batch_rows=1, show_progress=True)
    assert BACKENDS[backend].scorer(generator_behind_cache, placement).show_progress
    quiet = Placement(device=None, batch_rows=1, show_progress=False)
    assert not BACKENDS[backend].scorer(generator_behind_cache, quiet).show_progress


def test_the_nli_runs_in_the_configured_dtype(tiny_world) -> None:
    """``nli.dtype`` reaches the model, and judgements in two dtypes never share a cache entry."""
    _, _, models = tiny_world
    loader = ModelLoader(show_progress=False)
    default = loader.entailment(NliConfig(model=str(models.nli)))
    bf16 = loader.entailment(NliConfig(model=str(models.nli), dtype="bfloat16"))
    assert (default.model.dtype, bf16.model.dtype) == (torch.float32, torch.bfloat16)
    assert default.cache_key != bf16.cache_key
    probs = bf16(["Question: who? Answer: Ada"], ["Question: who? Answer: Ada"])
    assert probs.shape == (1, 3) and abs(probs.sum() - 1) < 1e-6


def test_store_round_trip_and_missing_tables(tmp_path) -> None:
    store = ArtifactStore(home=str(tmp_path))
    frame = pl.DataFrame({"a": [1, 2]})
    path = Path(store.write_table("metric_scores", "lm|world__bm25__k1", frame))
    assert (
        path.parent.parent == tmp_path / "artifacts" / "metric_scores" / "lm__gen__world__bm25__k1"
    )
    assert store.read_table("metric_scores", "lm|world__bm25__k1").equals(frame)
    assert sorted(p.name for p in path.parent.parent.iterdir()) == [
        path.parent.name,
        "table.parquet.manifest.json",
    ]
    with pytest.raises(FileNotFoundError, match="materialise queries first"):
        store.read_table("queries", "world")


def test_generator_sits_behind_the_generation_cache(tiny_world, tmp_path) -> None:
    _, _, models = tiny_world
    loader = ModelLoader(show_progress=False, generation_cache=str(tmp_path / "generations"))
    generator = loader.generator(GeneratorConfig(name="lm", model=str(models.causal_lm)))
    first = generator.sample(
        ["Question: who?\nAnswer:"], SamplingParams(n=2, max_new_tokens=3, seed=1)
    )
    again = generator.sample(
        ["Question: who?\nAnswer:"], SamplingParams(n=2, max_new_tokens=3, seed=1)
    )
    assert (generator.stats.misses, generator.stats.hits) == (1, 1)
    assert [s.text for s in first[0]] == [s.text for s in again[0]]
    # The scores sit beside the samples: one connection to that database serves both.
    scorer = loader.scorer(GeneratorConfig(name="lm", model=str(models.causal_lm)))
    assert scorer.cache is generator.cache
