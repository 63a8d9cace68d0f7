"""What an example's run left in a home, as one JSON: each step's wall time summed over its
partitions (per generator), and per setting × generator the tables the reports print —
LLM-specific utility's Table 1 (has_answer per context), the overlap of the generators'
gold-utility sets, and SePer Table 2's ROC AUCs (questions not answered closed book) — read from
the artifact store and the Dagster instance of ``$RAGUTIL_HOME``. It reads a run that was stopped
before its reports too: every finished partition is there.

    RAGUTIL_HOME=<home> /usr/bin/time -v ragutil run examples/squad-two-llms.yaml 2> time.log
    RAGUTIL_HOME=<home> python bench/example_figures.py examples/squad-two-llms.yaml \\
        --time-log time.log --json bench/results/squad_two_llms.json

``graph_seconds`` spans the Dagster runs (the first step's start to the last step's end);
``--time-log`` adds the whole command's wall time and peak RSS as ``/usr/bin/time -v`` measured
them, models installed into the home before the graph included.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
from datetime import date
from pathlib import Path

import dagster as dg
import polars as pl

from ragutil_dagster.config import load_config
from ragutil_dagster.infra.files import ragutil_home
from ragutil_dagster.resources import ArtifactStore
from ragutil_dagster.runner import dagster_instance


def step_seconds(instance) -> dict[str, dict[str, float]]:
    """Step → generator (``-`` for steps without one) → seconds, over every finished step."""
    seconds: dict[str, dict[str, float]] = collections.defaultdict(
        lambda: collections.defaultdict(float)
    )
    for run in instance.get_runs(limit=10_000):
        partition = run.tags.get("dagster/partition") or ""
        generator = partition.split("|")[0] if "|" in partition else "-"
        for step in instance.get_run_step_stats(run.run_id):
            if step.start_time and step.end_time:
                seconds[step.step_key][generator] += step.end_time - step.start_time
    return {step: {g: round(s, 1) for g, s in by.items()} for step, by in seconds.items()}


def graph_seconds(instance) -> float | None:
    """From the first step's start to the last step's end over every run, or None without steps."""
    spans = [
        (step.start_time, step.end_time)
        for run in instance.get_runs(limit=10_000)
        for step in instance.get_run_step_stats(run.run_id)
        if step.start_time and step.end_time
    ]
    if not spans:
        return None
    return round(max(end for _, end in spans) - min(start for start, _ in spans), 1)


def command_time(log: Path) -> dict[str, float]:
    """Wall seconds and peak RSS (MiB) of a command from ``/usr/bin/time -v``'s report."""
    text = log.read_text(encoding="utf-8", errors="replace")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    if wall is None or rss is None:
        raise SystemExit(
            f"{log}: no /usr/bin/time -v report (its wall clock and maximum RSS lines)"
        )
    seconds = 0.0
    for part in wall.group(1).split(":"):
        seconds = seconds * 60 + float(part)
    return {"wall_seconds": round(seconds, 1), "peak_rss_mib": round(int(rss.group(1)) / 1024, 1)}


def partition_tables(store: ArtifactStore, partition: str) -> dict[str, object]:
    """The partition's Table 1, overlap and validity AUCs, where its steps finished."""
    out: dict[str, object] = {}
    if store.has_table("utility_transfer", partition):
        table = store.read_table("utility_transfer", partition)
        out["table1_has_answer"] = dict(
            table.group_by("context").agg(pl.col("has_answer").mean()).sort("context").iter_rows()
        )
        out["questions"] = table["query_id"].n_unique()
        out["overlap"] = store.read_table("utility_transfer", partition, "overlap").to_dicts()
    if store.has_table("validity", partition):
        validity = store.read_table("validity", partition).filter(pl.col("subset") == "unanswered")
        out["validity_auc"] = {
            negatives: {row["label"]: row["auc"] for row in part.iter_rows(named=True)}
            for (negatives,), part in validity.group_by("negatives", maintain_order=True)
        }
        out["validity_n"] = dict(
            validity.group_by("negatives").agg(pl.col("n").first()).iter_rows()
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--time-log", type=Path, help="the run's /usr/bin/time -v output")
    args = parser.parse_args()
    experiment = load_config(args.config)
    store = ArtifactStore(home=str(ragutil_home()))
    partitions = {
        f"{generator.name}|{setting.key}": partition_tables(
            store, f"{generator.name}|{setting.key}"
        )
        for setting in experiment.settings()
        for generator in experiment.generators
    }
    instance = dagster_instance()
    figures = {
        "config": str(args.config),
        "date": date.today().isoformat(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        # False when the run was stopped before its last step: the partitions below are what finished.
        "reports_materialised": instance.get_latest_materialization_event(dg.AssetKey("reports"))
        is not None,
        "graph_seconds": graph_seconds(instance),
        "step_seconds": step_seconds(instance),
        "partitions": partitions,
    }
    if args.time_log:
        figures["command"] = command_time(args.time_log)
    text = json.dumps(figures, indent=2, sort_keys=True)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
