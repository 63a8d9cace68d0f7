"""Tiny local models shared by the model-backend tests (built once per test session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragutil_dagster.testing.tiny import TinyModels, build_tiny_models


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return build_tiny_models(tmp_path_factory.mktemp("tiny-models"), seed=0)


@pytest.fixture(autouse=True)
def _private_ragutil_cache(private_ragutil_cache: Path) -> Path:
    """Every model-backend test keeps its caches out of the user's home (tests/conftest.py)."""
    return private_ragutil_cache
