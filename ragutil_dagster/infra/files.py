"""Files on the ground floor: atomic writes, canonical JSON and stable hashes, and where
ragutil keeps its state. One implementation of each, read by every layer."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ragutil_dagster.errors import ArtifactWriteError


def ragutil_home() -> Path:
    """Where ragutil keeps state: ``$RAGUTIL_HOME``, else ``.ragutil/`` in the working directory."""
    return Path(os.environ.get("RAGUTIL_HOME", ".ragutil")).expanduser().resolve()


def user_path(path: str) -> Path:
    """A path from the config: ``$VARIABLES`` and ``~`` expanded, relative to the working directory."""
    return Path(os.path.expandvars(path)).expanduser()


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks (a file may run to gigabytes)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def embedded_dir() -> Path:
    """Where the embedded world and the models trained for it live."""
    return ragutil_home() / "embedded"


def embedded_tracking_uri(home: Path) -> str:
    """The embedded MLflow store of a ragutil home (SQLite beside the artifacts)."""
    return f"sqlite:///{Path(home).expanduser().resolve() / 'mlflow.db'}"


def cache_root() -> Path:
    """Where ragutil keeps small per-user caches (``$RAGUTIL_CACHE_DIR`` or XDG cache)."""
    base = os.environ.get("RAGUTIL_CACHE_DIR")
    if base:
        return Path(base).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "ragutil"


def newest_mtime(directory: Path) -> float:
    """The latest modification time of ``directory`` and of everything under it."""
    return max(
        [directory.stat().st_mtime, *(path.stat().st_mtime for path in directory.rglob("*"))]
    )


def tree_size(directory: Path) -> int:
    """The bytes of the files under ``directory``."""
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def canonical_json(data: object) -> bytes:
    """The canonical JSON encoding of ``data``: sorted keys, no spaces, UTF-8; values JSON cannot
    encode are written as their ``str``."""
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    ).encode()


def stable_hash(data: object, length: int = 64) -> str:
    """SHA-256 (hex) of the canonical JSON of ``data``, truncated to ``length`` characters."""
    return hashlib.sha256(canonical_json(data)).hexdigest()[:length]


# Storage failures the user must act on (free space, fix permissions, pick another directory),
# as opposed to bugs: reported as one ArtifactWriteError naming the file.
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS}


@contextmanager
def storage_errors(target: str | Path) -> Iterator[None]:
    """Turn lack of space or permission while writing ``target`` into an :class:`ArtifactWriteError`
    naming it; any other error passes unchanged."""
    try:
        yield
    except OSError as err:
        if err.errno not in _STORAGE_ERRNOS or isinstance(err, ArtifactWriteError):
            raise
        fix = (
            "free disk space there or point RAGUTIL_HOME (RAGUTIL_ARTIFACTS_URL) at a larger disk"
            if err.errno in (errno.ENOSPC, errno.EDQUOT)
            else "check the directory's permissions (the bucket's credentials) or point RAGUTIL_HOME "
            "(RAGUTIL_ARTIFACTS_URL) elsewhere"
        )
        raise ArtifactWriteError(
            err.errno,
            f"cannot write {target}: {os.strerror(err.errno)} ({fix}); the previous "
            "version, if any, is left intact",
        ) from err


@contextmanager
def _temporary_beside(target: Path) -> Iterator[Path]:
    """A fresh temporary file in ``target``'s directory (created if missing), removed when the
    block ends; lack of space or permission inside the block is an :class:`ArtifactWriteError`
    naming ``target``."""
    with storage_errors(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(handle)
    temporary = Path(name)
    try:
        with storage_errors(target):
            yield temporary
    finally:
        temporary.unlink(missing_ok=True)


@contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success it replaces ``target`` in one step,
    on failure it is removed, so readers never see a half-written file. Lack of space or
    permission is an :class:`ArtifactWriteError` naming ``target``."""
    target = Path(target)
    with _temporary_beside(target) as temporary:
        yield temporary
        os.replace(temporary, target)


def create_once(target: str | Path, write: Callable[[Path], None]) -> bool:
    """Put at ``target`` the file ``write(temporary_path)`` makes, unless ``target`` exists; True
    when this call created it. Safe when several processes race to create the same file: the
    first to finish wins whole and the others' files are discarded — a hard link, unlike a
    rename, never replaces an existing file, and is atomic on local and network file systems."""
    target = Path(target)
    if target.exists():
        return False
    with _temporary_beside(target) as temporary:
        write(temporary)
        try:
            os.link(temporary, target)
        except FileExistsError:
            return False
    return True


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


def write_text_atomic(target: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``target`` atomically."""
    write_bytes_atomic(target, text.encode("utf-8"))


def write_bytes_atomic(target: str | Path, data: bytes) -> None:
    """Write ``data`` to ``target`` atomically."""
    atomic_write(target, lambda temporary: temporary.write_bytes(data))
