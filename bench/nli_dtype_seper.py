"""What the NLI's dtype changes in SePer and ΔSePer on a finished run (issue 29 item 3).

``bench/nli_runtime.py`` counts labels kept; this bench asks the question a user has: do the
metrics move? It reads a finished ``ragutil run`` whose NLI ran in float32 (its home's NLI
tables and the generations they judged) and has the same NLI model judge those generations again
in ``--dtype``, as the NLI step does (``evaluation.groups.compute_nli``: which pairs SePer's
clustering asks for depends on the answers to earlier pairs, so the second dtype may judge pairs
the first never needed), through ``models.entailment.Entailment`` (length batches; compiled
where ``COMPILE_AFTER_SECONDS`` says it pays; one pair judged once across partitions, through a
scratch cache). Every partition's groups (``group_scores``) and per-query SePer / ΔSePer
(``query_scores``) are recomputed from each table. Nothing else differs: same samples.

    RAGUTIL_HOME=<home> python bench/nli_dtype_seper.py --config examples/squad-compression.yaml \\
        [--dtype bfloat16]

Reports labels kept (argmax equal, over the pairs both judged) and entailment decisions kept
(label entailment or not: what strict clustering reads), |ΔP(entailment)|, per-query |Δ| of ΔSePer_S / ΔSePer_H,
the share of queries whose ΔSePer_S moves by more than the reports' resolution (half of the last
printed decimal: 0.0005), the mean ΔSePer_S of each dtype, and the second dtype's pairs/s. Writes
``bench/results/nli_dtype_seper.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import yaml

from ragutil_dagster.assets import build_assets
from ragutil_dagster.assets.entailment_clusters import all_generations
from ragutil_dagster.config import parse_config
from ragutil_dagster.evaluation.groups import compute_nli, group_scores
from ragutil_dagster.evaluation.paper_scores import query_scores
from ragutil_dagster.resources import ArtifactStore
from ragutil_dagster.resources.models import ModelLoader
from ragutil_dagster.runner import dagster_instance
from ragutil_dagster.tracking.partition_run import NLI_DTYPE, recorded_text

ROOT = Path(__file__).resolve().parent.parent
RESOLUTION = 0.0005
PROBABILITIES = ["p_contradiction", "p_neutral", "p_entailment"]


def per_query(queries: pl.DataFrame, samples: pl.DataFrame, nli: pl.DataFrame) -> pl.DataFrame:
    """Per query: SePer and ΔSePer of ``samples`` with ``nli``'s probabilities."""
    return query_scores(group_scores(samples, queries, nli), queries).select(
        "query_id",
        "seper_s_closed",
        "seper_s_rag",
        "delta_seper_s",
        "delta_seper_h",
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", type=Path, required=True, help="the finished run's experiment YAML"
    )
    parser.add_argument(
        "--dtype", default="bfloat16", help="the dtype to compare with float32 (default bfloat16)"
    )
    args = parser.parse_args()
    home = os.environ.get("RAGUTIL_HOME")
    if not home:
        raise SystemExit("set RAGUTIL_HOME to the finished run's home")
    experiment = parse_config(yaml.safe_load(args.config.read_text()))
    parts, _ = build_assets(experiment)
    store = ArtifactStore(home=home)
    instance = dagster_instance(Path(home))
    partitions = [
        k
        for k in parts.setting_generator.get_partition_keys()
        if store.has_table("nli_probabilities", str(k))
    ]
    if not partitions:
        raise SystemExit(
            f"{home} holds no nli_probabilities table of {args.config}'s partitions: run it first"
        )
    for partition in partitions:
        recorded = recorded_text(instance, "nli_probabilities", str(partition), NLI_DTYPE)
        if recorded not in (None, "float32"):
            raise SystemExit(
                f"{partition}: its NLI ran in {recorded}, not float32; this bench needs a float32 run"
            )
    scratch = tempfile.mkdtemp(prefix="nli-dtype-")
    # The pipeline's own judge (the content check in front where the config asks for it), in --dtype.
    judge = ModelLoader(device="cpu", nli_cache=str(Path(scratch) / "nli.sqlite")).entailment(
        experiment.nli.model_copy(update={"dtype": args.dtype})
    )
    model = getattr(judge, "judge", judge)
    rows, reference, other, seconds = [], [], [], 0.0
    for partition in partitions:
        queries = store.read_table("setting_queries", partition.keys_by_dimension["setting"])
        samples = all_generations(store, parts, str(partition))
        nli = store.read_table("nli_probabilities", str(partition))
        start = time.perf_counter()
        judged = compute_nli(samples, queries, judge)
        seconds += time.perf_counter() - start
        reference.append(nli)
        other.append(judged)
        base, changed = per_query(queries, samples, nli), per_query(queries, samples, judged)
        rows.append(base.join(changed, on="query_id", suffix="_other"))
    shutil.rmtree(scratch)
    reference = pl.concat(reference).unique(["premise", "hypothesis"])
    other = pl.concat(other).unique(["premise", "hypothesis"])
    both = reference.join(other, on=["premise", "hypothesis"], suffix="_other")
    labels = both.select(PROBABILITIES).to_numpy().argmax(1)
    labels_other = both.select(f"{c}_other" for c in PROBABILITIES).to_numpy().argmax(1)
    entailment = PROBABILITIES.index("p_entailment")
    entailment_shift = (both["p_entailment"] - both["p_entailment_other"]).abs().to_numpy()
    table = pl.concat(rows)
    delta_s = (table["delta_seper_s"] - table["delta_seper_s_other"]).abs()
    delta_h = (table["delta_seper_h"] - table["delta_seper_h_other"]).abs()
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "command": f"RAGUTIL_HOME=<home> python bench/nli_dtype_seper.py --config {args.config} --dtype {args.dtype}",
        "nli_model": experiment.nli.model,
        "answer_check": experiment.nli.answer_check,
        "nli_identity": judge.identity,
        "partitions": len(partitions),
        "setting_queries": table.height,
        "distinct_pairs": {
            "float32": reference.height,
            args.dtype: other.height,
            "both": both.height,
        },
        f"{args.dtype}_pairs_computed_per_second": judge.stats.computed
        / seconds,  # of compute_nli, SePer included
        f"{args.dtype}_compiled": model.model is not model.eager_model,
        "labels_kept": float(np.mean(labels == labels_other)),
        # what strict clustering reads: is the label entailment (contradiction / neutral near-ties
        # flip the argmax without changing any cluster)
        "entailment_decisions_kept": float(
            np.mean((labels == entailment) == (labels_other == entailment))
        ),
        "p_entailment_abs_shift": {
            "mean": float(entailment_shift.mean()),
            "max": float(entailment_shift.max()),
        },
        "delta_seper_s_abs_shift": {"mean": float(delta_s.mean()), "max": float(delta_s.max())},
        "delta_seper_h_abs_shift": {"mean": float(delta_h.mean()), "max": float(delta_h.max())},
        "queries_moved_beyond_resolution": float((delta_s > RESOLUTION).mean()),
        "resolution": RESOLUTION,
        "mean_delta_seper_s": {
            "float32": float(table["delta_seper_s"].mean()),
            args.dtype: float(table["delta_seper_s_other"].mean()),
        },
        "mean_seper_s_closed": {
            "float32": float(table["seper_s_closed"].mean()),
            args.dtype: float(table["seper_s_closed_other"].mean()),
        },
    }
    path = ROOT / "bench" / "results" / "nli_dtype_seper.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
