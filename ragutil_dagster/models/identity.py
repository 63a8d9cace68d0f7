"""Model identity and availability.

A model is named either by a Hugging Face hub id (plus an optional revision) or by a local
directory. Its *identity* is what every cache keys on and what drives re-evaluation when a
model changes:

* hub id → the resolved commit hash of the snapshot in the local HF cache;
* local directory → ``"sha256:<hex>"``, a fingerprint of the directory's file names, sizes and
  contents (memoised per process and on disk, keyed by the files' sizes and mtimes, so a
  multi-gigabyte checkpoint is hashed once, not on every call).

When the hub is unreachable (or ``HF_HUB_OFFLINE=1``) and the model is not cached, or a named
directory does not exist, :func:`resolve_model` raises :class:`ModelUnavailableError` at once,
with a message naming the model and how to provide it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from ragutil_dagster.errors import ModelUnavailableError
from ragutil_dagster.infra.files import atomic_write, cache_root

__all__ = [
    "ModelRef",
    "ModelUnavailableError",
    "error_summary",
    "fingerprint_directory",
    "resolve_model",
]

_COMMIT_HASH = re.compile(r"^[0-9a-f]{40}$")
# Weights in formats this project never loads; skipping them keeps hub downloads lean.
_IGNORED_HUB_FILES = [
    "*.onnx",
    "onnx/*",
    "openvino/*",
    "*.msgpack",
    "*.h5",
    "*.ot",
    "tf_model*",
    "flax_model*",
    "rust_model*",
    "coreml/*",
]
_CHUNK = 8 << 20
_memo: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}
_memo_lock = threading.Lock()


@dataclass(frozen=True)
class ModelRef:
    """A model resolved to files on this machine.

    Attributes:
        name: HF id or local path, as the user wrote it.
        revision: the revision the user requested (``None`` for the default branch / a directory).
        path: local directory holding the model's files.
        identity: the resolved hub commit hash, or ``"sha256:<hex>"`` for a local directory.
    """

    name: str
    revision: str | None
    path: Path
    identity: str


def resolve_model(name: str, revision: str | None = None) -> ModelRef:
    """Resolve a hub id or a local directory to a :class:`ModelRef`.

    A name that is an existing directory (or is written as a path: absolute, ``./``, ``../``,
    ``~``) is a local model; anything else is a hub id. Hub ids are looked up in the local HF
    cache; when online (``HF_HUB_OFFLINE`` unset) the hub is asked for the revision's current
    commit and missing files are downloaded. Raises :class:`ModelUnavailableError` when the model
    cannot be provided, and ``ValueError`` for a revision given with a local directory.
    """
    if not name or not name.strip():
        raise ValueError("model name is empty: give a Hugging Face id or a local directory")
    local = Path(name).expanduser()
    if local.is_dir():
        if revision is not None:
            raise ValueError(
                f"model {name!r} is a local directory; a revision ({revision!r}) only applies "
                "to hub ids"
            )
        local = local.resolve()
        _require_tokenizer(name, local)
        return ModelRef(name=name, revision=None, path=local, identity=fingerprint_directory(local))
    if _looks_like_path(name):
        raise ModelUnavailableError(
            f"model {name!r}: no such directory ({local}). Point the configuration to an existing "
            "directory holding the model's files, or name a Hugging Face id."
        )
    return _resolve_hub(name, revision)


def _looks_like_path(name: str) -> bool:
    """True when ``name`` is written as a filesystem path rather than an ``org/model`` hub id."""
    return name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1


def _hub_offline() -> bool:
    """Whether hub access is disabled, read at call time (the env may change after import)."""
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return constants.HF_HUB_OFFLINE or flag.strip().upper() in {"1", "ON", "YES", "TRUE"}


def _resolve_hub(name: str, revision: str | None) -> ModelRef:
    """Locate (and when online, fetch) a hub snapshot; its directory name is the commit hash."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

    offline = _hub_offline()
    try:
        folder = snapshot_download(
            name,
            revision=revision,
            local_files_only=offline,
            ignore_patterns=_IGNORED_HUB_FILES,
            etag_timeout=10,
        )
    # What says the model is not to be had: an invalid id, no (whole) snapshot in the cache while
    # the hub is disabled or unreachable, or the hub refusing it (unknown repo or revision, gated,
    # unauthorised, down). Anything else — a cache it cannot write, a full disk — is raised as itself.
    except (HFValidationError, LocalEntryNotFoundError, HfHubHTTPError) as err:
        raise ModelUnavailableError(_unavailable_message(name, revision, offline, err)) from err
    path = Path(folder)
    _require_tokenizer(name, path)
    commit = path.name
    if not _COMMIT_HASH.match(commit):
        # Not the snapshots/<commit> layout (e.g. a local_dir mirror): identify it by content.
        commit = fingerprint_directory(path)
    return ModelRef(name=name, revision=revision, path=path, identity=commit)


# Tokenizers that need no vocabulary file (they work on bytes / code points).
_VOCABULARY_FREE_TOKENIZERS = {"ByT5Tokenizer", "CanineTokenizer"}


def _has_tokenizer(directory: Path) -> bool:
    """Whether ``directory`` (or a sentence-transformers module folder in it) holds a tokenizer's
    vocabulary: ``tokenizer.json``, ``vocab.*``, or a SentencePiece / tiktoken model."""
    for folder in (directory, *(d for d in directory.iterdir() if d.is_dir())):
        for file in folder.iterdir():
            name = file.name
            if (
                name == "tokenizer.json"
                or name.startswith("vocab")
                or file.suffix in {".model", ".spm", ".tiktoken"}
            ):
                return True
        settings = _json_object(folder / "tokenizer_config.json")
        if settings.get("tokenizer_class") in _VOCABULARY_FREE_TOKENIZERS:
            return True
    return False


