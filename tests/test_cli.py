"""The ``ragutil`` command registers every subcommand; a bad config fails with its message."""

from __future__ import annotations

import pytest

from ragutil_dagster.cli import build_parser, main
from ragutil_dagster.config import ConfigError


def test_every_subcommand_is_registered() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == {"world", "run", "score", "compare", "ui"}


def test_run_with_an_invalid_config_names_the_field(tmp_path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("name: x\ndatasets: []\n")
    with pytest.raises(ConfigError, match="datasets"):
        main(["run", str(config), "--quiet"])
