"""The ``ragutil`` command registers every subcommand; a bad config fails with its message."""

from __future__ import annotations

import os
import warnings

import dagster as dg
import pytest
import yaml

from ragutil_dagster.cli import build_parser, main
from ragutil_dagster.infra.databases import DAGSTER_HOME_VARIABLE


def test_every_subcommand_is_registered() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == {"world", "run", "score", "compare", "ui", "clean"}


def test_user_errors_are_one_message_and_status_2(tmp_path, capsys) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("name: x\ndatasets: []\n")
    assert main(["run", str(config), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ragutil run: error: ") and "datasets" in err and "Traceback" not in err
    assert main(["score", str(tmp_path / "none.jsonl"), "--config", str(config)]) == 2


def test_an_embedded_build_from_before_the_answer_nli_keeps_its_world_nli(
    tmp_path, monkeypatch
) -> None:
    from ragutil_dagster.config import parse_config
    from ragutil_dagster.embedded.setup import ensure_embedded_models

    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path))
    old = tmp_path / "embedded"
    (old / "nli").mkdir(parents=True)
    (old / "nli" / "config.json").write_text("{}")
    (old / "build.json").write_text("{}")
    experiment = parse_config(
        {
            "name": "demo",
            "datasets": [{"name": "world", "format": "synthetic"}],
            "retrievers": [{"name": "bm25", "kind": "bm25"}],
            "k": [1],
            "generators": [{"name": "reader", "model": "embedded:reader"}],
            "nli": {"model": "embedded:world-nli"},
        }
    )
    ensure_embedded_models(experiment, progress=False)
    assert (old / "world-nli" / "config.json").is_file() and not (old / "nli").exists()


def test_run_takes_a_positive_number_of_workers(capsys) -> None:
    import pytest

    for bad in ("0", "two"):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(["run", "x.yaml", "--workers", bad])
        assert exit_.value.code == 2
        assert (
            f"argument --workers: expected a whole number of at least 1, got '{bad}'"
            in capsys.readouterr().err
        )
    assert build_parser().parse_args(["run", "x.yaml", "--workers", "2"]).workers == 2


