"""Background servers (``dagster dev``, ``mlflow server``) started safely and stopped by PID.

Processes launched from a background job here inherit SIGINT and SIGTERM *ignored*, and an
ignored signal stays ignored across ``exec``; such a server would survive SIGTERM. Servers are
therefore started through a tiny Python prelude that restores the default handlers and then
execs the server (no ``preexec_fn``, which is unsafe once threads exist), in a session of their
own, and are stopped by signalling that process group.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

RESET_SIGNALS_AND_EXEC = (
    "import os, signal, sys; "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); signal.signal(signal.SIGTERM, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists in this PID namespace (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def available_port(preferred: int, host: str = "127.0.0.1") -> int:
    """``preferred`` when it is free on ``host``, else a free port."""
    with socket.socket() as sock:
        try:
            sock.bind((host, preferred))
        except OSError:
            return free_port(host)
    return preferred


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status < 500
    except OSError:
        return False


@contextmanager
def background_server(
    command: Sequence[str],
    ready_url: str,
    log_path: str | Path,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 180.0,
) -> Iterator[subprocess.Popen]:
    """Run ``command`` (an executable path first) until ``ready_url`` answers; stop it on exit.

    Raises with the end of the server's log when it exits early or is not ready in time.
    """
    log_path = Path(log_path)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", RESET_SIGNALS_AND_EXEC, *command],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )
        try:
            deadline = time.monotonic() + timeout
            while not _ready(ready_url):
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{command[0]} exited with {process.returncode}: {log_path.read_text()[-3000:]}"
                    )
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{ready_url} not ready after {timeout:.0f} s: {log_path.read_text()[-3000:]}"
                    )
                time.sleep(1)
            yield process
        finally:
            stop(process)


def stop(process: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM the process group, then SIGKILL it if it is still there after ``grace`` seconds."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
