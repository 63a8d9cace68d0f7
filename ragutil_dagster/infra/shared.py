"""Files that one process makes and every worker needs — the embedded world and the models trained
for it, GGUF models converted to safetensors — shared through the artifact store.

With ``$RAGUTIL_ARTIFACTS_URL`` set (an object store every machine reaches), the process that
installs, trains or converts such a directory publishes it there once (the commit protocol of
``objectstore.py``), and a process whose ``$RAGUTIL_HOME`` lacks it — a Celery worker on another
machine, or one whose home was wiped — reads the published copy (downloaded once per published
object into ``$RAGUTIL_HOME/cache/artifacts``) instead of installing, training or converting again.
Unset, everything stays under the one ``$RAGUTIL_HOME``, as on one machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from ragutil_dagster.infra.files import embedded_dir, ragutil_home
from ragutil_dagster.infra.objectstore import ARTIFACTS_URL_VARIABLE, ObjectStore, artifact_objects

EMBEDDED_BUILD = "embedded/build"
"""The published copy of ``$RAGUTIL_HOME/embedded`` (the world, its reader and NLIs)."""
DIGEST_SUFFIX = ".digest"
"""Beside a published directory ``<name>``, the record ``<name>.digest`` of its files' digest, so an
unchanged directory is not uploaded again (kept outside: a model's identity hashes its files)."""


def shared_store() -> ObjectStore | None:
    """The artifact store of ``$RAGUTIL_ARTIFACTS_URL``, or None when it is unset (one machine)."""
    url = os.environ.get(ARTIFACTS_URL_VARIABLE)
    return artifact_objects(url, ragutil_home()) if url else None


def _digest(directory: Path) -> str:
    """SHA-256 over the relative names and bytes of every file under ``directory``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(directory).as_posix()}\0{path.stat().st_size}\0".encode())
        with path.open("rb") as handle:
            while chunk := handle.read(8 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def publish_directory(name: str, directory: Path) -> bool:
    """Publish ``directory`` as ``name`` in the shared store unless the same files are published
    there already; True when uploaded. Without a shared store, nothing to do."""
    store = shared_store()
    if store is None:
        return False
    digest, record = _digest(directory), name + DIGEST_SUFFIX
    if (
        store.exists(name)
        and store.exists(record)
        and store.read(record, json.load) == {"digest": digest}
    ):
        return False
    with store.publish(name) as staging:
        shutil.copytree(directory, staging, dirs_exist_ok=True)
    with store.publish(record) as staging:  # after the files: a reader of the files needs none
        (staging / "digest.json").write_text(json.dumps({"digest": digest}))
    return True


def publish_once(name: str, directory: Path) -> bool:
    """Publish ``directory`` as ``name`` — a name that identifies its content, such as a hash —
    unless something is published under ``name`` already; True when uploaded."""
    store = shared_store()
    if store is None or store.exists(name):
        return False
    return publish_directory(name, directory)


def published_directory(name: str) -> Path | None:
    """A local copy of the directory published as ``name`` in the shared store, or None when there
    is no shared store or nothing is published under ``name``."""
    store = shared_store()
    if store is None or not store.exists(name):
        return None
    return store.local_directory(name)


def embedded_build() -> Path:
    """Where the embedded build is for this process: ``$RAGUTIL_HOME/embedded`` when this home holds
    one, else the shared store's published copy when there is one, else ``$RAGUTIL_HOME/embedded``
    (its absence is then reported by whoever reads it)."""
    local = embedded_dir()
    if local.is_dir() and any(local.iterdir()):
        return local
    return published_directory(EMBEDDED_BUILD) or local
