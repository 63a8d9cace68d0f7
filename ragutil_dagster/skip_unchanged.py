"""Which partitions ``ragutil run`` may skip: those whose inputs are the ones they were last
materialised from.

A step's partition (the assets one Dagster run of :func:`runner.plan` materialises) has three
input versions, stored as tags of the Dagster run that materialises it (:data:`VERSION_TAGS`):

- code: a hash of the package's source files and of the libraries that change results
  (``infra/versions.py``);
- config: the slice of the config the partition reads (``ExperimentConfig.partition_fingerprint``);
- models: the identities of the models and run files it reads, found through its declared
  dependencies on their observable source assets (``assets/model_identities.py``,
  ``assets/run_files.py``), partition to partition.

It is skipped when all three are unchanged, every artifact path its materialisations recorded
still exists, and no parent partition was materialised after it. Otherwise it runs, with the
first reason of :class:`Decision` that applies.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import fsspec

import ragutil_dagster
from ragutil_dagster.assets.model_identities import model_versions
from ragutil_dagster.assets.run_files import RUN_FILE, run_file_versions
from ragutil_dagster.config import ExperimentConfig
from ragutil_dagster.infra.files import stable_hash
from ragutil_dagster.infra.versions import library_versions
from ragutil_dagster.metrics import catalog

VERSION_TAGS = {
    "code": "ragutil/code_version",
    "config": "ragutil/config_version",
    "models": "ragutil/model_version",
}
"""Each input version → the tag of the Dagster run recording it."""

CHANGED = {"code": "code changed", "config": "config changed", "models": "model changed"}
MISSING, NO_VERSIONS, FORCED = "missing", "inputs not recorded", "forced"


@functools.cache
def code_version() -> str:
    """Hash of every ``.py`` file of the package (path and bytes), of the versions of the
    libraries that change results and of the metrics registered in the catalogue."""
    package = Path(ragutil_dagster.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(
            path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0"
        )
    return stable_hash(
        {
            "source": digest.hexdigest(),
            "libraries": library_versions(),
            "registered_metrics": catalog.registered_fingerprint(),
        },
        16,
    )


@dataclass(frozen=True)
class Decision:
    """Whether a step's partition runs: ``reason`` is None when it is skipped (unchanged)."""

    reason: str | None
    tags: dict[str, str]
    """Its input versions (:data:`VERSION_TAGS`), to tag the run materialising it."""


