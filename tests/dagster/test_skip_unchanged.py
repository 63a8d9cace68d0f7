"""``ragutil run`` materialises only what changed (``skip_unchanged.py``): an unchanged grid skips every
partition, a deleted artifact re-runs its partition, a changed retriever only its own partitions,
``--force`` all. One small grid (BM25 and dense, k = 1, no utility judgments) is materialised
once; the tests re-run it in process, in file order, each leaving it fresh for the next."""

from __future__ import annotations

import shutil

import dagster as dg
import pytest

from ragutil_dagster.assets import build_assets
from ragutil_dagster.config import parse_config
from ragutil_dagster.definitions import build_definitions
from ragutil_dagster.resources import ArtifactStore
from ragutil_dagster.runner import materialize_all, plan
from ragutil_dagster.skip_unchanged import CHANGED, FORCED, MISSING, Freshness
from ragutil_dagster.tracking import MlflowTracking
from ragutil_dagster.tracking.report import partition_scores


@pytest.fixture(scope="module")
def grid(tiny_world, make_tiny_config, tmp_path_factory):
    """(config dict, home, instance) after a first full run."""
    _, world, models = tiny_world
    config = {
        **make_tiny_config(models, world),
        "k": [1],
        "utility": {"candidates": 4, "methods": []},
    }
    home = tmp_path_factory.mktemp("skip-home")
    instance = dg.DagsterInstance.ephemeral()
    outcome = run(config, home, instance)
    assert outcome.skipped == 0 and outcome.runs == partitions(config)
    return config, home, instance


def run(config: dict, home, instance: dg.DagsterInstance, force: bool = False):
    experiment = parse_config(config)
    parts, _ = build_assets(experiment)
    return materialize_all(
        build_definitions(experiment, str(home)),
        experiment,
        parts,
        instance,
        progress=False,
        force=force,
    )


def partitions(config: dict) -> int:
    """How many step partitions the grid has."""
    return sum(len(keys) for _, keys in plan(build_assets(parse_config(config))[1]))


def said_run(capsys) -> set[str]:
    """The partitions the runner said it ran, with why (its ``run   <step>[<partition>]: <why>`` lines)."""
    return {
        line.removeprefix("run   ")
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("run   ")
    }


def test_an_unchanged_rerun_skips_every_partition(grid) -> None:
    config, home, instance = grid
    before = len(instance.get_runs())
    outcome = run(config, home, instance)
    assert (outcome.runs, outcome.skipped) == (0, partitions(config))
    assert len(instance.get_runs()) == before
    assert outcome.summary.height == 2  # the summary is still read from the store


def test_a_deleted_artifact_reruns_its_partition(grid, capsys) -> None:
    config, home, instance = grid
    key = "lm0|world__bm25__k1"
    artifact = ArtifactStore(home=str(home)).artifact_name("metric_scores", key, "")
    shutil.rmtree(home / "artifacts" / artifact)
    before = len(instance.get_runs())
    outcome = run(config, home, instance)
    # Its step again (every score table of the partition), then the cross-LLM utility of the
    # partition and the reports, whose parents are newer.
    assert said_run(capsys) == {
        f"generations+11 more[{key}]: {MISSING}",
        f"utility_transfer[{key}]: upstream newer (candidate_scores[{key}])",
        f"reports: upstream newer (metric_scores[{key}])",
    }
    assert outcome.runs == len(instance.get_runs()) - before == 3
    assert outcome.skipped == partitions(config) - 3


def test_force_runs_every_partition(grid) -> None:
    config, home, instance = grid
    experiment = parse_config(config)
    defs = build_definitions(experiment, str(home))
    resources = dict(defs.resources or {})
    steps = plan(list(defs.assets or []))
    decide = lambda force: [  # noqa: E731
        Freshness(defs, experiment, instance, resources["models"], force).decide(names, key).reason
        for names, keys in steps
        for key in keys
    ]
    assert set(decide(force=False)) == {None}
    assert decide(force=True) == [FORCED] * partitions(config)
    # What forcing materialises next carries the same input versions as an unforced run.
    forced = Freshness(defs, experiment, instance, resources["models"], True)
    names, keys = steps[0]
    assert (
        forced.decide(names, keys[0]).tags
        == Freshness(defs, experiment, instance, resources["models"]).decide(names, keys[0]).tags
    )


def test_a_changed_retriever_reruns_only_its_partitions(grid, capsys) -> None:
    config, home, instance = grid
    changed = {
        **config,
        "retrievers": [config["retrievers"][0], {**config["retrievers"][1], "index": "hnsw"}],
    }
    before = len(instance.get_runs())
    outcome = run(changed, home, instance)
    # The dense retriever's embeddings, index, retrieval and scores, and the reports (whose slice is
    # the whole config); nothing of BM25, the dataset or the closed book.
    assert said_run(capsys) == {
        f"{step}: {CHANGED['config']}"
        for step in (
            "passage_embeddings[world__dense__shard-1-of-1]",
            "index[world__dense]",
            "retrieval_run+3 more[world__dense__k1]",
            "generations+11 more[lm0|world__dense__k1]",
            "utility_transfer[lm0|world__dense__k1]",
            "reports",
        )
    }
    assert outcome.runs == len(instance.get_runs()) - before == 6
    assert outcome.skipped == partitions(changed) - 6
    # The report still compares both retrievers: BM25's skipped partition read the same config slice.
    tracking = MlflowTracking(home=str(home))
    assert {p.setting.retriever for p in partition_scores(tracking, parse_config(changed))} == {
        "bm25",
        "dense",
    }
