"""``ragutil run`` on one machine: every step in this process (``--workers 1``) against partitions
side by side on Dagster's multiprocess executor (``--workers 2``), on the BM25 half of the tests'
tiny experiment (CI-sized synthetic world, 6 queries, tiny untrained models, BM25, k ∈ {1, 2}:
8 Dagster runs, two partitions in the retrieval and scoring steps), as
``tests/dagster/test_pipeline.py`` runs it. Each configuration gets a fresh ``RAGUTIL_HOME`` and Dagster
instance (SQLite), so nothing is cached between them.

    python bench/run_workers.py [--workers 1 2]

Prints a table (wall seconds of materialize_all and the headline ΔSePer of each setting, which
must agree across configurations).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import polars as pl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()

    from ragutil_dagster.assets import build_assets
    from ragutil_dagster.config import parse_config
    from ragutil_dagster.definitions import build_definitions
    from ragutil_dagster.embedded.world import make_world, write_world
    from ragutil_dagster.runner import dagster_instance, materialize_all
    from ragutil_dagster.testing.tiny import build_tiny_models

    root = Path(tempfile.mkdtemp(prefix="ragutil-bench-executors-"))
    world = write_world(make_world(0, "ci"), root / "world")
    models = build_tiny_models(root / "models")
    experiment = parse_config(
        {
            "name": "tiny",
            "seed": 0,
            "bootstrap_resamples": 50,
            "datasets": [
                {"name": "world", "format": "synthetic", "path": str(world), "max_queries": 6}
            ],
            "retrievers": [{"name": "bm25", "kind": "bm25"}],
            "k": [1, 2],
            "generators": [{"name": "lm0", "model": str(models.causal_lm)}],
            "nli": {"model": str(models.nli)},
            "sampling": {"n": 3, "max_new_tokens": 4},
        }
    )
    os.environ.pop("DAGSTER_HOME", None)
    rows, summaries = [], []
    for workers in args.workers:
        home = root / f"home-{workers}"
        parts, _ = build_assets(experiment)
        started = time.perf_counter()
        outcome = materialize_all(
            build_definitions(experiment, str(home)),
            experiment,
            parts,
            dagster_instance(home),
            progress=False,
            workers=workers,
        )
        rows.append(
            {
                "workers": workers,
                "dagster_runs": outcome.runs,
                "wall_s": round(time.perf_counter() - started, 1),
            }
        )
        summaries.append(outcome.summary)
    print(pl.DataFrame(rows))
    print("identical summaries:", all(s.equals(summaries[0]) for s in summaries))


if __name__ == "__main__":
    main()
