"""The cross-run comparison of an experiment, end to end: gather every materialised partition
from the artifact store, build the tables, write them under ``reports/<dataset>/`` and log one
comparison run per dataset. Shared by the ``reports`` asset and ``ragutil compare``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from ragutil_dagster import __version__
from ragutil_dagster.config import ExperimentConfig
from ragutil_dagster.files import stable_hash
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.tracking.compare import (
    Comparison,
    PartitionScores,
    build_comparison,
    log_comparison,
    write_comparison,
)
from ragutil_dagster.tracking.resource import MlflowTracking, TrackedRun


def partition_scores(store: ArtifactStore, experiment: ExperimentConfig) -> list[PartitionScores]:
    """Every materialised setting × generator of ``experiment``: summary, per-query table and
    the id of its MLflow run (empty when it was scored without tracking)."""
    found = []
    for setting in experiment.settings():
        for generator in experiment.generators:
            key = str(dg.MultiPartitionKey({"setting": setting.key, "generator": generator.name}))
            directory = store.directory("metric_scores", key)
            if not (directory / "summary.json").is_file():
                continue
            tracked = (directory / "mlflow.json").is_file()
            found.append(
                PartitionScores(
                    setting=setting,
                    generator=generator.name,
                    summary=store.read_json("metric_scores", key, "summary"),
                    per_query=store.read_table("metric_scores", key),
                    mlflow_run_id=store.read_json("metric_scores", key, "mlflow")["run_id"]
                    if tracked
                    else "",
                )
            )
    return found


@dataclass(frozen=True)
class ComparisonOutcome:
    """Per dataset: the comparison, the directory holding its files, and its MLflow run."""

    comparisons: dict[str, Comparison]
    directories: dict[str, Path]
    runs: dict[str, TrackedRun]

    def markdown(self) -> str:
        return "\n\n".join(
            f"## {dataset} — MLflow comparison run [{self.runs[dataset].run_id}]({self.runs[dataset].url})\n\n"
            f"{comparison.markdown()}"
            for dataset, comparison in self.comparisons.items()
        )


def compare_runs(
    store: ArtifactStore,
    tracking: MlflowTracking,
    experiment: ExperimentConfig,
    tags: dict[str, str] | None = None,
) -> ComparisonOutcome:
    """Compare every materialised partition, one comparison per dataset. The comparison run is
    keyed by the compared runs (their MLflow ids), so re-comparing the same runs reuses it."""
    by_dataset: dict[str, list[PartitionScores]] = {}
    for scores in partition_scores(store, experiment):
        by_dataset.setdefault(scores.setting.dataset, []).append(scores)
    if not by_dataset:
        raise FileNotFoundError(
            f"experiment {experiment.name!r}: no metric_scores partition has been materialised yet "
            f"under {store.directory('metric_scores')} (run `ragutil run` first)"
        )
    comparisons, directories, runs = {}, {}, {}
    for dataset, members in by_dataset.items():
        comparison = build_comparison(members, experiment.seed)
        directory = store.directory("reports", dataset)
        written = write_comparison(comparison, directory)
        compared = sorted(
            (f"{m.setting.key}|{m.generator}", m.mlflow_run_id or stable_hash(m.summary, 16))
            for m in members
        )
        key = stable_hash(
            {
                "experiment": experiment.fingerprint(),
                "dataset": dataset,
                "runs": compared,
                "version": __version__,
            },
            length=32,
        )
        params = {
            "experiment": experiment.name,
            "dataset": dataset,
            "config_fingerprint": experiment.fingerprint(),
            "ragutil_version": __version__,
            "runs_compared": str(len(members)),
        }
        runs[dataset] = log_comparison(
            tracking,
            dataset,
            key,
            f"comparison|{experiment.name}",
            comparison,
            written,
            params,
            tags or {},
        )
        comparisons[dataset], directories[dataset] = comparison, directory
    return ComparisonOutcome(comparisons, directories, runs)
