"""The ``ragutil`` command.

Subcommands are registered by small ``_add_<group>`` functions, each adding its own parser to the
shared subparsers object and setting ``func``; other areas add theirs the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ragutil_dagster.commands import add_commands


def _world_build(args: argparse.Namespace) -> int:
    # Imported here: torch and transformers load only for commands that need them.
    from ragutil_dagster.embedded.training import format_quality, train_all

    trained = train_all(args.out, size=args.size, seed=args.seed, progress=not args.quiet)
    print(f"world:  {trained.world_dir}")
    print(f"reader: {trained.reader_dir}")
    print(f"nli:    {trained.nli_dir}")
    print()
    print(format_quality(trained.quality))
    print(f"NLI accuracy on fresh answer pairs: {trained.nli_accuracy:.3f}")
    print(f"reader steps {trained.config.reader_steps}, NLI steps {trained.config.nli_steps}")
    for label, times in (("wall seconds", trained.seconds), ("CPU seconds", trained.cpu_seconds)):
        print(f"{label}: " + json.dumps({k: round(v, 1) for k, v in times.items()}))
    return 0


def _add_world(sub: argparse._SubParsersAction) -> None:
    world = sub.add_parser("world", help="the synthetic knowledge world and its trained models")
    world_sub = world.add_subparsers(dest="world_command", required=True)
    build = world_sub.add_parser(
        "build", help="generate the world and train its reader LM and NLI model",
        description="Write OUT/world (BEIR folder + ground truth), OUT/reader and OUT/nli (HF "
                    "model directories) and OUT/build.json, then print the reader's quality table.")
    build.add_argument("--out", required=True, help="output directory")
    build.add_argument("--seed", type=int, default=0, help="seed of world and training (default 0)")
    build.add_argument("--size", choices=("default", "ci"), default="default",
                       help="default: 500 entities, ~10 min of one CPU core; ci: 100, ~2 min")
    build.add_argument("--quiet", action="store_true", help="no progress bars")
    build.set_defaults(func=_world_build)


def build_parser() -> argparse.ArgumentParser:
    """The ``ragutil`` argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="ragutil", description="Retrieval utility in RAG.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_world(sub)
    add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ragutil`` command; returns the exit status.

    Errors in what the user supplied (config, records, corpus, model names) are printed as one
    message, without a traceback, and exit with status 2.
    """
    from ragutil_dagster.errors import StepFailedError, is_user_error

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except StepFailedError as err:
        # The step's own traceback is in the Dagster run log; repeating the runner's adds nothing.
        print(f"ragutil {args.command}: error: {err}", file=sys.stderr)
        return 2 if err.user_error else 1
    except Exception as err:
        if not is_user_error(err):
            raise
        print(f"ragutil {args.command}: error: {err}", file=sys.stderr)
        return 2

if __name__ == "__main__":
    sys.exit(main())
