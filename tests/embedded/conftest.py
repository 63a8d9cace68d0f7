"""The CI-sized synthetic world with its trained reader and NLI model, built once per session."""

from __future__ import annotations

import pytest

from ragutil_dagster.embedded.training import TrainedWorld, train_all


@pytest.fixture(scope="session")
def ci_trained(tmp_path_factory: pytest.TempPathFactory) -> TrainedWorld:
    """World + reader + world NLI of size ``ci``, seed 0 (about two minutes on two CPU cores);
    the answer NLI is not the world's and is tested in test_answer_nli.py."""
    return train_all(
        tmp_path_factory.mktemp("ci_world"), size="ci", seed=0, progress=False, answer_nli_size=None
    )
