"""Model identity: directory fingerprints, hub cache resolution, and the offline error."""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from ragutil_dagster.errors import ModelUnavailableError
from ragutil_dagster.models import identity
from ragutil_dagster.models.identity import resolve_model


def _write_model_dir(path: Path, weights: bytes = b"\x00\x01weights") -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "config.json").write_text('{"a": 1}')
    (path / "sub" / "model.bin").write_bytes(weights)
    return path


def test_local_dir_identity_is_content_fingerprint(tmp_path: Path) -> None:
    a = _write_model_dir(tmp_path / "a")
    b = _write_model_dir(tmp_path / "b")
    ref_a = resolve_model(str(a))
    assert ref_a.path == a.resolve() and ref_a.revision is None and ref_a.name == str(a)
    assert ref_a.identity.startswith("sha256:") and len(ref_a.identity) == len("sha256:") + 64
    # Same contents elsewhere → same identity; hidden tooling state does not count.
    (b / ".cache").mkdir()
    (b / ".cache" / "lock").write_text("x")
    assert resolve_model(str(b)).identity == ref_a.identity


def test_fingerprint_changes_with_same_size_content_edit(tmp_path: Path) -> None:
    a = _write_model_dir(tmp_path / "a")
    before = resolve_model(str(a)).identity
    weights = a / "sub" / "model.bin"
    weights.write_bytes(b"\x00\x02weights")  # same size, different byte
    os.utime(weights, ns=(time.time_ns(), time.time_ns() + 10_000_000))
    assert resolve_model(str(a)).identity != before


def test_fingerprint_is_memoised_in_process_and_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _write_model_dir(tmp_path / "a")
    first = resolve_model(str(a)).identity

    def _no_rehash(*_args: object) -> str:
        raise AssertionError("directory was re-hashed although no file changed")

    monkeypatch.setattr(identity, "_hash_files", _no_rehash)
    assert resolve_model(str(a)).identity == first
    monkeypatch.setattr(identity, "_memo", {})  # a fresh process: only the on-disk record remains
    assert resolve_model(str(a)).identity == first


def test_revision_with_local_dir_is_rejected(tmp_path: Path) -> None:
    a = _write_model_dir(tmp_path / "a")
    with pytest.raises(ValueError, match="local directory"):
        resolve_model(str(a), revision="main")


def test_missing_local_dir_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ModelUnavailableError, match="no such directory"):
        resolve_model(str(missing))


def test_offline_unknown_hub_id_fails_fast_with_instructions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ModelUnavailableError) as err:
        resolve_model("ragutil-test/never-published", revision="v1")
    assert time.perf_counter() - start < 5
    message = str(err.value)
    assert "ragutil-test/never-published" in message and "revision v1" in message
    assert "hf download ragutil-test/never-published --revision v1" in message
    assert "local directory" in message
    assert "not in the local Hugging Face cache" in message
    assert type(err.value.__cause__).__name__ == "LocalEntryNotFoundError"


def test_an_invalid_hub_id_is_named_invalid_not_uncached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ModelUnavailableError, match=r"it is not a valid hub id \(Cannot have -- or \.\."
    ) as err:
        resolve_model("ragutil-test/bad..id")
    assert type(err.value.__cause__).__name__ == "HFValidationError"


@pytest.mark.parametrize("offline", ["1", "0"], ids=["offline", "online"])
@pytest.mark.parametrize(
    "failure",
    [
        PermissionError(13, "Permission denied", "/root/.cache/huggingface/hub/models--org--tiny"),
        OSError(28, "No space left on device"),
        ValueError("a bug in the download"),
    ],
    ids=["permission", "disk-full", "value-error"],
)
def test_a_cache_or_disk_failure_is_raised_as_itself_not_as_a_missing_model(
    monkeypatch: pytest.MonkeyPatch, offline: str, failure: Exception
) -> None:
    import huggingface_hub
    from huggingface_hub import constants

    def failing_download(*args, **kwargs):
        raise failure

    monkeypatch.setattr(huggingface_hub, "snapshot_download", failing_download)
    monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline == "1")
    with pytest.raises(type(failure)) as err:
        resolve_model("org/tiny")
    assert err.value is failure


def _fake_hub_cache(root: Path, repo: str, commit: str) -> Path:
    storage = root / f"models--{repo.replace('/', '--')}"
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(commit)
    return snapshot


def test_cached_hub_model_resolves_to_commit_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = _fake_hub_cache(tmp_path, "org/tiny", commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ref = resolve_model("org/tiny")
    assert (ref.identity, Path(ref.path), ref.revision) == (commit, snapshot, None)
    assert resolve_model("org/tiny", revision=commit).identity == commit
    with pytest.raises(ModelUnavailableError, match="revision v2"):
        resolve_model("org/tiny", revision="v2")


def test_unreachable_hub_fails_fast_without_offline_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    with socket.socket() as sock:  # a port nobody listens on: connections are refused at once
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    start = time.perf_counter()
    with pytest.raises(ModelUnavailableError, match="could not be fetched"):
        resolve_model("org/uncached")
    assert time.perf_counter() - start < 10
    # A cached model still resolves while the hub is down.
    commit = "fedcba9876543210fedcba9876543210fedcba98"
    _fake_hub_cache(tmp_path, "org/cached", commit)
    assert resolve_model("org/cached").identity == commit


def test_tiny_models_are_deterministic(tiny_models, tmp_path: Path) -> None:
    from ragutil_dagster.testing.tiny import build_causal_lm, build_nli_classifier

    lm = build_causal_lm(tmp_path / "lm", seed=0)
    assert resolve_model(str(lm)).identity == resolve_model(str(tiny_models.causal_lm)).identity
    other = build_nli_classifier(tmp_path / "nli1", seed=1)
    assert resolve_model(str(other)).identity != resolve_model(str(tiny_models.nli)).identity
    shutil.rmtree(other)
