"""Published artifacts on any fsspec URL (a local directory, ``s3://``, ``gs://``, ``az://``): the
one home of ragutil's commit protocol.

Object stores have no atomic rename (fsspec's ``mv`` is copy + delete there) and a reader
streaming an object in ranged reads while it is overwritten can get bytes of two versions. So an
artifact is never written where readers look:

1. the writer puts its files under a fresh key, ``<name>.<uuid>/`` (nobody reads it yet);
2. it publishes a small manifest, ``<name>.manifest.json``, naming that key and the files' sizes,
   in one single-object write (an object store's PUT, a rename on a local disk), the commit point;
3. it deletes the object the previous manifest named.

Readers read the manifest first and then only the immutable object it names, so they see the old
artifact or the new one whole, never a mix; a writer that dies before step 2 leaves nothing
visible (its unpublished object is garbage, see docs/scale.md). A reader whose object was deleted
by a newer writer between its two reads finds the newer manifest and reads again.
"""

from __future__ import annotations

import errno
import json
import posixpath
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ragutil_dagster.errors import ArtifactStoreError, ArtifactWriteError
from ragutil_dagster.infra.failpoints import failpoint
from ragutil_dagster.infra.files import (
    atomic_directory,
    newest_mtime,
    stable_hash,
    storage_errors,
    tree_size,
    write_bytes_atomic,
)
from ragutil_dagster.infra.redaction import redact_uri

ARTIFACTS_URL_VARIABLE = "RAGUTIL_ARTIFACTS_URL"
"""The artifact store's URL; unset, ``$RAGUTIL_HOME/artifacts``."""
MANIFEST_SUFFIX = ".manifest.json"
# Object stores MLflow's own artifact repositories write to under the same URL as fsspec.
_MLFLOW_SCHEMES = ("s3", "gs")
_FORMAT = 1
# A reader retries this many times when newer writers keep replacing the object it was about to read.
_READ_ATTEMPTS = 5

# An object's key: the artifact's file name and the writer's uuid (``table.parquet.<32 hex>``).
_OBJECT_KEY = re.compile(r".+\.[0-9a-f]{32}")
# Under the cache directory: remote artifacts' files before their upload.
_STAGING = "staging"
# MLflow's run artifacts may live under the same URL (mlflow_artifact_root); never ours to sweep.
_FOREIGN_FOLDERS = ("mlruns",)

T = TypeVar("T")


@dataclass(frozen=True)
class Garbage:
    """What ``ragutil clean`` may delete: where it is, its size, and why nothing needs it."""

    location: str
    size: int
    reason: str
    path: str
    local: bool
    """A directory on this machine's file system (a copy of an object, scratch files), not an object of the store."""


@dataclass(frozen=True)
class Folder:
    """A folder of the store holding artifacts: its name, where it is, its size, when anything in
    it was last written and when an artifact in it was last published."""

    name: str
    """Its name under the folder listed (:meth:`ObjectStore.folders`)."""
    path: str
    location: str
    size: int
    modified: float
    """The modification time of its newest file (a writer's object in progress included)."""
    published: float | None
    """The modification time of its newest manifest; None when nothing in it is published."""


