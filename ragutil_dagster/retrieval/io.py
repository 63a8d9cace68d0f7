"""The JSON manifests saved next to every index."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from ragutil_dagster.data.corpus import corpus_fingerprint
from ragutil_dagster.errors import IndexFormatError, IndexMismatchError
from ragutil_dagster.infra.files import atomic_write

MANIFEST_NAME = "manifest.json"


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` into an index directory."""
    atomic_write(
        directory / MANIFEST_NAME,
        lambda path: path.write_text(
            json.dumps(manifest, indent=2, sort_keys=True), encoding="utf-8"
        ),
    )


def read_manifest(directory: str | Path, kind: str, format_version: int) -> dict[str, Any]:
    """Read an index manifest and check it describes an index of ``kind`` ("bm25" or "dense")
    written in ``format_version``."""
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        raise IndexFormatError(
            f"{directory}: no {MANIFEST_NAME}; not a saved index, or saving did not finish"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IndexFormatError(f"{path}: unreadable manifest ({exc})") from exc
    if manifest.get("kind") != kind:
        raise IndexFormatError(f"{path}: a {manifest.get('kind')!r} index, expected {kind!r}")
    if manifest.get("format_version") != format_version:
        raise IndexFormatError(
            f"{path}: index format version {manifest.get('format_version')}, this code reads {format_version}"
        )
    return manifest


def check_corpus(
    manifest: dict[str, Any], corpus: pl.DataFrame | Mapping[str, Any], directory: Path
) -> None:
    """Raise :class:`IndexMismatchError` unless ``corpus`` is the one the index was built from.

    ``corpus`` is the passage table, hashed here, or its record (``data.corpus.corpus_record``:
    ``rows`` and ``fingerprint``), as the corpus asset wrote it once: a Wikipedia-scale corpus is
    then neither read nor hashed again at every index load."""
    if isinstance(corpus, pl.DataFrame):
        rows, fingerprint = corpus.height, None
    else:
        rows, fingerprint = corpus["rows"], corpus["fingerprint"]
    if rows != manifest["size"]:
        raise IndexMismatchError(
            f"{directory}: index built over {manifest['size']} passages, given a corpus of {rows}; "
            "rebuild the index for this corpus"
        )
    fingerprint = fingerprint or corpus_fingerprint(corpus)
    if fingerprint != manifest["corpus_fingerprint"]:
        raise IndexMismatchError(
            f"{directory}: index built from corpus {manifest['corpus_fingerprint']}, given corpus {fingerprint} "
            "(same size, different ids or texts); rebuild the index for this corpus"
        )
