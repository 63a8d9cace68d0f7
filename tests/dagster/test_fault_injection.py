"""Fault injection: ``ragutil run`` killed with SIGKILL at each failpoint (during sampling, NLI,
scoring, MLflow logging, a Parquet write and a publish) — no handler runs, as with the OOM killer.
Each killed run is resumed by the next command, itself killed at the next point, so every point
is met by a run that resumes a killed one; the last run must complete with scores identical to an
uninterrupted run's, and MLflow must hold exactly one run per run key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
import yaml
from mlflow import MlflowClient

from ragutil_dagster.infra.failpoints import ENV, POINTS
from ragutil_dagster.infra.objectstore import MANIFEST_SUFFIX, ObjectStore
from ragutil_dagster.tracking.keys import KIND_TAG, RUN_KEY_TAG

# (point, pass), in the order the pipeline reaches them: each pass is counted from the start of
# the run that resumes the previous kill, and chosen so the kill lands after some work of the same
# kind has completed — e.g. the fourth Parquet table, the second checkpoint of sampling.
KILLS = [
    ("parquet_write", 4),
    ("publish", 6),
    ("sampling", 2),
    ("nli", 1),
    ("scoring", 2),
    ("mlflow", 1),
]


def run_pipeline(
    config: Path, home: Path, failpoint: str | None = None
) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if k not in (ENV, "MLFLOW_TRACKING_URI", "DAGSTER_HOME")
    }
    env["RAGUTIL_HOME"] = str(home)
    if failpoint:
        env[ENV] = failpoint
    return subprocess.run(
        [sys.executable, "-m", "ragutil_dagster.cli", "run", str(config), "--quiet"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def final_scores(home: Path) -> dict[str, object]:
    """Every published table and summary of metric_scores, by partition and name (a killed
    writer's unpublished object is not among them)."""
    store = ObjectStore(str(home / "artifacts"), home / "cache")
    out: dict[str, object] = {}
    for manifest in sorted((home / "artifacts" / "metric_scores").glob(f"*/*{MANIFEST_SUFFIX}")):
        name = f"metric_scores/{manifest.parent.name}/{manifest.name.removesuffix(MANIFEST_SUFFIX)}"
        if name.endswith(".parquet"):
            out[name] = store.read(name, pl.read_parquet)
        elif name.endswith("/summary.json"):
            out[name] = store.read(name, json.load)
    return out


def mlflow_runs(home: Path) -> Counter:
    """Runs per (kind, name), after asserting every run FINISHED and no run key held twice.

    Keys are compared within one store only: a comparison run's key holds the MLflow ids of the
    runs it compares, which differ between stores.
    """
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    keys: Counter = Counter()
    names: Counter = Counter()
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id], max_results=1000):
            assert run.info.status == "FINISHED", (run.info.run_name, run.info.status)
            keys[run.data.tags[RUN_KEY_TAG]] += 1
            names[(run.data.tags[KIND_TAG], run.info.run_name)] += 1
    assert set(keys.values()) == {1}, keys
    return names


@pytest.fixture(scope="module")
def config(tiny_world, make_tiny_config, tmp_path_factory) -> Path:
    _, world, models = tiny_world
    spec = make_tiny_config(models, world)
    spec["retrievers"] = spec["retrievers"][:1]
    spec["datasets"][0]["max_queries"] = 4
    path = tmp_path_factory.mktemp("fault-config") / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="module")
def uninterrupted(config, tmp_path_factory) -> tuple[dict[str, object], Counter]:
    home = tmp_path_factory.mktemp("uninterrupted")
    done = run_pipeline(config, home)
    assert done.returncode == 0, done.stderr[-3000:]
    return final_scores(home), mlflow_runs(home)


def test_every_failpoint_is_exercised() -> None:
    assert sorted(point for point, _ in KILLS) == sorted(POINTS)


def test_runs_killed_at_every_point_resume_to_identical_scores_and_no_duplicate_runs(
    config: Path, uninterrupted, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    for point, nth in KILLS:
        killed = run_pipeline(config, home, f"{point}:{nth}")
        assert killed.returncode == -signal.SIGKILL, (
            point,
            killed.returncode,
            killed.stderr[-3000:],
        )

    resumed = run_pipeline(config, home)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected_scores, expected_runs = uninterrupted
    scores = final_scores(home)
    assert scores.keys() == expected_scores.keys()
    for name, value in expected_scores.items():
        if isinstance(value, pl.DataFrame):
            assert scores[name].equals(value), name
        else:
            assert scores[name] == value, name
    runs = mlflow_runs(home)
    assert runs == expected_runs
    assert set(runs.values()) == {1}


def test_a_run_stopped_by_sigterm_says_so_in_one_line_and_resumes(
    config: Path, uninterrupted, tmp_path: Path
) -> None:
    """SIGTERM during a step (Dagster raises its interruption there) ends ``ragutil run`` with
    status 130 and one line naming the step — none of Dagster's failure tracebacks — and the next
    run finishes with the scores of an uninterrupted one."""
    home = tmp_path / "home"
    stopped = run_pipeline(config, home, "sampling:2:term")
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    lines = [line for line in stopped.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("ragutil run: stopped by SIGTERM or Ctrl-C during "), lines[-5:]
    assert "Traceback" not in stopped.stderr and "Interrupted" not in stopped.stderr, lines[-20:]
    resumed = run_pipeline(config, home)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert final_scores(home).keys() == uninterrupted[0].keys()
