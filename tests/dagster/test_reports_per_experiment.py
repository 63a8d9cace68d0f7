"""Every experiment keeps its reports in a folder of its own (``tracking.report.report_artifact``):
``ragutil run`` of a second experiment over the same dataset in the same home leaves the first's
summary and comparison — and the path ``ragutil run`` printed — in place, and a re-run of the same
experiment replaces its own reports whole (tiny pipeline: BM25, three queries)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import polars as pl
import pytest
import yaml

from ragutil_dagster.cli import main
from ragutil_dagster.config import load_config
from ragutil_dagster.infra.databases import DAGSTER_HOME_VARIABLE
from ragutil_dagster.infra.objectstore import MANIFEST_SUFFIX
from ragutil_dagster.resources import ArtifactStore
from ragutil_dagster.tracking.report import report_artifact, superseded_reports

SUMMARY_FILES = ("delta_seper_heatmap.png", "summary.csv", "summary.md")


@pytest.fixture()
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("RAGUTIL_HOME", str(home))
    for variable in ("RAGUTIL_ARTIFACTS_URL", "RAGUTIL_SCRATCH_DIR", DAGSTER_HOME_VARIABLE):
        monkeypatch.delenv(variable, raising=False)
    return home


@pytest.fixture()
def write_config(tiny_world, make_tiny_config, tmp_path):
    """``write_config(name, k)``: the tiny experiment under ``name`` with BM25 at ``k`` alone."""
    _, world, models = tiny_world

    def write(name: str, k: int) -> Path:
        spec = make_tiny_config(models, world)
        spec.update(
            name=name,
            retrievers=spec["retrievers"][:1],
            k=[k],
            utility={"candidates": 2, "methods": []},
        )
        spec["datasets"][0]["max_queries"] = 3
        path = tmp_path / f"{name}-k{k}.yaml"
        path.write_text(yaml.safe_dump(spec))
        return path

    return write


def run(config: Path, capsys) -> Path:
    """``ragutil run`` of ``config``; the summary folder it printed."""
    assert main(["run", str(config), "--quiet"]) == 0
    printed = re.search(r"^reports: (\S+)", capsys.readouterr().out, re.MULTILINE)
    assert printed, "ragutil run printed no reports path"
    return Path(printed[1])


def compared(folder: Path) -> list[tuple]:
    """The (retriever, k) of every run a comparison folder compares."""
    return sorted(pl.read_csv(folder / "runs.csv").select("retriever", "k").iter_rows())


def test_a_second_experiment_over_the_same_dataset_leaves_the_first_reports(
    home, write_config, capsys
) -> None:
    first, second = write_config("tiny", 1), write_config("other", 2)
    shown = run(first, capsys)
    summary = (shown / "summary.csv").read_text()
    run(second, capsys)

    store = ArtifactStore(home=str(home))
    experiment = load_config(first)
    assert store.local_files(*report_artifact(experiment)) == shown
    assert sorted(p.name for p in shown.iterdir()) == list(SUMMARY_FILES)
    assert (shown / "summary.csv").read_text() == summary
    assert pl.read_csv(shown / "summary.csv")["k"].to_list() == [1]
    assert compared(store.local_files(*report_artifact(experiment, "world"))) == [("bm25", 1)]
    # The second experiment's reports hold its own rows only, in its own folder.
    other = load_config(second)
    assert pl.read_csv(store.local_files(*report_artifact(other)) / "summary.csv")[
        "k"
    ].to_list() == [2]
    assert compared(store.local_files(*report_artifact(other, "world"))) == [("bm25", 2)]
    assert report_artifact(other)[1] != report_artifact(experiment)[1]
    # Two names: neither supersedes the other.
    assert superseded_reports(store, older_than=0, now=time.time() + 1) == []


def test_a_rerun_replaces_its_own_reports_whole(home, write_config, capsys, monkeypatch) -> None:
    config = write_config("tiny", 1)
    experiment = load_config(config)
    shown = run(config, capsys)
    before = {name: (shown / name).read_bytes() for name in SUMMARY_FILES}

    # A re-run dying while it writes the summary publishes nothing: the shown folder stays whole.
    def broken_heatmap(table, path):
        path.write_bytes(b"half a png")
        raise RuntimeError("injected: the plot failed")

    with monkeypatch.context() as patch:
        patch.setattr("ragutil_dagster.assets.reports.delta_seper_heatmap", broken_heatmap)
        assert (
            main(["run", str(config), "--quiet", "--force"]) == 1
        )  # ragutil's failure, not the user's
    assert "reports failed: RuntimeError: injected: the plot failed" in capsys.readouterr().err
    assert {name: (shown / name).read_bytes() for name in SUMMARY_FILES} == before

    # Run again: only the reports (their upstream is newer) are written, and replace the shown ones.
    replaced = run(config, capsys)
    store = ArtifactStore(home=str(home))
    assert store.local_files(*report_artifact(experiment)) == replaced != shown
    assert not shown.exists()  # the experiment's own earlier summary is replaced, not kept beside
    assert (replaced / "summary.csv").read_text() == before["summary.csv"].decode()
    reports, folder, _ = report_artifact(experiment)
    # One published summary and one world comparison in the experiment's folder, nothing else left.
    root = home / "artifacts" / reports / folder
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [f"summary{MANIFEST_SUFFIX}", replaced.name, "world"]
    )
    assert len([p for p in (root / "world").iterdir() if p.is_dir()]) == 1
    assert compared(store.local_files(*report_artifact(experiment, "world"))) == [("bm25", 1)]
