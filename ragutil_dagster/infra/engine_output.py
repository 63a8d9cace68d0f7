"""Engines' own output out of the terminal: what an inference engine and the processes it starts
print (vLLM's notes on the CPU build it runs on, its weight-loading bars, torch's C++ warnings)
goes to a log file while ``ragutil run`` / ``ragutil score`` run without ``--verbose``."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from ragutil_dagster.infra.files import ragutil_home

ENGINE_OUTPUT_ENV = "RAGUTIL_ENGINE_OUTPUT"
"""Set to ``log`` (``ragutil run`` / ``score`` without ``--verbose``): what vLLM and its engine
processes print while the engine is imported and started — its notes about the CPU build (Triton,
NUMA binding), its weight-loading bars, torch's C++ warnings — goes to a log file under
``$RAGUTIL_HOME/logs`` instead of the terminal, where none of it is the user's to act on."""


@contextmanager
def engine_output() -> Iterator[None]:
    """Standard output and error of this process, and of the processes it starts, into the engine
    log for the ``with`` block when :data:`ENGINE_OUTPUT_ENV` says ``log``; a failure inside names
    the log. File descriptors are redirected, not ``sys.stdout``: the engine core and its workers are
    other processes (they inherit the log) and torch's warnings come from C++."""
    if os.environ.get(ENGINE_OUTPUT_ENV) != "log":
        yield
        return
    log = ragutil_home() / "logs" / f"vllm-engine-{os.getpid()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with log.open("ab") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        except BaseException as error:
            error.add_note(f"vLLM's own output while starting: {log}")
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