def test_clean_lists_what_nothing_needs_and_deletes_it_only_when_told(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path))
    for variable in ("RAGUTIL_ARTIFACTS_URL", "RAGUTIL_SCRATCH_DIR"):
        monkeypatch.delenv(variable, raising=False)
    partition = tmp_path / "scratch" / "passage_embeddings" / "world__dense"
    for version, moment in (("superseded", 1_000_000_000), ("current", 1_000_000_100)):
        (partition / version).mkdir(parents=True)
        (partition / version / "embeddings.npy").write_bytes(bytes(2048))
        for path in (partition / version / "embeddings.npy", partition / version):
            os.utime(path, (moment, moment))
    assert main(["clean"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert (
        listed[0]
        == f"    2.0 kB  superseded working files (a newer version is beside them): {partition / 'superseded'}"
    )
    assert listed[1] == "1 unneeded, 2.0 kB; run again with --delete to remove them"
    assert (partition / "superseded").is_dir()
    assert main(["clean", "--older-than-hours", "1", "--delete"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "deleted 1, 2.0 kB"
    assert sorted(p.name for p in partition.iterdir()) == ["current"]
    assert main(["clean"]) == 0
    assert (
        capsys.readouterr().out.strip() == "nothing to clean (nothing unneeded untouched for 24 h)"
    )
    with pytest.raises(SystemExit) as exit_:
        main(["clean", "--older-than-hours", "-1"])
    assert exit_.value.code == 2 and "-1: must be 0 or more" in capsys.readouterr().err


def test_clean_lists_the_reports_of_a_superseded_config_and_deletes_them_only_when_told(
    tmp_path, monkeypatch, capsys
) -> None:
    """Per experiment name, every report folder but the one published last is superseded; another
    name's folder and the layout of before per-experiment folders are never listed."""
    from ragutil_dagster.config import parse_config
    from ragutil_dagster.resources import ArtifactStore
    from ragutil_dagster.tracking.report import report_artifact

    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path))
    for variable in ("RAGUTIL_ARTIFACTS_URL", "RAGUTIL_SCRATCH_DIR"):
        monkeypatch.delenv(variable, raising=False)

    def config(name: str, k: int):
        return parse_config(
            {
                "name": name,
                "datasets": [{"name": "world", "format": "synthetic"}],
                "retrievers": [{"name": "bm25", "kind": "bm25"}],
                "k": [k],
                "generators": [{"name": "reader", "model": "embedded:reader"}],
                "nli": {"model": "embedded:world-nli"},
            }
        )

    store = ArtifactStore(home=str(tmp_path))
    edited, latest, other = config("demo", 1), config("demo", 5), config("other", 1)
    reports = tmp_path / "artifacts" / "reports"
    for moment, experiment in (
        (1_000_000_000, edited),
        (1_000_000_100, latest),
        (1_000_000_000, other),
    ):
        for artifact in (report_artifact(experiment), report_artifact(experiment, "world")):
            with store.write_files(*artifact) as directory:
                (directory / "table.csv").write_bytes(bytes(1000))
        for path in (reports / report_artifact(experiment)[1]).rglob("*"):
            os.utime(path, (moment, moment))
    with store.write_files("reports", None, "summary") as directory:  # as ragutil wrote it before
        (directory / "summary.csv").write_bytes(bytes(10))
    superseded = reports / report_artifact(edited)[1]
    dead_writer = superseded / f"summary.{'0' * 32}"  # listed with its folder, not on its own
    dead_writer.mkdir()
    os.utime(dead_writer, (1_000_000_000, 1_000_000_000))

    assert main(["clean"]) == 0
    listed = capsys.readouterr().out.splitlines()
    size = sum(path.stat().st_size for path in superseded.rglob("*") if path.is_file())
    assert listed == [
        f"{f'{size / 1000:.1f} kB':>10}  superseded reports (experiment 'demo' has newer ones, of another "
        f"config: {report_artifact(latest)[1]}): {superseded}",
        f"1 unneeded, {size / 1000:.1f} kB; run again with --delete to remove them",
    ]
    assert superseded.is_dir()
    assert main(["clean", "--delete"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"deleted 1, {size / 1000:.1f} kB"
    assert not superseded.exists()
    for experiment in (latest, other):
        assert (store.local_files(*report_artifact(experiment, "world")) / "table.csv").is_file()
    assert (store.local_files("reports", None, "summary") / "summary.csv").is_file()
    assert main(["clean"]) == 0
    assert (
        capsys.readouterr().out.strip() == "nothing to clean (nothing unneeded untouched for 24 h)"
    )


def test_the_summary_leaves_out_measures_no_row_has() -> None:
    import polars as pl

    from ragutil_dagster.cli.run import format_summary, summary_columns

    (kept, kept_label), (empty, empty_label) = summary_columns()[:2]
    table = pl.DataFrame(
        {
            "dataset": ["world", "world"],
            "retriever": ["bm25", "bm25"],
            "k": [1, 5],
            "reranker": [None, None],
            "generator": ["reader", "reader"],
            kept: [0.25, None],
            empty: [None, None],
        },
        schema_overrides={empty: pl.Float64, "reranker": pl.String},
    )
    header, _, first, second = format_summary(table).splitlines()
    assert kept_label in header and empty_label not in header
    assert "0.250" in first and "—" in second


@pytest.mark.parametrize("shown", [False, True])
def test_third_party_progress_bars_are_hidden_unless_verbose(shown, capsys) -> None:
    """A library's bar (tqdm with its defaults, as transformers converts a GGUF file and vLLM loads
    weights) is hidden by default; ragutil's own bar, which sets ``disable``, stays."""
    from tqdm.auto import tqdm

    from ragutil_dagster.cli.run import third_party_output

    with third_party_output(shown):
        for _ in tqdm(range(2), desc="library bar"):
            pass
        for _ in tqdm(range(2), desc="ragutil bar", disable=False):
            pass
    err = capsys.readouterr().err
    assert "ragutil bar" in err and ("library bar" in err) == shown


def test_run_hides_third_party_noise_unless_verbose(
    tiny_world, make_tiny_config, tmp_path, monkeypatch, capsys
) -> None:
    """By default ``ragutil run`` shows its one progress bar, the table and the warnings a user can act
    on: no Dagster beta warning, no MLflow "Downloading artifacts" bar; ``--verbose`` filters none
    of them. The second run, forced (``--force``), materialises everything again from the caches."""
    _, world, models = tiny_world
    config = make_tiny_config(models, world)
    config.update(
        retrievers=config["retrievers"][:1], k=[1], utility={"candidates": 2, "methods": []}
    )
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(DAGSTER_HOME_VARIABLE, raising=False)
    shown = {}
    for flags in ([], ["--verbose", "--force"]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert main(["run", str(path), *flags]) == 0
        out, err = capsys.readouterr()
        shown[bool(flags)] = (
            out + err,
            [w for w in caught if issubclass(w.category, dg.BetaWarning)],
        )
    quiet, verbose = shown[False], shown[True]
    assert "experiment tiny:" in quiet[0] and "ragutil run:" in quiet[0]
    assert not quiet[1] and "BetaWarning" not in quiet[0]
    assert "Downloading artifacts" not in quiet[0]
    assert verbose[1] and "Downloading artifacts" in verbose[0]
    assert "skip  " not in verbose[0] and "run   reports: forced" in verbose[0]
    assert os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR") is None  # restored after the run


def test_the_summary_shows_compression_measures_only_beside_a_compressed_setting() -> None:
    import polars as pl

    from ragutil_dagster.assets.reports import compared_summary_table
    from ragutil_dagster.config import Setting
    from ragutil_dagster.metrics import catalog
    from ragutil_dagster.tracking.compare import PartitionScores

    summary = {m.name: 0.5 for m in catalog.headline()}
    plain = Setting("world", "bm25", 1)
    truncated = Setting("world", "bm25", 1, compressor="truncate-12")
    compressed_columns = set(catalog.compression_only()) & set(summary)
    assert compressed_columns >= {"context_tokens_after", "compression_ratio"}
    alone = compared_summary_table([PartitionScores(plain, "reader", summary, pl.DataFrame())])
    assert not compressed_columns & set(alone.columns)
    assert "delta_seper_s" in alone.columns
    beside = compared_summary_table(
        [
            PartitionScores(plain, "reader", summary, pl.DataFrame()),
            PartitionScores(truncated, "reader", summary, pl.DataFrame()),
        ]
    )
    assert compressed_columns <= set(beside.columns)


STOPPED_COMMAND = """
import argparse, signal, sys, time, types
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as background processes here inherit it
from ragutil_dagster import cli
from ragutil_dagster.models import vllm_backend

class EngineCore:
    def shutdown(self, timeout):
        open(sys.argv[1], "w").write("shut down")

vllm_backend._live = (None, types.SimpleNamespace(llm_engine=types.SimpleNamespace(engine_core=EngineCore())))

def command(args):
    print("ready", flush=True)
    time.sleep(120)
    return 0

parser = types.SimpleNamespace(parse_args=lambda argv: argparse.Namespace(command="x", func=command))
cli.build_parser = lambda: parser
sys.exit(cli.main([]))
"""


def test_a_command_stopped_by_sigterm_shuts_its_vllm_engine_down(tmp_path) -> None:
    """SIGTERM (even inherited ignored) ends a command through SystemExit, so the atexit hook shuts
    the process's vLLM engine down instead of leaving its engine-core processes orphaned."""
    import signal
    import subprocess
    import sys

    marker = tmp_path / "engine"
    child = subprocess.Popen(
        [sys.executable, "-c", STOPPED_COMMAND, str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 128 + signal.SIGTERM
    assert marker.read_text() == "shut down"


def test_main_leaves_the_sigterm_handler_as_it_found_it() -> None:
    import signal

    from ragutil_dagster.cli import sigterm_exits

    before = signal.getsignal(signal.SIGTERM)
    with sigterm_exits():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize(("command", "exits"), [("score", True), ("run", False)])
def test_sigterm_exits_every_command_but_run(command, exits, monkeypatch) -> None:
    """``ragutil run`` keeps SIGTERM's default: Dagster's step wrapper would take the SystemExit
    for the step's failure and go on."""
    import argparse
    import signal
    import types

    from ragutil_dagster import cli

    seen = []
    namespace = argparse.Namespace(
        command=command, func=lambda args: seen.append(signal.getsignal(signal.SIGTERM)) or 0
    )
    monkeypatch.setattr(
        cli, "build_parser", lambda: types.SimpleNamespace(parse_args=lambda argv: namespace)
    )
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main([]) == 0
    assert (seen[0] is not before) == exits
    assert signal.getsignal(signal.SIGTERM) is before
