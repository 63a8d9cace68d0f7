"""Artifact storage: Parquet tables written through polars atomically, and index directories,
under ``$RAGUTIL_HOME/artifacts``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
from dagster import ConfigurableResource

from ragutil_dagster.failpoints import failpoint
from ragutil_dagster.files import atomic_write


def _safe(part: str) -> str:
    return part.replace("|", "__gen__").replace("/", "_")


class ArtifactStore(ConfigurableResource):
    """Where every asset keeps its outputs: ``<home>/artifacts/<asset>/<partition>/<name>.parquet``.

    Writes go to a temporary file renamed into place, so a reader never sees half a table and a
    killed run leaves the previous version intact.
    """

    home: str

    def directory(self, asset: str, partition: str | None = None) -> Path:
        path = Path(self.home).expanduser() / "artifacts" / asset
        return path / _safe(partition) if partition else path

    def table_path(self, asset: str, partition: str | None, name: str = "table") -> Path:
        return self.directory(asset, partition) / f"{name}.parquet"

    def write_table(self, asset: str, partition: str | None, frame: pl.DataFrame, name: str = "table") -> Path:
        path = self.table_path(asset, partition, name)

        def write(temporary: Path) -> None:
            frame.write_parquet(temporary)
            failpoint("parquet_write")

        atomic_write(path, write)
        return path

    def read_table(self, asset: str, partition: str | None, name: str = "table") -> pl.DataFrame:
        path = self.table_path(asset, partition, name)
        if not path.is_file():
            where = f"{asset}[{partition}]" if partition else asset
            raise FileNotFoundError(f"{where} has no '{name}' table at {path}: materialise {asset} first")
        return pl.read_parquet(path)

    def write_json(self, asset: str, partition: str | None, name: str, data: Any) -> Path:
        path = self.directory(asset, partition) / f"{name}.json"
        atomic_write(path, lambda temporary: temporary.write_text(json.dumps(data, indent=2, sort_keys=True)))
        return path

    def read_json(self, asset: str, partition: str | None, name: str) -> Any:
        path = self.directory(asset, partition) / f"{name}.json"
        if not path.is_file():
            raise FileNotFoundError(f"{asset}[{partition}] has no '{name}' record at {path}")
        return json.loads(path.read_text())
