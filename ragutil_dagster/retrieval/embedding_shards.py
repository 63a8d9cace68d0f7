"""Passage embeddings computed in shards: contiguous row ranges of one corpus, embedded by separate
processes (the ``passage_embeddings`` Dagster partitions, one GPU each) into one ``.npy`` file
pre-allocated at the corpus's full size, which the index step then opens read-only.

The file lives on a POSIX file system that every shard process mounts — a memory map cannot live
on an object store; on Kubernetes a ReadWriteMany volume — under ``<root>/<version>/``:

- ``embeddings.npy``, float32 ``(rows, dim)``: allocated by whichever shard comes first (made
  under a temporary name and hard-linked into place, which fails for the others: they write into
  the winner's file); each shard writes only its own rows;
- ``shard-<i>-of-<n>.json``, written by shard i once its rows are durable: its row range, the
  corpus fingerprint, the encoder identity and the dimension. The index step builds only when
  every shard's record is there and agrees with what it expects.

``version`` is a hash of what decides the vectors (corpus fingerprint, encoder identity, how a
passage becomes encoder input): the embeddings of another corpus or encoder are in another
directory, never opened, let alone partly overwritten. The number of shards is not part of it (it
does not change the vectors): the records name it, and the index step wants those of its own.
Directories of earlier versions are left in place (delete them by hand; docs/scale.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ragutil_dagster.config import embedding_partition_key, embedding_shard_name
from ragutil_dagster.errors import IncompleteEmbeddingsError, IndexFormatError, IndexMismatchError
from ragutil_dagster.infra.files import create_once, stable_hash, write_text_atomic
from ragutil_dagster.retrieval.dense import (
    DenseConfig,
    TextEncoder,
    allocate_npy,
    embed_rows,
    npy_row_writer,
)

FORMAT_VERSION = 1
EMBEDDINGS_FILE = "embeddings.npy"
# A shard exported for machines that do not share the file (export_shard / import_shard).
SHARD_ROWS_FILE, SHARD_RECORD_FILE = "rows.npy", "record.json"


def shard_rows(shard: int, shards: int, rows: int) -> range:
    """The rows of shard ``shard`` (1-based) of ``shards`` over ``rows`` passages: contiguous, in
    order, their sizes differing by one at most."""
    if not 1 <= shard <= shards:
        raise ValueError(f"shard {shard} of {shards}: shards are numbered 1 to {shards}")
    return range((shard - 1) * rows // shards, shard * rows // shards)


@dataclass(frozen=True)
class ShardedEmbeddings:
    """The embeddings of one corpus (``fingerprint``, ``rows``) by one encoder, in ``shards`` shards
    under ``directory``. ``name`` names the whole (an index partition key): shard i is
    ``<name>__shard-<i>-of-<n>``, its ``passage_embeddings`` partition key."""

    directory: Path
    name: str
    fingerprint: str
    rows: int
    encoder_identity: str
    shards: int

    @classmethod
    def under(
        cls,
        root: str | Path,
        name: str,
        fingerprint: str,
        rows: int,
        encoder_identity: str,
        config: DenseConfig,
        shards: int,
    ) -> ShardedEmbeddings:
        """The embeddings of this corpus, encoder and passage text settings under ``root``."""
        version = stable_hash(
            {
                "format": FORMAT_VERSION,
                "corpus_fingerprint": fingerprint,
                "encoder_identity": encoder_identity,
                "include_title": config.include_title,
                "passage_prefix": config.passage_prefix,
            },
            16,
        )
        return cls(Path(root) / version, name, fingerprint, rows, encoder_identity, shards)

    @property
    def path(self) -> Path:
        return self.directory / EMBEDDINGS_FILE

    def shard_name(self, shard: int) -> str:
        return embedding_partition_key(self.name, shard, self.shards)

    def _record_path(self, shard: int) -> Path:
        return self.directory / f"{embedding_shard_name(shard, self.shards)}.json"

    def _expected_record(self, shard: int) -> dict:
        rows = self.rows_of(shard)
        return {
            "format": FORMAT_VERSION,
            "shard": shard,
            "shards": self.shards,
            "rows": [rows.start, rows.stop],
            "corpus_fingerprint": self.fingerprint,
            "encoder_identity": self.encoder_identity,
        }

    def rows_of(self, shard: int) -> range:
        """The corpus rows shard ``shard`` embeds."""
        return shard_rows(shard, self.shards, self.rows)

    def fill(
        self, shard: int, passages: pl.DataFrame, encoder: TextEncoder, config: DenseConfig
    ) -> range:
        """Embed ``passages`` — the corpus's rows :meth:`rows_of` ``shard``, all a shard step needs
        to read — into the shared file (allocating it when this shard comes first), then record the
        shard done; returns its rows. Shards may run in any order, at the same time, in processes on
        different machines."""
        rows = self.rows_of(shard)
        if passages.height != len(rows):
            raise IndexMismatchError(
                f"{self.shard_name(shard)}: given {passages.height} passages for rows [{rows.start}, {rows.stop}) "
                f"of a corpus of {self.rows}"
            )
        if encoder.identity != self.encoder_identity:
            raise IndexMismatchError(
                f"{self.shard_name(shard)}: given encoder {encoder.identity}, "
                f"expected {self.encoder_identity}"
            )
        record = self._record_path(shard)
        # Its rows are about to be rewritten: the shard is not done until its new record is written.
        record.unlink(missing_ok=True)
        shape = (self.rows, encoder.dim)
        create_once(self.path, lambda temporary: allocate_npy(temporary, shape))
        with npy_row_writer(self.path, shape) as write:
            embed_rows(
                passages,
                encoder,
                config,
                rows.start,
                write,
                label=f"embed {self.shard_name(shard)}",
            )
        write_text_atomic(
            record, json.dumps({**self._expected_record(shard), "dim": encoder.dim}, indent=2)
        )
        return rows

    def is_recorded(self, shard: int) -> bool:
        """Whether shard ``shard``'s rows are in this file, recorded for this corpus and encoder."""
        try:
            recorded = json.loads(self._record_path(shard).read_text())
        except FileNotFoundError:
            return False
        return all(
            recorded.get(key) == value for key, value in self._expected_record(shard).items()
        )

    def export_shard(self, shard: int, directory: Path) -> None:
        """Copy shard ``shard``'s rows (``rows.npy``) and record into ``directory``: for index steps
        on machines that do not mount this file (:meth:`import_shard`)."""
        rows = self.rows_of(shard)
        embeddings = np.load(self.path, mmap_mode="r", allow_pickle=False)
        np.save(directory / SHARD_ROWS_FILE, embeddings[rows.start : rows.stop])
        (directory / SHARD_RECORD_FILE).write_bytes(self._record_path(shard).read_bytes())

    def import_shard(self, shard: int, directory: Path) -> bool:
        """Write the rows and record :meth:`export_shard` put in ``directory`` into this file
        (allocating it when this is the first shard here), unless they were embedded for other
        inputs; True when written."""
        record = json.loads((directory / SHARD_RECORD_FILE).read_text())
        if any(record.get(key) != value for key, value in self._expected_record(shard).items()):
            return False
        vectors = np.load(directory / SHARD_ROWS_FILE, mmap_mode="r", allow_pickle=False)
        shape = (self.rows, int(record["dim"]))
        create_once(self.path, lambda temporary: allocate_npy(temporary, shape))
        with npy_row_writer(self.path, shape) as write:
            write(record["rows"][0], vectors)
        write_text_atomic(self._record_path(shard), json.dumps(record, indent=2))
        return True

    def open(self) -> np.memmap:
        """The finished embeddings, memory-mapped read-only, once every shard has recorded its rows
        for this corpus and encoder; else one :class:`IncompleteEmbeddingsError` naming the shards
        that are missing and those recorded for other inputs."""
        missing, mismatched, dims = [], [], set()
        for shard in range(1, self.shards + 1):
            try:
                recorded = json.loads(self._record_path(shard).read_text())
            except FileNotFoundError:
                missing.append(self.shard_name(shard))
                continue
            expected = self._expected_record(shard)
            differing = [
                f"{key} {recorded.get(key)!r}, expected {value!r}"
                for key, value in expected.items()
                if recorded.get(key) != value
            ]
            if differing:
                mismatched.append(f"{self.shard_name(shard)} ({'; '.join(differing)})")
            dims.add(recorded.get("dim"))
        problems = ([f"not embedded: {', '.join(missing)}"] if missing else []) + (
            [f"embedded for other inputs: {', '.join(mismatched)}"] if mismatched else []
        )
        if problems:
            raise IncompleteEmbeddingsError(
                f"the passage embeddings at {self.directory} are incomplete — {' — '.join(problems)}; "
                "materialise passage_embeddings for those partitions"
            )
        embeddings = np.load(self.path, mmap_mode="r", allow_pickle=False)
        if (
            embeddings.dtype != np.float32
            or embeddings.shape[0] != self.rows
            or dims != {embeddings.shape[1]}
        ):
            raise IndexFormatError(
                f"{self.path}: holds {embeddings.dtype} {embeddings.shape}, but its shards recorded "
                f"{self.rows} rows of dimension {sorted(dims, key=str)}"
            )
        return embeddings