class Freshness:
    """The decisions of one ``ragutil run``: model identities are resolved once, each asset
    partition's latest materialisation is read once (and again after its step ran)."""

    def __init__(
        self,
        defs: dg.Definitions,
        experiment: ExperimentConfig,
        instance: dg.DagsterInstance,
        models,
        force: bool = False,
    ) -> None:
        self.graph = defs.resolve_asset_graph()
        self.experiment, self.instance, self.models, self.force = (
            experiment,
            instance,
            models,
            force,
        )
        self._records: dict[tuple[dg.AssetKey, str | None], dg.EventLogRecord | None] = {}
        self._run_tags: dict[str, dict[str, str]] = {}

    @functools.cached_property
    def source_versions(self) -> dict[dg.AssetKey, dict[str | None, str]]:
        """The data version of every model identity and run file partition, as observing them reports."""
        return {
            **model_versions(self.experiment, self.models),
            RUN_FILE: run_file_versions(self.experiment),
        }

    def decide(self, names: list[str], key: str | None) -> Decision:
        """Whether the step materialising ``names`` runs for partition ``key``, and why."""
        keys = [dg.AssetKey.from_user_string(name) for name in names]
        tags = self.versions(keys, key)
        if self.force:
            return Decision(FORCED, tags)
        records = [self._latest(asset, key) for asset in keys]
        if any(record is None or not _artifacts_exist(record) for record in records):
            return Decision(MISSING, tags)
        for record in records:
            recorded = self._tags(record.run_id)
            if not all(tag in recorded for tag in VERSION_TAGS.values()):
                return Decision(NO_VERSIONS, tags)
            for version, tag in VERSION_TAGS.items():
                if recorded[tag] != tags[tag]:
                    return Decision(CHANGED[version], tags)
        for asset, record in zip(keys, records):
            if newer := self._newer_parent(asset, key, record.timestamp, set(keys)):
                return Decision(f"upstream newer ({newer})", tags)
        return Decision(None, tags)

    def ran(self, names: list[str], key: str | None) -> None:
        """Forget what was read of a step's partition that has just been materialised again."""
        for name in names:
            self._records.pop((dg.AssetKey.from_user_string(name), key), None)

    def versions(self, keys: list[dg.AssetKey], key: str | None) -> dict[str, str]:
        """The input versions of the partition ``key`` of the step materialising ``keys``."""
        partitions = self.graph.get(keys[0]).partitions_def
        if isinstance(partitions, dg.MultiPartitionsDefinition):
            parts = list(partitions.get_partition_key_from_str(key).keys_by_dimension.values())
        else:
            parts = None if key is None else [key]
        models = {
            f"{parent.to_user_string()}[{partition}]"
            if partition
            else parent.to_user_string(): versions[partition]
            for asset in keys
            for parent, partitions in self._parents(asset, key).items()
            if (versions := self.source_versions.get(parent)) is not None
            for partition in partitions
        }
        return {
            VERSION_TAGS["code"]: code_version(),
            VERSION_TAGS["config"]: self.experiment.partition_fingerprint(parts),
            VERSION_TAGS["models"]: stable_hash(models, 16),
        }

    def _parents(self, asset: dg.AssetKey, key: str | None) -> dict[dg.AssetKey, list[str | None]]:
        """Every parent of ``asset`` → the partitions of it that partition ``key`` reads."""
        found = {}
        for parent in self.graph.get(asset).parent_keys:
            if self.graph.get(parent).partitions_def is None:
                found[parent] = [None]
            else:
                mapped = self.graph.get_parent_partition_keys_for_child(key, parent, asset)
                found[parent] = [str(p) for p in mapped.partitions_subset.get_partition_keys()]
        return found

    def _newer_parent(
        self, asset: dg.AssetKey, key: str | None, since: float, step: set[dg.AssetKey]
    ) -> str | None:
        """A parent partition materialised after ``since`` (outside the step itself), if any: the
        first in asset-key order, so the reason a step gives is the same on every run."""
        for parent, partitions in sorted(
            self._parents(asset, key).items(), key=lambda item: item[0].to_user_string()
        ):
            if parent in step or not self.graph.get(parent).is_materializable:
                continue
            for partition in partitions:
                record = self._latest(parent, partition)
                if record is not None and record.timestamp > since:
                    return (
                        f"{parent.to_user_string()}[{partition}]"
                        if partition
                        else parent.to_user_string()
                    )
        return None

    def _latest(self, asset: dg.AssetKey, key: str | None) -> dg.EventLogRecord | None:
        if (asset, key) not in self._records:
            records = self.instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=asset, asset_partitions=[key] if key else None),
                limit=1,
            ).records
            self._records[asset, key] = records[0] if records else None
        return self._records[asset, key]

    def _tags(self, run_id: str) -> dict[str, str]:
        if run_id not in self._run_tags:
            run = self.instance.get_run_by_id(run_id)
            self._run_tags[run_id] = dict(run.tags) if run else {}
        return self._run_tags[run_id]


def _artifacts_exist(record: dg.EventLogRecord) -> bool:
    """Whether every path a materialisation recorded (its tables, index, embeddings) is still there."""
    metadata = record.asset_materialization.metadata if record.asset_materialization else {}
    for value in metadata.values():
        if isinstance(value, dg.PathMetadataValue):
            fs, path = fsspec.core.url_to_fs(value.path)
            if not fs.exists(path):
                return False
    return True
