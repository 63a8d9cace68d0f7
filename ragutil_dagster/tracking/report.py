"""The cross-run comparison of an experiment, end to end: gather every partition run of the
experiment from MLflow — whichever machine logged it — build the tables, write them under
``reports/<experiment>-<fingerprint>/<dataset>/`` and log one comparison run per dataset. Shared by
the ``reports`` asset and ``ragutil compare``. Also the one home of where an experiment's reports
live (:func:`report_artifact`) and of which report folders are superseded
(:func:`superseded_reports`)."""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ragutil_dagster import __version__
from ragutil_dagster.config import SLUG, ExperimentConfig
from ragutil_dagster.errors import NothingToCompareError
from ragutil_dagster.infra.files import stable_hash
from ragutil_dagster.infra.objectstore import Folder, Garbage
from ragutil_dagster.metrics import catalog
from ragutil_dagster.resources.storage import ArtifactStore
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
from ragutil_dagster.tracking.partition_run import (
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


def _run_scores(
    tracking: MlflowTracking, experiment: ExperimentConfig, run, directory: Path
) -> PartitionScores:
    """A partition run's summary, per-query table, eRAG Table 1, validity table and LLM-specific
    utility Table 1 / overlap, read from its artifacts (``scores/``; a run logged before a table
    existed, or without validity, has none of it)."""
    client = tracking.client()
    summary = client.download_artifacts(
        run.info.run_id, f"scores/{SUMMARY_ARTIFACT}", str(directory)
    )
    table = client.download_artifacts(
        run.info.run_id, f"scores/{PER_QUERY_ARTIFACT}", str(directory)
    )
    logged = {Path(f.path).name for f in client.list_artifacts(run.info.run_id, "scores")}
    correlations, validity, transfer, overlap = (
        pl.read_parquet(
            client.download_artifacts(run.info.run_id, f"scores/{name}", str(directory))
        )
        if name in logged
        else None
        for name in (CORRELATIONS_ARTIFACT, VALIDITY_ARTIFACT, TRANSFER_ARTIFACT, OVERLAP_ARTIFACT)
    )
    return PartitionScores(
        setting=experiment.setting(run.data.params["setting"]),
        generator=run.data.params["generator"],
        summary=json.loads(Path(summary).read_text(encoding="utf-8")),
        per_query=catalog.validate_scores("metric_scores", pl.read_parquet(table)),
        mlflow_run_id=run.info.run_id,
        correlations=correlations,
        validity=validity,
        transfer=transfer,
        overlap=overlap,
        prompts={name: value for name, value in run.data.params.items() if name in PROMPT_COLUMNS},
    )


def partition_scores(
    tracking: MlflowTracking, experiment: ExperimentConfig
) -> list[PartitionScores]:
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
            partition_run_name(setting.key, generator.name): partition_config_fingerprint(
                experiment, setting.key, generator.name
            )
            for setting in experiment.settings()
            if setting.dataset == dataset.name
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


REPORTS = "reports"
"""The artifact store's folder of every experiment's reports."""
SUMMARY = "summary"
"""The artifact of an experiment's summary: summary.csv, summary.md and delta_seper_heatmap.png."""
COMPARISON = "comparison"
"""The artifact of a dataset's comparison (under the dataset's name): its tables and plots."""
FINGERPRINT_CHARACTERS = 12


def report_artifact(
    experiment: ExperimentConfig, dataset: str | None = None
) -> tuple[str, str, str]:
    """The artifact store's asset, partition and name of ``experiment``'s summary, or with
    ``dataset`` of that dataset's comparison: ``reports/<name>-<fingerprint>/summary`` and
    ``reports/<name>-<fingerprint>/<dataset>/comparison`` (:data:`FINGERPRINT_CHARACTERS` of
    ``ExperimentConfig.fingerprint``). Keyed by the whole config, so that another config over the
    same datasets never replaces the reports a user was shown, and a re-run of the same config
    replaces its own."""
    folder = f"{experiment.name}-{experiment.fingerprint()[:FINGERPRINT_CHARACTERS]}"
    return REPORTS, folder, SUMMARY if dataset is None else f"{dataset}/{COMPARISON}"


def superseded_reports(store: ArtifactStore, older_than: float, now: float) -> list[Garbage]:
    """The report folders of configs that are no longer the latest of their experiment's name
    (every folder of a name but the one published last), untouched for ``older_than`` seconds
    before ``now`` (the grace period spares a folder a writer is publishing into right now): what
    the user was shown for an earlier version of a config, for ``ragutil clean`` to offer. Folders
    of different names never supersede each other."""
    by_experiment: dict[str, list[Folder]] = {}
    for folder in store.folders(REPORTS):
        name, _, fingerprint = folder.name.rpartition("-")
        # Skipped: a folder with nothing published (a dead writer's objects: the store's own sweep
        # finds them), or no experiment's (a dataset's comparison as ragutil wrote it before
        # 2026-12-02, reports/<dataset>/comparison, is left where it is).
        if (
            folder.published is not None
            and re.fullmatch(SLUG, name)
            and re.fullmatch(f"[0-9a-f]{{{FINGERPRINT_CHARACTERS}}}", fingerprint)
        ):
            by_experiment.setdefault(name, []).append(folder)
    found = []
    for name, folders in sorted(by_experiment.items()):
        *older, latest = sorted(folders, key=lambda folder: folder.published)
        found += [
            Garbage(
                folder.location,
                folder.size,
                f"superseded reports (experiment {name!r} has newer "
                f"ones, of another config: {latest.name})",
                folder.path,
                local=False,
            )
            for folder in older
            if now - folder.modified >= older_than
        ]
    return found


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
        with store.write_files(*report_artifact(experiment, dataset)) as directory:
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
        comparisons[dataset], directories[dataset] = (
            comparison,
            store.location(*report_artifact(experiment, dataset)),
        )
    return ComparisonOutcome(comparisons, directories, runs, partitions)
