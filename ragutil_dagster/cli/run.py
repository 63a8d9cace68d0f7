"""``ragutil run``: materialise the evaluation graph of an experiment config — the partitions whose
inputs changed since they last ran, every one with ``--force`` — and print the summary table (the
embedded world and models are built first when the config uses them)."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from ragutil_dagster.config import ExperimentConfig, load_config
from ragutil_dagster.embedded.setup import ensure_embedded_models
from ragutil_dagster.infra.engine_output import ENGINE_OUTPUT_ENV
from ragutil_dagster.infra.executor_names import CELERY_EXECUTOR
from ragutil_dagster.metrics import catalog


def summary_columns() -> tuple[tuple[str, str], ...]:
    """The run table's measures, (summary key, label): the catalogue's headline metrics."""
    return tuple((m.name, m.label) for m in catalog.headline())


def print_loudly(warning: str) -> None:
    """``warning`` on standard error between two rows of "!", where a scrolling log shows it."""
    print(f"\n{'!' * 100}\n{warning}\n{'!' * 100}\n", file=sys.stderr, flush=True)


def print_world_warnings(experiment: ExperimentConfig) -> None:
    """Warn about world-only models used off their world."""
    from ragutil_dagster.evaluation.world_scope import experiment_warnings

    for warning in experiment_warnings(experiment):
        print_loudly(warning)


# Each library's own switch for its progress bars and informational logs, read when the library
# is imported or draws a bar, and inherited by the multiprocess executor's workers.
QUIET_LIBRARIES = {
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",  # MLflow's "Downloading artifacts" bars
    "MLFLOW_LOGGING_LEVEL": "WARNING",  # MLflow's INFO lines (creating its database tables…)
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # Hugging Face Hub's and transformers' ("Loading weights")
    # vLLM's engine start-up INFO lines (dozens per engine) and its WARNINGs about the CPU build it
    # runs on (no Triton, Inductor off, OMP threads): none is the user's to act on.
    "VLLM_LOGGING_LEVEL": "ERROR",
    # Every other library's tqdm bar (transformers' GGUF conversion, vLLM's weight shards, in its
    # engine process too): tqdm reads TQDM_* as its defaults, and ragutil's bars set ``disable``.
    "TQDM_DISABLE": "1",
    # What vLLM's engine processes print past the above (their notes on the CPU build, weight-
    # loading bars that set their own ``disable``, torch's C++ NUMA warnings): into a log file.
    ENGINE_OUTPUT_ENV: "log",
}


@contextmanager
def tqdm_disabled_by_default() -> Iterator[None]:
    """In this process, tqdm bars that do not set ``disable`` are off for the ``with`` block.

    tqdm reads ``TQDM_*`` once, at import, into the keyword defaults of ``tqdm.__init__`` (a
    ``partialmethod``); the environment reaches processes started later (vLLM's engine, the
    executor's step processes), and this sets the same default for steps run in this process."""
    from tqdm.std import tqdm

    defaults = getattr(tqdm.__dict__.get("__init__"), "keywords", None)
    if not isinstance(defaults, dict):  # a tqdm without environment defaults: bars stay
        yield
        return
    saved = dict(defaults)
    defaults["disable"] = True
    try:
        yield
    finally:
        defaults.clear()
        defaults.update(saved)


@contextmanager
def third_party_output(shown: bool) -> Iterator[None]:
    """Unless ``shown`` (``--verbose``): third-party beta / preview warnings (Dagster's, through
    warning filters) and progress bars and INFO logs (:data:`QUIET_LIBRARIES`) are hidden while
    the command runs; both are restored after it."""
    if shown:
        yield
        return
    import dagster as dg

    saved = {name: os.environ.get(name) for name in QUIET_LIBRARIES}
    os.environ.update(QUIET_LIBRARIES)
    try:
        with warnings.catch_warnings(), tqdm_disabled_by_default():
            for category in (dg.BetaWarning, dg.PreviewWarning):
                warnings.filterwarnings("ignore", category=category)
            yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def format_summary(table) -> str:
    """The summary as a text table; a measure no row has (verbalized utility with a model that
    gives none, truth correlations without ground truth) is left out rather than shown as dashes."""
    columns = [
        (c, label)
        for c, label in summary_columns()
        if c in table.columns and table[c].is_not_null().any()
    ]
    headers = ["setting", "generator"] + [label for _, label in columns]
    rows = []
    for row in table.iter_rows(named=True):
        setting = "/".join(
            [
                row["dataset"],
                row["retriever"],
                f"k={row['k']}",
                *(name for name in (row["reranker"], row.get("compression")) if name),
                *(
                    [f"step-{row['multistep_round']}"]
                    if (row.get("multistep_round") or 1) > 1
                    else []
                ),
            ]
        )
        values = ["—" if row[c] is None else f"{row[c]:.3f}" for c, _ in columns]
        rows.append([setting, row["generator"], *values])
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows)]
    line = lambda cells: "  ".join(
        str(c).rjust(w) if i > 1 else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
    )
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _run(args: argparse.Namespace) -> int:
    from ragutil_dagster.models.backends import check_generators

    experiment = load_config(args.config)
    check_generators(experiment)
    if args.executor == CELERY_EXECUTOR:
        from ragutil_dagster.celery_executor import check_setup

        check_setup()  # before the embedded models are installed for workers that cannot be reached
    with third_party_output(args.verbose):
        return _materialize(experiment, args)


