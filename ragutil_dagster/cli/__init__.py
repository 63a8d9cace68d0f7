"""The ``ragutil`` command: one module per subcommand, each adding its parser with ``add``.

Every error the user can fix (:class:`~ragutil_dagster.errors.UserError`, or a missing file they
named) is printed as one line and exits with status 2; a failed step of ``ragutil run`` exits 2
when its root cause is such an error, else 1; a run stopped by SIGTERM or Ctrl-C says so in one
line and exits 130.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext

from ragutil_dagster.cli import clean, compare, run, score, ui, world


def build_parser() -> argparse.ArgumentParser:
    """The ``ragutil`` argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="ragutil", description="Retrieval utility in RAG.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (world, run, score, compare, ui, clean):
        command.add(sub)
    return parser


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def sigterm_exits() -> Iterator[None]:
    """SIGTERM raises SystemExit while a command runs (it may be inherited ignored), so a stopped
    command unwinds: ``with`` blocks stop the servers they started and the atexit hook shuts the
    vLLM engine down, whose processes a plain SIGTERM would leave orphaned. The previous handler
    comes back afterwards (tests call :func:`main` in process)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ragutil`` command; returns the exit status."""
    from ragutil_dagster.errors import RunInterruptedError, StepFailedError, is_user_error

    args = build_parser().parse_args(argv)
    # Not under `run`: Dagster's step wrapper (raise_on_error=False) would record the SystemExit as
    # the step's failure and go on with the next steps instead of stopping.
    stopping = nullcontext() if args.command == "run" else sigterm_exits()
    try:
        with stopping:
            return args.func(args)
    except RunInterruptedError as err:
        print(f"ragutil {args.command}: {err}", file=sys.stderr)
        return 130
    except StepFailedError as err:
        # The step's own traceback is in the Dagster run log; repeating the runner's adds nothing.
        print(f"ragutil {args.command}: error: {err}", file=sys.stderr)
        return 2 if err.user_error else 1
    except Exception as err:
        if not is_user_error(err):
            raise
        print(f"ragutil {args.command}: error: {err}", file=sys.stderr)
        return 2