def _json_object(path: Path) -> dict:
    """A small JSON file's object, or ``{}`` when it is absent or not a JSON object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _require_tokenizer(name: str, directory: Path) -> None:
    """A transformers model (``config.json`` naming a ``model_type``) must ship its tokenizer.

    Without one, ``AutoTokenizer`` fails deep inside transformers or, for BERT-like models,
    silently builds a tokenizer of special tokens only that maps every word to ``[UNK]``."""
    if "model_type" not in _json_object(directory / "config.json") or _has_tokenizer(directory):
        return
    raise ModelUnavailableError(
        f"model {name!r} ({directory}) has no tokenizer: none of tokenizer.json, vocab.*, or a "
        "SentencePiece *.model file is in the directory. Save the tokenizer the model was trained "
        "with next to its weights (tokenizer.save_pretrained(directory))."
    )


def _unavailable_message(name: str, revision: str | None, offline: bool, err: Exception) -> str:
    """The one error a user sees for a missing hub model: what failed and how to provide it."""
    from huggingface_hub.errors import (
        HFValidationError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
    )

    wanted = name if revision is None else f"{name} (revision {revision})"
    if isinstance(err, HFValidationError):
        why = f"it is not a valid hub id ({error_summary(err)})"
    elif offline and isinstance(err, IncompleteSnapshotError):
        why = (
            "the hub is disabled (HF_HUB_OFFLINE=1) and its snapshot in the local Hugging Face cache "
            f"is incomplete ({error_summary(err)})"
        )
    elif offline and isinstance(err, LocalEntryNotFoundError):
        why = "the hub is disabled (HF_HUB_OFFLINE=1) and it is not in the local Hugging Face cache"
    else:
        why = f"it could not be fetched from the hub ({type(err).__name__}: {error_summary(err)})"
    rev = f" --revision {revision}" if revision else ""
    return (
        f"model {wanted} is unavailable: {why}. To provide it, either download it on a connected "
        f"machine (`hf download {name}{rev}`, formerly `huggingface-cli download {name}{rev}`) and "
        "copy that machine's Hugging Face cache (~/.cache/huggingface/hub, or $HF_HOME) here, or "
        "point the configuration to a local directory holding the model's files."
    )


def error_summary(err: BaseException) -> str:
    """The first line of an exception's message, for one-line user-facing errors."""
    text = str(err).strip()
    return text.splitlines()[0] if text else "no details"


def fingerprint_directory(directory: Path) -> str:
    """``"sha256:<hex>"`` over the sorted relative names, sizes and contents of a directory's files.

    Hidden entries (``.git``, ``.cache``, ...) are skipped: they are tooling state, not the model.
    The result is memoised in-process and in an on-disk cache keyed by the directory and every
    file's (name, size, mtime), so unchanged checkpoints are not re-read.
    """
    directory = Path(directory).resolve()
    files = _list_files(directory)
    stamp = tuple((rel, st.st_size, st.st_mtime_ns) for rel, st in files)
    key = (str(directory), stamp)
    with _memo_lock:
        if key in _memo:
            return _memo[key]
    store = _fingerprint_store(directory)
    digest = _read_stored(store, stamp)
    if digest is None:
        digest = _hash_files(directory, [rel for rel, _ in files])
        _write_stored(store, stamp, digest)
    with _memo_lock:
        _memo[key] = digest
    return digest


def _list_files(directory: Path) -> list[tuple[str, os.stat_result]]:
    """Regular files under ``directory``, following symlinks (HF snapshots link to blobs)."""
    found: list[tuple[str, os.stat_result]] = []
    for root, dirs, names in os.walk(directory, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for fname in names:
            if fname.startswith("."):
                continue
            full = Path(root, fname)
            st = full.stat()
            found.append((full.relative_to(directory).as_posix(), st))
    found.sort(key=lambda item: item[0])
    return found


def _hash_files(directory: Path, rel_paths: list[str]) -> str:
    """Hash names, sizes and contents; names and sizes are framed so files cannot run together."""
    h = hashlib.sha256()
    for rel in rel_paths:
        full = directory / rel
        size = full.stat().st_size
        h.update(f"{len(rel)}:{rel}:{size}\n".encode())
        with open(full, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
    return f"sha256:{h.hexdigest()}"


def _fingerprint_store(directory: Path) -> Path:
    """One small JSON record per directory path."""
    tag = hashlib.sha256(str(directory).encode()).hexdigest()[:32]
    return cache_root() / "fingerprints" / f"{tag}.json"


def _stamp_digest(stamp: tuple) -> str:
    return hashlib.sha256(json.dumps(stamp).encode()).hexdigest()


def _read_stored(store: Path, stamp: tuple) -> str | None:
    """The stored fingerprint when the directory's stat signature is unchanged, else None."""
    try:
        record = json.loads(store.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("stamp") != _stamp_digest(stamp):
        return None
    digest = record.get("identity")
    return digest if isinstance(digest, str) and digest.startswith("sha256:") else None


def _write_stored(store: Path, stamp: tuple, digest: str) -> None:
    """Best effort (a read-only home must not break resolution); atomic via temp file + rename."""
    record = json.dumps({"stamp": _stamp_digest(stamp), "identity": digest})
    try:
        atomic_write(store, lambda temporary: temporary.write_text(record))
    except OSError:
        return
