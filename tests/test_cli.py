"""The ``ragutil`` command registers every subcommand; a bad config fails with its message."""

from __future__ import annotations

from ragutil_dagster.cli import build_parser, main


def test_every_subcommand_is_registered() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == {"world", "run", "score", "compare", "ui"}


def test_user_errors_are_one_message_and_status_2(tmp_path, capsys) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("name: x\ndatasets: []\n")
    assert main(["run", str(config), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ragutil run: error: ") and "datasets" in err and "Traceback" not in err
    assert main(["score", str(tmp_path / "none.jsonl"), "--config", str(config)]) == 2
