"""``run_file``: the run files of the config's ``kind: run`` retrievers as an observable source
asset, one partition per dataset × run retriever (``world__mine``).

Its data version is the file's SHA-256, so replacing a file marks exactly the settings reading it,
and what follows them, stale — as a new model identity does (assets/model_identities.py); the
model-identity sensor watches run files too (automation.py)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from ragutil_dagster.assets.common import GROUP
from ragutil_dagster.assets.partitions import Partitions
from ragutil_dagster.config import ExperimentConfig
from ragutil_dagster.infra.files import sha256_file

RUN_FILE = dg.AssetKey("run_file")


def observed_run_file(path: Path) -> str:
    """A run file's version: ``sha256:<hex>`` of its bytes, or ``unavailable: <why>`` when it
    cannot be read — observed, never a crash."""
    try:
        return f"sha256:{sha256_file(path)}"
    except OSError as err:
        return f"unavailable: {path}: {err.strerror or err}"


def run_file_versions(experiment: ExperimentConfig) -> dict[str, str]:
    """Every run file's version (:func:`observed_run_file`) by its partition key."""
    return {
        key: observed_run_file(experiment.run_file(dataset, retriever))
        for key, (dataset, retriever) in experiment.run_file_partitions().items()
    }


def build(parts: Partitions) -> list[dg.SourceAsset]:
    experiment = parts.experiment
    if parts.run_file is None:
        return []

    @dg.observable_source_asset(
        key=RUN_FILE,
        partitions_def=parts.run_file,
        group_name=GROUP,
        description="The run file of each run retriever and dataset (its data version: the file's SHA-256).",
    )
    def run_files() -> dg.DataVersionsByPartition:
        return dg.DataVersionsByPartition(run_file_versions(experiment))

    return [run_files]
