"""``ragutil run``: materialise the whole evaluation graph of an experiment config and print the
summary table (the embedded world and models are built first when the config uses them)."""

from __future__ import annotations

import argparse

from ragutil_dagster.config import ExperimentConfig, load_config
from ragutil_dagster.files import embedded_dir, ragutil_home
from ragutil_dagster.metrics import catalog
from ragutil_dagster.models.resolver import EMBEDDED_PREFIX

SUMMARY_COLUMNS = tuple((m.name, m.label) for m in catalog.headline())


def needs_embedded_models(experiment: ExperimentConfig) -> bool:
    """Whether the config uses the embedded world or the project's own trained models."""
    models = [g.model for g in experiment.generators] + [experiment.nli.model]
    uses_models = any(m.startswith(EMBEDDED_PREFIX) for m in models)
    uses_world = any(d.format == "synthetic" and not d.path for d in experiment.datasets)
    return uses_models or uses_world


def ensure_embedded_models(size: str = "default", progress: bool = True) -> None:
    """Build the synthetic world and train its reader and NLI model once (≈ 15–20 min on 2 cores)."""
    target = embedded_dir()
    if (target / "build.json").is_file():
        return
    from ragutil_dagster.embedded.training import format_quality, train_all

    print(f"The embedded world and models are missing: building them into {target} (once).", flush=True)
    trained = train_all(target, size=size, progress=progress)
    print(format_quality(trained.quality), flush=True)


def format_summary(table) -> str:
    headers = ["setting", "generator"] + [label for _, label in SUMMARY_COLUMNS if _ in table.columns]
    rows = []
    for row in table.iter_rows(named=True):
        setting = f"{row['dataset']}/{row['retriever']}/k={row['k']}" + (f"/{row['reranker']}" if row["reranker"] else "")
        values = [
            "—" if row[c] is None else f"{row[c]:.3f}" for c, _ in SUMMARY_COLUMNS if c in table.columns
        ]
        rows.append([setting, row["generator"], *values])
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows)]
    line = lambda cells: "  ".join(str(c).rjust(w) if i > 1 else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _run(args: argparse.Namespace) -> int:
    from ragutil_dagster.assets import build_assets
    from ragutil_dagster.definitions import build_definitions
    from ragutil_dagster.runner import dagster_instance, materialize_all

    experiment = load_config(args.config)
    if needs_embedded_models(experiment):
        ensure_embedded_models(progress=not args.quiet)
    defs = build_definitions(experiment, show_progress=not args.quiet)
    parts, _ = build_assets(experiment)
    outcome = materialize_all(defs, experiment, parts, dagster_instance(), progress=not args.quiet,
                              console_log_level="CRITICAL" if args.quiet else "WARNING")
    print()
    print(f"experiment {experiment.name}: {outcome.runs} runs in {outcome.seconds:.0f} s")
    print(format_summary(outcome.summary))
    print(f"\nartifacts: {ragutil_home() / 'artifacts'}   (reports/summary.csv, reports/summary.md)")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="materialise the whole evaluation graph of an experiment config",
                         description="Materialise every asset of the experiment (training the embedded models "
                         "first when the config uses them and they are missing) and print the summary table.")
    run.add_argument("config", help="experiment YAML, e.g. examples/demo.yaml")
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.set_defaults(func=_run)
