"""Tiny local models shared by the model-backend tests (built once per test session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragutil_dagster.testing.tiny import TinyModels, build_tiny_models


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return build_tiny_models(tmp_path_factory.mktemp("tiny-models"), seed=0)


@pytest.fixture(autouse=True)
def _private_ragutil_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Keep fingerprint/NLI/generation caches out of the user's home during tests."""
    root = tmp_path_factory.getbasetemp() / "ragutil-cache"
    monkeypatch.setenv("RAGUTIL_CACHE_DIR", str(root))
    return root
