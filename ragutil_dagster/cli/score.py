"""``ragutil score``: score a user's own JSONL records without Dagster."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ragutil_dagster.cli.run import print_loudly, third_party_output
from ragutil_dagster.config import ExperimentConfig, GeneratorConfig, load_config
from ragutil_dagster.embedded.setup import ensure_embedded_models
from ragutil_dagster.errors import ConfigError


def _score_generator(
    experiment: ExperimentConfig, config: str, name: str | None
) -> GeneratorConfig:
    """The generator ``--generator`` names (the config's first when not given)."""
    if name is None:
        return experiment.generators[0]
    names = [g.name for g in experiment.generators]
    if name not in names:
        raise ConfigError(
            f"{config}: --generator {name!r} is not a generator of the config; it has: {', '.join(names)}"
        )
    return experiment.generator(name)


def records_warning(experiment: ExperimentConfig, spec: GeneratorConfig, file: str) -> str | None:
    """The warning for world-only models scoring ``file`` (records are never the synthetic world)."""
    from ragutil_dagster.evaluation.world_scope import off_world_models, off_world_warning

    off = off_world_models([spec.model, experiment.nli.model], None)
    return off_world_warning(off, f"the records of {file}") if off else None


def adaptive_summary(scores: list[dict]) -> str:
    """The line ``ragutil score`` prints under adaptive sampling: the share drawn and its bias."""
    from ragutil_dagster.evaluation.prompt_sampling import ADAPTIVE_BIAS_NOTE

    shares = [row["sample_fraction"] for row in scores]
    mean = sum(shares) / max(len(shares), 1)
    return f"{ADAPTIVE_BIAS_NOTE}; these records drew {mean:.3f} of N on average"


def _score(args: argparse.Namespace) -> int:
    with third_party_output(args.verbose):
        return _score_quietly(args)


def _score_quietly(args: argparse.Namespace) -> int:
    from ragutil_dagster.data.records import read_records
    from ragutil_dagster.definitions import build_resources
    from ragutil_dagster.evaluation.records import score_records
    from ragutil_dagster.infra.files import atomic_write

    experiment = load_config(args.config)
    records = read_records(args.file)
    spec = _score_generator(experiment, args.config, args.generator)
    if args.out and Path(args.out).is_dir():
        # Checked before the models load and sample, not after minutes of scoring.
        raise ConfigError(f"--out {args.out}: is a directory; name the JSONL file to write")
    warning = records_warning(experiment, spec, args.file)
    if warning:
        print_loudly(warning)
    # Only what scoring uses: the named generator and the NLI (not, say, another generator's world).
    ensure_embedded_models(
        experiment.model_copy(update={"generators": [spec]}), progress=not args.quiet
    )
    models = build_resources(show_progress=not args.quiet, for_dagster=False)["models"]
    scores = score_records(
        records,
        experiment,
        spec,
        models.generator(spec),
        models.scorer(spec),
        models.entailment(experiment.nli),
    )
    if experiment.sampling.adaptive is not None:
        print_loudly(adaptive_summary(scores))
    lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in scores)
    if args.out:
        atomic_write(args.out, lambda temporary: temporary.write_text(lines, encoding="utf-8"))
        print(f"wrote {len(scores)} scored records to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(lines)
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    score = sub.add_parser(
        "score",
        help="score your own JSONL records without Dagster",
        description='Each line: {"id", "question", "answers": [...], "contexts": [text or {"id", "text"}, ...]}. '
        "Writes one JSON line of scores per record.",
    )
    score.add_argument("file", help="records JSONL")
    score.add_argument(
        "--config",
        required=True,
        help="experiment YAML naming the generator, NLI model and sampling",
    )
    score.add_argument("--generator", help="generator name from the config (default: the first)")
    score.add_argument("--out", help="output JSONL (default: standard output)")
    shown = score.add_mutually_exclusive_group()
    shown.add_argument("--quiet", action="store_true", help="no progress bars")
    shown.add_argument(
        "--verbose",
        action="store_true",
        help="also other libraries' progress bars, INFO logs and beta warnings (vLLM's, MLflow's, Dagster's)",
    )
    score.set_defaults(func=_score)
