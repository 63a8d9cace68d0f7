"""What an example's run left in a home, as one JSON: each step's wall time summed over its
partitions (per generator), and per setting × generator the tables the reports print —
LLM-specific utility's Table 1 (has_answer per context), the overlap of the generators'
gold-utility sets, and SePer Table 2's ROC AUCs (questions not answered closed book) — read from
the artifact store and the Dagster instance of ``$RAGUTIL_HOME``. It reads a run that was stopped
before its reports too: every finished partition is there.

    RAGUTIL_HOME=<home> /usr/bin/time -v ragutil run examples/squad-two-llms.yaml
    RAGUTIL_HOME=<home> python bench/example_figures.py examples/squad-two-llms.yaml \\
        --json bench/results/squad_two_llms.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
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
        "step_seconds": step_seconds(instance),
        "partitions": partitions,
    }
    text = json.dumps(figures, indent=2, sort_keys=True)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
