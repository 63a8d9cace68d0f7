"""Atomic file writing and the JSON manifests saved next to every index."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl

from ragutil_dagster.retrieval.corpus import corpus_fingerprint
from ragutil_dagster.retrieval.errors import IndexFormatError, IndexMismatchError

MANIFEST_NAME = "manifest.json"


# Storage failures the user must act on (free space, fix permissions, pick another directory),
# as opposed to bugs: reported as one ArtifactWriteError naming the file.
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS}


class ArtifactWriteError(OSError):
    """A file could not be written for lack of space or permission; names the file and the fix."""


@contextmanager
def _storage_errors(target: Path) -> Iterator[None]:
    try:
        yield
    except OSError as err:
        if err.errno not in _STORAGE_ERRNOS or isinstance(err, ArtifactWriteError):
            raise
        fix = ("free disk space there or point RAGUTIL_HOME at a larger disk"
               if err.errno in (errno.ENOSPC, errno.EDQUOT)
               else "check the directory's permissions or point RAGUTIL_HOME elsewhere")
        raise ArtifactWriteError(
            err.errno, f"cannot write {target}: {os.strerror(err.errno)} ({fix}); the previous "
            "version, if any, is left intact"
        ) from err


@contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success it replaces ``target`` in one step,
    on failure it is removed, so readers never see a half-written file. Lack of space or
    permission is an :class:`ArtifactWriteError` naming ``target``."""
    target = Path(target)
    with _storage_errors(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(handle)
    temporary = Path(name)
    try:
        with _storage_errors(target):
            yield temporary
            os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def atomic_write(target: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write(temporary_path)`` and move the result onto ``target`` atomically."""
    with atomic_path(target) as temporary:
        write(temporary)


@contextmanager
def atomic_directory(target: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``target``; on success it takes ``target``'s place
    (an existing ``target`` is replaced), on failure it is deleted and ``target`` is untouched."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        yield temporary
        if target.exists():
            retired = Path(
                tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".old")
            )
            os.replace(target, retired / "index")
            os.replace(temporary, target)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(temporary, target)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


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


def check_corpus(manifest: dict[str, Any], corpus: pl.DataFrame, directory: Path) -> None:
    """Raise :class:`IndexMismatchError` unless ``corpus`` is the one the index was built from."""
    if corpus.height != manifest["size"]:
        raise IndexMismatchError(
            f"{directory}: index built over {manifest['size']} passages, given a corpus of {corpus.height}; "
            "rebuild the index for this corpus"
        )
    fingerprint = corpus_fingerprint(corpus)
    if fingerprint != manifest["corpus_fingerprint"]:
        raise IndexMismatchError(
            f"{directory}: index built from corpus {manifest['corpus_fingerprint']}, given corpus {fingerprint} "
            "(same size, different ids or texts); rebuild the index for this corpus"
        )
