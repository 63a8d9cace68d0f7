"""The cross-run comparison of an experiment, end to end: gather every partition run of the
experiment from MLflow — whichever machine logged it — build the tables, write them under
``reports/<dataset>/`` and log one comparison run per dataset. Shared by the ``reports`` asset and
``ragutil compare``."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ragutil_dagster import __version__
from ragutil_dagster.config import ExperimentConfig
from ragutil_dagster.errors import NothingToCompareError
from ragutil_dagster.infra.files import stable_hash
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.tables import validate_scores
from ragutil_dagster.tracking.compare import (
    PROMPT_COLUMNS,
    Comparison,
    PartitionScores,
    build_comparison,
    log_comparison,
    write_comparison,
)
from ragutil_dagster.tracking.keys import (
    KIND_TAG,
    PARTITION_CONFIG_PARAM,
    mlflow_experiment_name,
    partition_config_fingerprint,
    partition_run_name,
)
from ragutil_dagster.tracking.partition import (
    CORRELATIONS_ARTIFACT,
    OVERLAP_ARTIFACT,
    PER_QUERY_ARTIFACT,
    SUMMARY_ARTIFACT,
    TRANSFER_ARTIFACT,
    VALIDITY_ARTIFACT,
)
from ragutil_dagster.tracking.resource import FINISHED, MlflowTracking, TrackedRun


def _finished_partition_runs(tracking: MlflowTracking, experiment_id: str) -> Iterator:
    """Every FINISHED partition run in an MLflow experiment, the most recently ended first (page
    by page: an experiment can hold more than one page)."""
    client, token = tracking.client(), None
    query = f"tags.`{KIND_TAG}` = 'partition' AND attributes.status = '{FINISHED}'"
    while True:
        page = client.search_runs(
            [experiment_id], query, order_by=["attributes.end_time DESC"], page_token=token
        )
        yield from page
        token = page.token
        if not token:
            return


def _run_scores(tracking: MlflowTracking, experiment: ExperimentConfig, run, directory: Path) -> PartitionScores:
    """A partition run's summary, per-query table, eRAG Table 1, validity table and LLM-specific
    utility Table 1 / overlap, read from its artifacts (``scores/``; a run logged before a table
    existed, or without validity, has none of it)."""
    client = tracking.client()
    summary = client.download_artifacts(run.info.run_id, f"scores/{SUMMARY_ARTIFACT}", str(directory))
    table = client.download_artifacts(run.info.run_id, f"scores/{PER_QUERY_ARTIFACT}", str(directory))
    logged = {Path(f.path).name for f in client.list_artifacts(run.info.run_id, "scores")}
    correlations, validity, transfer, overlap = (
        pl.read_parquet(client.download_artifacts(run.info.run_id, f"scores/{name}", str(directory)))
        if name in logged else None
        for name in (CORRELATIONS_ARTIFACT, VALIDITY_ARTIFACT, TRANSFER_ARTIFACT, OVERLAP_ARTIFACT)
    )
    return PartitionScores(
        setting=experiment.setting(run.data.params["setting"]),
        generator=run.data.params["generator"],
        summary=json.loads(Path(summary).read_text(encoding="utf-8")),
        per_query=validate_scores("metric_scores", pl.read_parquet(table)),
        mlflow_run_id=run.info.run_id,
        correlations=correlations,
        validity=validity,
        transfer=transfer,
        overlap=overlap,
        prompts={name: value for name, value in run.data.params.items() if name in PROMPT_COLUMNS},
    )


def partition_scores(tracking: MlflowTracking, experiment: ExperimentConfig) -> list[PartitionScores]:
    """Every scored setting × generator of ``experiment`` as MLflow holds it: per partition the
    latest FINISHED run that read this config's slice for it (``partition_config_fingerprint``;
    a re-used run ends anew, so a partition scored again with earlier weights counts as current),
    its summary and per-query table from its artifacts."""
    client = tracking.client()
    found: list[PartitionScores] = []
    for dataset in experiment.datasets:
        mlflow_experiment = client.get_experiment_by_name(mlflow_experiment_name(dataset.name))
        if mlflow_experiment is None:
            continue
        slices = {
            partition_run_name(setting.key, generator.name): partition_config_fingerprint(experiment, setting.key, generator.name)
            for setting in experiment.settings() if setting.dataset == dataset.name
            for generator in experiment.generators
        }
        latest: dict[str, object] = {}
        for run in _finished_partition_runs(tracking, mlflow_experiment.experiment_id):
            name = run.info.run_name
            if name in slices and run.data.params.get(PARTITION_CONFIG_PARAM) == slices[name]:
                latest.setdefault(name, run)
        for run in latest.values():
            with tempfile.TemporaryDirectory(prefix="ragutil-compare-") as directory:
                found.append(_run_scores(tracking, experiment, run, Path(directory)))
    return found


COMPARISON = "comparison"
"""The artifact of a dataset's comparison under ``reports/<dataset>/``: its tables and plots."""


@dataclass(frozen=True)
class ComparisonOutcome:
    """Per dataset: the comparison, the directory holding its files, and its MLflow run."""

    comparisons: dict[str, Comparison]
    directories: dict[str, str]
    runs: dict[str, TrackedRun]
    partitions: list[PartitionScores]

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
    """Compare every partition run of ``experiment`` in MLflow, one comparison per dataset. The
    comparison run is keyed by the compared runs, so re-comparing the same runs reuses it."""
    partitions = partition_scores(tracking, experiment)
    if not partitions:
        raise NothingToCompareError(
            f"experiment {experiment.name!r}: no finished metric_scores run of this config in "
            f"{tracking.display_uri} (run `ragutil run` first, or point MLFLOW_TRACKING_URI at the "
            "store the runs were logged to)"
        )
    by_dataset: dict[str, list[PartitionScores]] = {}
    for scores in partitions:
        by_dataset.setdefault(scores.setting.dataset, []).append(scores)
    comparisons, directories, runs = {}, {}, {}
    for dataset, members in by_dataset.items():
        comparison = build_comparison(members, experiment.seed)
        with store.write_files("reports", dataset, COMPARISON) as directory:
            written = write_comparison(comparison, directory)
            compared = sorted((f"{m.setting.key}|{m.generator}", m.mlflow_run_id) for m in members)
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
        comparisons[dataset], directories[dataset] = comparison, store.location("reports", dataset, COMPARISON)
    return ComparisonOutcome(comparisons, directories, runs, partitions)
