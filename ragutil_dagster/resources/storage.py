"""Artifact storage: every asset's tables (Parquet through polars), records (JSON) and file sets
(indexes, plots, reports), published through :mod:`ragutil_dagster.infra.objectstore` under
``$RAGUTIL_ARTIFACTS_URL`` (any fsspec URL), by default ``$RAGUTIL_HOME/artifacts``; and the
working files several step processes write into in place (``$RAGUTIL_SCRATCH_DIR``)."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import polars as pl
import pyarrow.parquet as pq
from dagster import ConfigurableResource

from ragutil_dagster.infra.failpoints import failpoint
from ragutil_dagster.infra.files import newest_mtime, tree_size
from ragutil_dagster.infra.objectstore import Folder, Garbage, ObjectStore, artifact_objects

SCRATCH_DIR_VARIABLE = "RAGUTIL_SCRATCH_DIR"
"""A directory on a POSIX file system for working files that cannot live on an object store (the
passage embeddings, memory-mapped and filled in place by several shard steps); unset,
``$RAGUTIL_HOME/scratch``. Every step process must see the same directory: on Kubernetes it must be
a shared volume (ReadWriteMany) mounted in every step pod."""


def _parquet_rows(handle: IO[bytes], rows: range) -> pl.DataFrame:
    """Rows ``rows`` of the Parquet file ``handle``, reading only the row groups that hold them."""
    if rows.step != 1:
        raise ValueError(f"rows must be a contiguous range, got {rows}")
    parquet = pq.ParquetFile(handle)
    groups, first_row, group_start = [], None, 0
    for group in range(parquet.num_row_groups):
        group_rows = parquet.metadata.row_group(group).num_rows
        if group_start < rows.stop and group_start + group_rows > rows.start:
            groups.append(group)
            first_row = group_start if first_row is None else first_row
        group_start += group_rows
    if not groups:
        return pl.from_arrow(parquet.schema_arrow.empty_table())
    table = pl.from_arrow(parquet.read_row_groups(groups))
    return table.slice(rows.start - first_row, len(rows))


def _safe(part: str) -> str:
    return part.replace("|", "__gen__").replace("/", "_")


class ArtifactStore(ConfigurableResource):
    """Where every asset keeps its outputs: artifact ``<asset>/<partition>/<file>`` under ``url``
    (``<home>/artifacts`` when empty), published whole or not at all, so a reader never sees half
    a table and a killed run leaves the previous version intact. ``scratch`` (``<home>/scratch``
    when empty) holds the working files of :meth:`scratch_directory`.
    """

    home: str
    url: str = ""
    scratch: str = ""

    @property
    def _objects(self) -> ObjectStore:
        return artifact_objects(self.url, self.home)

    @staticmethod
    def artifact_name(asset: str, partition: str | None, file: str) -> str:
        """The object store's name of an asset's artifact: ``<asset>/<partition>/<file>``."""
        return "/".join([asset, *([_safe(partition)] if partition else []), file])

    def write_table(
        self, asset: str, partition: str | None, frame: pl.DataFrame, name: str = "table"
    ) -> str:
        """Publish ``frame`` as ``<name>.parquet``; returns where it landed."""
        file = f"{name}.parquet"
        store = self._objects
        with store.publish(self.artifact_name(asset, partition, file)) as staging:
            frame.write_parquet(staging / file)
            failpoint("parquet_write")
        return f"{store.location(self.artifact_name(asset, partition, file))}/{file}"

    def has_table(self, asset: str, partition: str | None, name: str = "table") -> bool:
        return self._objects.exists(self.artifact_name(asset, partition, f"{name}.parquet"))

    def read_table(
        self, asset: str, partition: str | None, name: str = "table", rows: range | None = None
    ) -> pl.DataFrame:
        """The table, or only its ``rows`` (a contiguous range, cut short like a slice at the
        table's end): then only the Parquet row groups holding them are fetched, so a step that
        needs one shard of a 21M-passage corpus does not read all of it."""
        artifact = self.artifact_name(asset, partition, f"{name}.parquet")
        store = self._objects
        if not store.exists(artifact):
            where = f"{asset}[{partition}]" if partition else asset
            raise FileNotFoundError(
                f"{where} has no '{name}' table at {store.display(artifact)}: materialise {asset} first"
            )
        if rows is None:
            return store.read(artifact, lambda handle: pl.read_parquet(io.BytesIO(handle.read())))
        return store.read(artifact, lambda handle: _parquet_rows(handle, rows))

    def delete_table(self, asset: str, partition: str | None, name: str = "table") -> None:
        self._objects.remove(self.artifact_name(asset, partition, f"{name}.parquet"))

    def write_json(self, asset: str, partition: str | None, name: str, data: Any) -> str:
        """Publish ``data`` as ``<name>.json``; returns where it landed."""
        file = f"{name}.json"
        store = self._objects
        with store.publish(self.artifact_name(asset, partition, file)) as staging:
            (staging / file).write_text(json.dumps(data, indent=2, sort_keys=True))
        return f"{store.location(self.artifact_name(asset, partition, file))}/{file}"

    def has_json(self, asset: str, partition: str | None, name: str) -> bool:
        return self._objects.exists(self.artifact_name(asset, partition, f"{name}.json"))

    def read_json(self, asset: str, partition: str | None, name: str) -> Any:
        artifact = self.artifact_name(asset, partition, f"{name}.json")
        store = self._objects
        if not store.exists(artifact):
            raise FileNotFoundError(
                f"{asset}[{partition}] has no '{name}' record at {store.display(artifact)}"
            )
        return store.read(artifact, json.load)

    @contextmanager
    def write_files(self, asset: str, partition: str | None, name: str) -> Iterator[Path]:
        """Yield an empty local directory whose files are published as artifact ``name`` (an index,
        plots, reports) when the block ends without error."""
        with self._objects.publish(self.artifact_name(asset, partition, name)) as staging:
            yield staging

    def local_files(self, asset: str, partition: str | None, name: str) -> Path:
        """A local directory holding the published files of artifact ``name`` (on a remote store a
        copy under ``<home>/cache/artifacts``); a table or record's name includes its suffix."""
        return self._objects.local_directory(self.artifact_name(asset, partition, name))

    @property
    def _scratch_root(self) -> Path:
        return Path(self.scratch or Path(self.home) / "scratch").expanduser()

    @property
    def scratch_is_shared(self) -> bool:
        """Whether every step process sees the same scratch directory: a declared
        ``$RAGUTIL_SCRATCH_DIR`` (a shared mount), or artifacts under the home, i.e. one machine.
        With an artifact store URL and the default scratch under each process's own home (Celery
        workers on several machines), files another step needs go through the store instead."""
        return bool(self.scratch) or not self.url

    def scratch_directory(self, asset: str, partition: str) -> Path:
        """The working directory of an asset's partition on a POSIX file system: for files that are
        memory-mapped and written in place by several processes, which the store cannot publish.
        Its user keeps one sub-directory per version of what it holds, named by content; the
        newest is the current one (:meth:`garbage` offers the others)."""
        return self._scratch_root / asset / _safe(partition)

    def garbage(self, older_than: float, now: float | None = None) -> list[Garbage]:
        """What nothing needs any more, untouched for ``older_than`` seconds: the object store's
        unpublished objects and stale local copies (:meth:`ObjectStore.garbage`), and every
        scratch version but the newest of each partition."""
        now = time.time() if now is None else now
        found = self._objects.garbage(older_than, now)
        for partition in sorted(self._scratch_root.glob("*/*")):
            versions = sorted(
                (newest_mtime(entry), entry) for entry in partition.iterdir() if entry.is_dir()
            )
            found += [
                Garbage(
                    str(version),
                    tree_size(version),
                    "superseded working files (a newer version is beside them)",
                    str(version),
                    local=True,
                )
                for modified, version in versions[:-1]
                if now - modified >= older_than
            ]
        return found

    def folders(self, asset: str) -> list[Folder]:
        """The folders under ``<asset>/`` (its partitions, or whatever its writer names them)."""
        return self._objects.folders(asset)

    def delete(self, garbage: Garbage) -> None:
        """Delete what :meth:`garbage` (or another sweep of this store) found."""
        self._objects.delete(garbage)

    def location(self, asset: str, partition: str | None, name: str) -> str:
        """The URL under which artifact ``name``'s published files are."""
        return self._objects.location(self.artifact_name(asset, partition, name))