def _modified(info: dict) -> float:
    """A listed file's modification time (seconds since the epoch), whichever fsspec driver listed it."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            return datetime.fromisoformat(value).timestamp()
    raise ArtifactStoreError(f"{info.get('name')}: the store reports no modification time")


def mlflow_artifact_root(url: str) -> str | None:
    """Where MLflow keeps run artifacts beside the artifact store at ``url`` (``<url>/mlruns``),
    or None when MLflow cannot write there itself (a local directory: MLflow's artifacts then stay
    under ``$RAGUTIL_HOME/mlruns``)."""
    scheme, separator, _ = url.partition("://")
    if not separator or scheme not in _MLFLOW_SCHEMES:
        return None
    return f"{url.rstrip('/')}/mlruns"


class ObjectStore:
    """Artifacts under one root URL, each a set of files published together under a name such as
    ``metric_scores/<partition>/table.parquet``. ``cache_dir`` holds local copies of remote
    artifacts that must be files on disk (memory-mapped indexes): objects are immutable, so a copy
    named after its object is never stale."""

    def __init__(self, url: str, cache_dir: str | Path) -> None:
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as err:
            raise ArtifactStoreError(
                f"cannot open the artifact store {redact_uri(url)}: {err} (install the fsspec "
                "driver of its scheme, e.g. s3fs, gcsfs or adlfs, or change RAGUTIL_ARTIFACTS_URL)"
            ) from None
        self.url = url
        self.local = isinstance(self.fs, LocalFileSystem)
        self.cache_dir = Path(cache_dir)

    def _path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def _url(self, path: str) -> str:
        return path if self.local else self.fs.unstrip_protocol(path)

    def display(self, name: str) -> str:
        """Where artifact ``name`` lives, for messages (credentials masked)."""
        return redact_uri(self._url(self._path(name)))

    def manifest(self, name: str) -> dict | None:
        """The published manifest of ``name``, or None when nothing is published under it."""
        try:
            raw = self.fs.cat_file(self._path(name + MANIFEST_SUFFIX))
        except FileNotFoundError:
            return None
        return json.loads(raw)

    def exists(self, name: str) -> bool:
        return self.manifest(name) is not None

    def location(self, name: str) -> str:
        """The URL of the object ``name``'s manifest names (its files are under it)."""
        return self._url(self._path(posixpath.dirname(name), self._published(name)["object"]))

    def _published(self, name: str) -> dict:
        manifest = self.manifest(name)
        if manifest is None:
            raise FileNotFoundError(f"nothing is published at {self.display(name)}")
        return manifest

    @contextmanager
    def publish(self, name: str) -> Iterator[Path]:
        """Yield an empty local directory; the files written into it become artifact ``name`` when
        the block ends without error (on failure nothing is published and the previous version,
        if any, stays). Lack of space or permission is an :class:`ArtifactWriteError`."""
        folder = posixpath.dirname(name)
        object_name = f"{posixpath.basename(name)}.{uuid.uuid4().hex}"
        target = self._path(folder, object_name)
        # On a local disk the unpublished object is written in place; elsewhere it is staged on
        # local disk and uploaded (writers such as FAISS and matplotlib need a real file).
        staging = Path(target) if self.local else self._staging_directory()
        with storage_errors(self.display(name)):
            staging.mkdir(parents=True, exist_ok=True)
        try:
            with storage_errors(self.display(name)):
                yield staging
            files = {
                path.relative_to(staging).as_posix(): path.stat().st_size
                for path in sorted(staging.rglob("*"))
                if path.is_file()
            }
            with storage_errors(self.display(name)), self._remote_errors(name):
                if not self.local:
                    self.fs.put(
                        [str(staging / file) for file in files],
                        [posixpath.join(target, file) for file in files],
                    )
                failpoint("publish")
                previous = self.manifest(name)
                manifest = {"format": _FORMAT, "object": object_name, "files": files}
                self._write_single_object(
                    self._path(name + MANIFEST_SUFFIX), json.dumps(manifest).encode()
                )
        except BaseException:
            self._remove(target)
            raise
        finally:
            if not self.local:
                shutil.rmtree(staging, ignore_errors=True)
        if previous is not None and previous["object"] != object_name:
            self._remove(self._path(folder, previous["object"]))

    def _staging_directory(self) -> Path:
        """A fresh local directory where a remote artifact's files are written before upload
        (under the cache directory, where ``ragutil clean`` finds those of writers that died)."""
        root = self.cache_dir / _STAGING
        root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="publish-", dir=root))

    @contextmanager
    def _remote_errors(self, name: str) -> Iterator[None]:
        """An object store's refusal (no such bucket, access denied) as one ArtifactWriteError."""
        try:
            yield
        except (FileNotFoundError, PermissionError) as err:
            if self.local:
                raise
            raise ArtifactWriteError(
                errno.EACCES,
                f"cannot write {self.display(name)}: {err} (create the bucket, give these "
                "credentials write access, or change RAGUTIL_ARTIFACTS_URL); nothing was published",
            ) from err

    def _write_single_object(self, path: str, data: bytes) -> None:
        """The commit point: one object replaced whole (a rename locally, a PUT on object stores)."""
        if self.local:
            write_bytes_atomic(path, data)
        else:
            self.fs.pipe_file(path, data)

    def _remove(self, path: str) -> None:
        try:
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass

    def remove(self, name: str) -> None:
        """Unpublish ``name`` (the manifest first, so readers never see a manifest without data)."""
        manifest = self.manifest(name)
        if manifest is None:
            return
        self._remove(self._path(name + MANIFEST_SUFFIX))
        self._remove(self._path(posixpath.dirname(name), manifest["object"]))

    def folders(self, parent: str) -> list[Folder]:
        """Every folder directly under ``parent`` (a leading part of artifact names, e.g.
        ``reports``), by name; none when nothing was ever written there."""
        root = self._path(parent)
        found: dict[str, tuple[int, float, float | None]] = {}
        for path, info in self.fs.find(root, detail=True).items():
            parts = posixpath.relpath(path, root).split("/")
            if len(parts) < 2:  # a file beside the folders
                continue
            size, modified, published = found.get(parts[0], (0, 0.0, None))
            written = _modified(info)
            if path.endswith(MANIFEST_SUFFIX):
                published = max(published or 0.0, written)
            found[parts[0]] = (size + int(info.get("size") or 0), max(modified, written), published)
        return [
            Folder(name, self._path(parent, name), self._url(self._path(parent, name)), *figures)
            for name, figures in sorted(found.items())
        ]

    def garbage(self, older_than: float, now: float) -> list[Garbage]:
        """Objects no manifest names — left by writers that died before publishing, or that lost a
        race to publish one artifact — and local copies of objects no manifest names any more,
        each untouched for ``older_than`` seconds before ``now``. The grace period spares objects
        being uploaded right now: it must exceed the longest upload."""
        root = self.root.rstrip("/")
        entries = self.fs.find(root, withdirs=True, detail=True)
        manifests = sorted(
            path
            for path, info in entries.items()
            if info["type"] == "file" and path.endswith(MANIFEST_SUFFIX)
        )
        named = {
            path: json.loads(raw)["object"]
            for path, raw in (self.fs.cat(manifests) if manifests else {}).items()
        }
        published = {posixpath.join(posixpath.dirname(path), key) for path, key in named.items()}
        copies = {
            self._copy_name(posixpath.relpath(path[: -len(MANIFEST_SUFFIX)], root), key)
            for path, key in named.items()
        }
        objects: dict[str, tuple[int, float]] = {}
        for path, info in entries.items():
            parts = posixpath.relpath(path, root).split("/")
            is_file = info["type"] == "file"
            # A directory counts by its own time only where the store keeps one (local disks do;
            # an object store's "directories" are prefixes): an object a writer left empty.
            if parts[0] in _FOREIGN_FOLDERS or (not is_file and info.get("mtime") is None):
                continue
            depth = next(
                (
                    i
                    for i, part in enumerate(parts[:-1] if is_file else parts)
                    if _OBJECT_KEY.fullmatch(part)
                ),
                None,
            )
            if depth is None:
                continue
            key = posixpath.join(root, *parts[: depth + 1])
            size, modified = objects.get(key, (0, 0.0))
            objects[key] = (
                size + (int(info.get("size") or 0) if is_file else 0),
                max(modified, _modified(info)),
            )
        found = [
            Garbage(
                self._url(key),
                size,
                "unpublished object (its writer died or lost a race)",
                key,
                local=False,
            )
            for key, (size, modified) in sorted(objects.items())
            if key not in published and now - modified >= older_than
        ]
        local = [
            (entry, "local copy of a replaced or removed object")
            for entry in _directories(self.cache_dir)
            if entry.name != _STAGING and entry.name not in copies
        ]
        local += [
            (entry, "staged files of a writer that died before uploading")
            for entry in _directories(self.cache_dir / _STAGING)
        ]
        return found + [
            Garbage(str(entry), tree_size(entry), reason, str(entry), local=True)
            for entry, reason in local
            if now - newest_mtime(entry) >= older_than
        ]

    def delete(self, garbage: Garbage) -> None:
        """Delete what :meth:`garbage` found."""
        if garbage.local:
            shutil.rmtree(garbage.path, ignore_errors=True)
        else:
            self._remove(garbage.path)

    def _with_published(self, name: str, use: Callable[[dict], T]) -> T:
        """``use(manifest)``, read again from a newer manifest when a writer deleted the object
        between reading the manifest and reading the object."""
        for _ in range(_READ_ATTEMPTS):
            manifest = self._published(name)
            try:
                return use(manifest)
            except FileNotFoundError:
                if self.manifest(name) == manifest:
                    raise
        raise ArtifactStoreError(f"{self.display(name)} kept changing while being read; try again")

    def read(self, name: str, reader: Callable[[IO[bytes]], T], file: str | None = None) -> T:
        """``reader`` applied to one published file of ``name`` (its only file when not named)."""

        def use(manifest: dict) -> T:
            chosen = file or _only_file(manifest, self.display(name))
            with self.fs.open(
                self._path(posixpath.dirname(name), manifest["object"], chosen), "rb"
            ) as handle:
                return reader(handle)

        return self._with_published(name, use)

    def _copy_name(self, name: str, object_key: str) -> str:
        """The directory under ``cache_dir`` holding the local copy of object ``object_key`` of ``name``."""
        return stable_hash([self.url, name, object_key], 32)

    def local_directory(self, name: str) -> Path:
        """A local directory holding the published files of ``name``: the object itself on a local
        disk, else a downloaded copy in ``cache_dir`` (made once per object)."""

        def use(manifest: dict) -> Path:
            source = self._path(posixpath.dirname(name), manifest["object"])
            if self.local:
                return Path(source)
            copy = self.cache_dir / self._copy_name(name, manifest["object"])
            if not copy.is_dir():
                with atomic_directory(copy) as staging:
                    files = list(manifest["files"])
                    for file in files:
                        (staging / file).parent.mkdir(parents=True, exist_ok=True)
                    self.fs.get(
                        [posixpath.join(source, f) for f in files],
                        [str(staging / f) for f in files],
                    )
            return copy

        return self._with_published(name, use)


def artifact_objects(url: str, home: str | Path) -> ObjectStore:
    """The artifact store of a ragutil home: ``url``, or ``<home>/artifacts`` when empty; local
    copies of remote objects under ``<home>/cache/artifacts``."""
    home = Path(home).expanduser()
    return ObjectStore(url or str(home / "artifacts"), home / "cache" / "artifacts")


def _directories(folder: Path) -> list[Path]:
    return sorted(entry for entry in folder.iterdir() if entry.is_dir()) if folder.is_dir() else []


def _only_file(manifest: dict, where: str) -> str:
    files = list(manifest["files"])
    if len(files) != 1:
        raise ValueError(f"{where} holds {len(files)} files; name the one to read")
    return files[0]