def _materialize(experiment: ExperimentConfig, args: argparse.Namespace) -> int:
    from ragutil_dagster.assets import build_assets
    from ragutil_dagster.definitions import build_definitions
    from ragutil_dagster.evaluation.world_scope import known_causes
    from ragutil_dagster.runner import dagster_instance, materialize_all

    print_world_warnings(experiment)
    ensure_embedded_models(experiment, progress=not args.quiet)
    # One bar by default (the run's steps); every model's own bars with --verbose.
    defs = build_definitions(experiment, show_progress=args.verbose)
    parts, _ = build_assets(experiment)
    outcome = materialize_all(
        defs,
        experiment,
        parts,
        dagster_instance(),
        progress=not args.quiet,
        console_log_level="CRITICAL" if args.quiet else "WARNING",
        workers=args.workers,
        force=args.force,
        executor=args.executor,
    )
    print()
    print(
        f"experiment {experiment.name}: {outcome.runs} runs, {outcome.skipped} skipped (unchanged) "
        f"in {outcome.seconds:.0f} s"
    )
    print(format_summary(outcome.summary))
    for note in known_causes(experiment, outcome.summary):
        print(f"note: {note}")
    print(f"\nreports: {outcome.reports}   (summary.csv, summary.md, delta_seper_heatmap.png)")
    print_world_warnings(experiment)  # again below the table, where the numbers are read
    return 0


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def add(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser(
        "run",
        help="materialise the whole evaluation graph of an experiment config",
        description="Materialise every asset of the experiment (training the embedded models "
        "first when the config uses them and they are missing) and print the summary table.",
    )
    run.add_argument("config", help="experiment YAML, e.g. examples/demo.yaml")
    shown = run.add_mutually_exclusive_group()
    shown.add_argument("--quiet", action="store_true", help="no progress bar at all")
    shown.add_argument(
        "--verbose",
        action="store_true",
        help="every progress bar (each model's too) and the libraries' beta warnings, "
        "progress bars and INFO logs, hidden by default",
    )
    run.add_argument(
        "--workers",
        type=_positive,
        default=1,
        metavar="N",
        help="run N partitions of a step at once, every step in a process of its own "
        "(Dagster's multiprocess executor); steps running a model still take turns "
        "(the instance's gpu pool). Default 1: one after the other, in this process",
    )
    run.add_argument(
        "--executor",
        choices=[CELERY_EXECUTOR],
        default=None,
        help="celery: every step a task for the Celery workers of $RAGUTIL_CELERY_BROKER, which "
        "share only the databases, the artifact store and the vLLM servers (docs/scale.md); "
        "--workers N partitions at a time. Default: this machine",
    )
    run.add_argument(
        "--force",
        action="store_true",
        help="materialise every partition; by default one whose code, config slice, models "
        "and upstream partitions are those it was last materialised from is skipped",
    )
    run.set_defaults(func=_run)
