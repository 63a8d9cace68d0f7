"""``ragutil run``, ``ragutil score``, ``ragutil compare`` and ``ragutil ui``: the main job, scoring a
user's records, the cross-run comparison in MLflow, and the Dagster UI on the same state."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ragutil_dagster.config import ExperimentConfig, GeneratorConfig, load_config
from ragutil_dagster.errors import ConfigError
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
    defs = build_definitions(experiment)
    parts, _ = build_assets(experiment)
    outcome = materialize_all(defs, experiment, parts, dagster_instance(), progress=not args.quiet,
                              console_log_level="CRITICAL" if args.quiet else "WARNING")
    print()
    print(f"experiment {experiment.name}: {outcome.runs} runs in {outcome.seconds:.0f} s")
    print(format_summary(outcome.summary))
    print(f"\nartifacts: {ragutil_home() / 'artifacts'}   (reports/summary.csv, reports/summary.md)")
    return 0


def _score_generator(experiment: ExperimentConfig, config: str, name: str | None) -> GeneratorConfig:
    """The generator ``--generator`` names (the config's first when not given)."""
    if name is None:
        return experiment.generators[0]
    names = [g.name for g in experiment.generators]
    if name not in names:
        raise ConfigError(f"{config}: --generator {name!r} is not a generator of the config; it has: {', '.join(names)}")
    return experiment.generator(name)


def _score(args: argparse.Namespace) -> int:
    from ragutil_dagster.data.records import read_records
    from ragutil_dagster.evaluation.records import score_records
    from ragutil_dagster.files import atomic_write
    from ragutil_dagster.resources.models import ModelRegistry

    experiment = load_config(args.config)
    records = read_records(args.file)
    spec = _score_generator(experiment, args.config, args.generator)
    if args.out and Path(args.out).is_dir():
        # Checked before the models load and sample, not after minutes of scoring.
        raise ConfigError(f"--out {args.out}: is a directory; name the JSONL file to write")
    if needs_embedded_models(experiment):
        ensure_embedded_models(progress=not args.quiet)
    models = ModelRegistry(
        nli_cache=str(ragutil_home() / "cache" / "nli.sqlite"),
        generation_cache=str(ragutil_home() / "cache" / "generations"),
        show_progress=not args.quiet,
    )
    scores = score_records(
        records, experiment, spec, models.generator(spec), models.scorer(spec), models.entailment(experiment.nli)
    )
    lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in scores)
    if args.out:
        atomic_write(args.out, lambda temporary: temporary.write_text(lines, encoding="utf-8"))
        print(f"wrote {len(scores)} scored records to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(lines)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from ragutil_dagster.resources.storage import ArtifactStore
    from ragutil_dagster.tracking import MlflowTracking
    from ragutil_dagster.tracking.report import compare_runs

    experiment = load_config(args.experiment)
    home = str(ragutil_home())
    tracking = MlflowTracking(home=home, tracking_uri=os.environ.get("MLFLOW_TRACKING_URI", ""))
    outcome = compare_runs(ArtifactStore(home=home), tracking, experiment, {"ragutil.command": "compare"})
    print(outcome.markdown())
    for dataset, run in outcome.runs.items():
        print(f"\n{dataset}: tables in {outcome.directories[dataset]}; MLflow comparison run {run.run_id} "
              f"({'reused' if run.reused else 'new'}) in {tracking.display_uri}\n  {run.url}")
    return 0


def _ui(args: argparse.Namespace) -> int:
    from ragutil_dagster.runner import dagster_instance

    os.environ["RAGUTIL_CONFIG"] = str(Path(args.config).resolve())
    if not os.environ.get("DAGSTER_HOME"):
        dagster_instance()  # creates <RAGUTIL_HOME>/dagster with its dagster.yaml
        os.environ["DAGSTER_HOME"] = str(ragutil_home() / "dagster")
    command = ["dagster", "dev", "-m", "ragutil_dagster.definitions", "-a", "defs", "-h", args.host, "-p", str(args.port)]
    os.execvp(command[0], command)
    return 0  # not reached


def add_commands(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="materialise the whole evaluation graph of an experiment config",
                         description="Materialise every asset of the experiment (training the embedded models "
                         "first when the config uses them and they are missing) and print the summary table.")
    run.add_argument("config", help="experiment YAML, e.g. examples/demo.yaml")
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.set_defaults(func=_run)

    score = sub.add_parser("score", help="score your own JSONL records without Dagster",
                           description='Each line: {"id", "question", "answers": [...], "contexts": [text or {"id", "text"}, ...]}. '
                           "Writes one JSON line of scores per record.")
    score.add_argument("file", help="records JSONL")
    score.add_argument("--config", required=True, help="experiment YAML naming the generator, NLI model and sampling")
    score.add_argument("--generator", help="generator name from the config (default: the first)")
    score.add_argument("--out", help="output JSONL (default: standard output)")
    score.add_argument("--quiet", action="store_true", help="no progress bars")
    score.set_defaults(func=_score)

    compare = sub.add_parser("compare", help="compare every scored setting × generator of an experiment (MLflow comparison run)",
                             description="Build the papers' comparison tables (ΔSePer by retriever × k × generator, "
                             "MIRAGE, eRAG / utility) with paired bootstrap tests between retrievers from the scored "
                             "partitions, write them under $RAGUTIL_HOME/artifacts/reports/<dataset>/, log them as an "
                             "MLflow comparison run ($MLFLOW_TRACKING_URI, else $RAGUTIL_HOME/mlflow.db) and print them.")
    compare.add_argument("experiment", nargs="?", default="examples/demo.yaml", help="experiment YAML, as given to `ragutil run`")
    compare.set_defaults(func=_compare)

    ui = sub.add_parser("ui", help="serve the Dagster UI over ragutil's instance ($RAGUTIL_HOME/dagster)")
    ui.add_argument("config", nargs="?", default="examples/demo.yaml", help="experiment YAML")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=3000)
    ui.set_defaults(func=_ui)
