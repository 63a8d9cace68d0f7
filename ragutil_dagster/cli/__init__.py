"""The ``ragutil`` command: one module per subcommand, each adding its parser with ``add``.

Every error the user can fix (:class:`~ragutil_dagster.errors.UserError`, or a missing file they
named) is printed as one line and exits with status 2; a failed step of ``ragutil run`` exits 2
when its root cause is such an error, else 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ragutil_dagster.cli import clean, compare, run, score, ui, world


def build_parser() -> argparse.ArgumentParser:
    """The ``ragutil`` argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="ragutil", description="Retrieval utility in RAG.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (world, run, score, compare, ui, clean):
        command.add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ragutil`` command; returns the exit status."""
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
