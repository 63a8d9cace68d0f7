"""``ragutil compare``: the papers' comparison tables across every scored setting × generator,
logged as an MLflow comparison run."""

from __future__ import annotations

import argparse

from ragutil_dagster.config import load_config


def _compare(args: argparse.Namespace) -> int:
    from ragutil_dagster.definitions import build_resources
    from ragutil_dagster.tracking.report import compare_runs

    experiment = load_config(args.experiment)
    resources = build_resources(for_dagster=False)
    tracking = resources["tracking"]
    outcome = compare_runs(resources["store"], tracking, experiment, {"ragutil.command": "compare"})
    print(outcome.markdown())
    for dataset, run in outcome.runs.items():
        print(
            f"\n{dataset}: tables in {outcome.directories[dataset]}; MLflow comparison run {run.run_id} "
            f"({'reused' if run.reused else 'new'}) in {tracking.display_uri}\n  {run.url}"
        )
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    compare = sub.add_parser(
        "compare",
        help="compare every scored setting × generator of an experiment (MLflow comparison run)",
        description="Build the papers' comparison tables (ΔSePer by retriever × k × generator, "
        "MIRAGE, eRAG / utility) with paired bootstrap tests between retrievers from the scored "
        "partitions, publish them in the artifact store under reports/<experiment>-<fingerprint>/<dataset>/comparison, log them as an "
        "MLflow comparison run ($MLFLOW_TRACKING_URI, else $RAGUTIL_HOME/mlflow.db) and print them.",
    )
    compare.add_argument(
        "experiment",
        nargs="?",
        default="examples/demo.yaml",
        help="experiment YAML, as given to `ragutil run`",
    )
    compare.set_defaults(func=_compare)
