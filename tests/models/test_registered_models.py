"""Models from the MLflow Model Registry: resolved to a version, downloaded once, observed."""

from __future__ import annotations

import shutil

import dagster as dg
import mlflow
import pytest
from mlflow import MlflowClient
from safetensors.torch import load_file, save_file

from ragutil_dagster.assets import build_assets
from ragutil_dagster.automation import build_model_sensor
from ragutil_dagster.config import parse_config
from ragutil_dagster.errors import ModelUnavailableError
from ragutil_dagster.models.identity import resolve_model
from ragutil_dagster.models.resolver import model_location
from ragutil_dagster.testing.tiny import build_causal_lm


@pytest.fixture
def registry(tmp_path, monkeypatch):
    home = tmp_path / "home"
    uri = f"sqlite:///{tmp_path / 'registry.db'}"
    monkeypatch.setenv("RAGUTIL_HOME", str(home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment(
        "models", artifact_location=(tmp_path / "artifacts").as_uri()
    )
    client.create_registered_model("reader")

    def register(model_dir) -> str:
        run = client.create_run(experiment)
        client.log_artifacts(run.info.run_id, str(model_dir), "model")
        client.set_terminated(run.info.run_id)
        version = client.create_model_version(
            "reader", f"{run.info.artifact_uri}/model", run.info.run_id
        )
        return version.version

    return client, register, tmp_path


def test_alias_resolves_downloads_once_and_moves_identity(registry) -> None:
    client, register, tmp_path = registry
    first_dir = build_causal_lm(tmp_path / "v1", seed=0)
    v1 = register(first_dir)
    client.set_registered_model_alias("reader", "champion", v1)
    path = model_location("models:/reader@champion")
    assert resolve_model(path).identity == resolve_model(str(first_dir)).identity
    assert model_location("models:/reader/1") == path  # cached, same directory

    second_dir = tmp_path / "v2"
    shutil.copytree(first_dir, second_dir)
    weights = next(second_dir.glob("*.safetensors"))
    tensors = load_file(weights)
    name = next(iter(tensors))
    tensors[name] = tensors[name] * 1.5
    save_file(tensors, weights, metadata={"format": "pt"})
    client.set_registered_model_alias("reader", "champion", register(second_dir))
    moved = model_location("models:/reader@champion")
    assert (
        moved != path and resolve_model(moved).identity == resolve_model(str(second_dir)).identity
    )


def test_sensor_observes_a_moved_alias(registry, tiny_world) -> None:
    client, register, tmp_path = registry
    _, world, models = tiny_world
    client.set_registered_model_alias("reader", "champion", register(models.causal_lm))
    config = {
        "name": "reg",
        "datasets": [
            {"name": "world", "format": "synthetic", "path": str(world), "max_queries": 4}
        ],
        "retrievers": [{"name": "bm25", "kind": "bm25"}],
        "k": [1],
        "generators": [{"name": "champion", "model": "models:/reader@champion"}],
        "nli": {"model": str(models.nli)},
    }
    experiment = parse_config(config)
    _, assets = build_assets(experiment)
    sensor = build_model_sensor(experiment, assets)
    baseline = sensor(dg.build_sensor_context())
    changed_dir = tmp_path / "changed"
    shutil.copytree(models.causal_lm, changed_dir)
    (changed_dir / "generation_config.json").write_text('{"note": "retrained"}')
    client.set_registered_model_alias("reader", "champion", register(changed_dir))
    result = sensor(dg.build_sensor_context(cursor=baseline.cursor))
    assert {r.partition_key for r in result.run_requests} == {
        "world|champion",
        "champion|world__bm25__k1",
    }


def test_unknown_registered_model_is_a_clear_error(registry) -> None:
    with pytest.raises(ModelUnavailableError, match="not in the MLflow registry"):
        model_location("models:/nothing@champion")
    with pytest.raises(ModelUnavailableError, match="expected models:/<name>/<version>"):
        model_location("models:/reader/latest/extra")
    assert mlflow.get_tracking_uri()
