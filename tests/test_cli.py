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


def test_an_embedded_build_from_before_the_answer_nli_keeps_its_world_nli(tmp_path, monkeypatch) -> None:
    from ragutil_dagster.cli.run import ensure_embedded_models
    from ragutil_dagster.config import parse_config

    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path))
    old = tmp_path / "embedded"
    (old / "nli").mkdir(parents=True)
    (old / "nli" / "config.json").write_text("{}")
    (old / "build.json").write_text("{}")
    experiment = parse_config({
        "name": "demo", "datasets": [{"name": "world", "format": "synthetic"}],
        "retrievers": [{"name": "bm25", "kind": "bm25"}], "k": [1],
        "generators": [{"name": "reader", "model": "embedded:reader"}], "nli": {"model": "embedded:world-nli"},
    })
    ensure_embedded_models(experiment, progress=False)
    assert (old / "world-nli" / "config.json").is_file() and not (old / "nli").exists()


def test_run_takes_a_positive_number_of_workers(capsys) -> None:
    import pytest

    for bad in ("0", "two"):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(["run", "x.yaml", "--workers", bad])
        assert exit_.value.code == 2
        assert f"argument --workers: expected a whole number of at least 1, got '{bad}'" in capsys.readouterr().err
    assert build_parser().parse_args(["run", "x.yaml", "--workers", "2"]).workers == 2
