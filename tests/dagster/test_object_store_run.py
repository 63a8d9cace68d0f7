"""``ragutil run`` with its artifacts on an S3-compatible server (moto on 127.0.0.1), chosen by
``$RAGUTIL_ARTIFACTS_URL``: a small part of the tiny pipeline (one retriever, k = 1, three
queries), every table read back from the bucket, MLflow's run artifacts there too, nothing
written under the local artifacts."""

from __future__ import annotations

import uuid

import yaml
from mlflow import MlflowClient

from ragutil_dagster.cli import main
from ragutil_dagster.config import load_config
from ragutil_dagster.infra.databases import DAGSTER_HOME_VARIABLE
from ragutil_dagster.infra.files import embedded_tracking_uri
from ragutil_dagster.infra.objectstore import ARTIFACTS_URL_VARIABLE
from ragutil_dagster.resources import ArtifactStore
from ragutil_dagster.tracking.report import report_artifact


def test_ragutil_run_keeps_its_artifacts_on_s3(
    s3_environment, tiny_world, make_tiny_config, tmp_path, monkeypatch, capsys
) -> None:
    _, world, models = tiny_world
    spec = make_tiny_config(models, world)
    spec["retrievers"], spec["k"] = spec["retrievers"][:1], [1]
    spec["datasets"][0]["max_queries"] = 3
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(spec))
    url = f"s3://{s3_environment.bucket}/{uuid.uuid4().hex}/artifacts"
    home = tmp_path / "home"
    monkeypatch.setenv("RAGUTIL_HOME", str(home))
    monkeypatch.setenv(ARTIFACTS_URL_VARIABLE, url)
    monkeypatch.delenv(DAGSTER_HOME_VARIABLE, raising=False)

    assert main(["run", str(config), "--quiet"]) == 0
    out = capsys.readouterr().out
    experiment = load_config(config)
    _, folder, _ = report_artifact(experiment)
    assert f"reports: {url}/reports/{folder}/summary." in out

    store = ArtifactStore(home=str(home), url=url)
    partition = "lm0|world__bm25__k1"
    assert store.read_table("queries", "world").height == 3
    assert store.read_table("retrieval_run", "world__bm25__k1").height == 3
    scores = store.read_table("metric_scores", partition)
    assert scores.height == 3 and scores["delta_seper_s"].null_count() == 0
    summary = store.read_json("metric_scores", partition, "summary")
    assert summary["delta_seper_s"] == scores["delta_seper_s"].mean()
    index = store.local_files("index", "world__bm25", "index")
    assert index.is_relative_to(home / "cache" / "artifacts") and any(index.iterdir())
    reports = store.local_files(*report_artifact(experiment))
    assert (reports / "summary.csv").read_text().count("\n") == 2  # header and one setting
    assert not (home / "artifacts").exists()
    # MLflow's run artifacts went to the bucket too, and the reports read them back from there.
    client = MlflowClient(embedded_tracking_uri(home))
    runs = client.search_runs([client.get_experiment_by_name("ragutil/world").experiment_id])
    assert {run.data.tags["ragutil.kind"] for run in runs} == {"partition", "comparison"}
    assert all(run.info.artifact_uri.startswith(f"{url}/mlruns/ragutil_world/") for run in runs)
    partition_run = next(run for run in runs if run.data.tags["ragutil.kind"] == "partition")
    logged = {
        f.path.rsplit("/", 1)[-1]
        for f in client.list_artifacts(partition_run.info.run_id, "scores")
    }
    assert {"table.parquet", "summary.json"} <= logged
    assert not (home / "mlruns").exists()
