"""Named crash points for fault-injection tests (the failpoint pattern of FreeBSD's ``fail(9)``
and TiKV's ``fail-rs``).

``RAGUTIL_FAILPOINT=<name>[:<n>[:group]]`` makes the process kill itself with SIGKILL the ``n``-th
time (default: the first) execution passes ``failpoint(<name>)`` — no clean-up handler, ``finally``
block or atexit hook runs, exactly as when the OOM killer or a scheduler pre-empts a worker. With
``group`` the whole process group dies with it — a Celery worker and its pool, as when their machine
is lost; with ``term`` the process is sent SIGTERM instead, as a scheduler stopping it politely.
Unset, as always outside the tests, a failpoint costs one environment lookup.

The points: ``sampling`` (after each checkpointed batch of generations), ``nli`` (after each
cached batch of NLI probabilities), ``scoring`` (metrics computed, nothing written yet),
``mlflow`` (run opened and parameters logged, metrics not yet), ``parquet_write`` (a table's
files written — on a local disk under its object's unique key, for an object store still staged
locally), ``publish`` (any artifact's object in the store — uploaded to an object store — its
manifest not yet published).
"""

from __future__ import annotations

import os
import signal

ENV = "RAGUTIL_FAILPOINT"
POINTS = ("sampling", "nli", "scoring", "mlflow", "parquet_write", "publish")

_passes: dict[str, int] = {}


def failpoint(name: str) -> None:
    """Die by SIGKILL (or be sent SIGTERM) here if ``$RAGUTIL_FAILPOINT`` names this point and
    this is its n-th pass."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    target, _, rest = spec.partition(":")
    if target != name:
        return
    nth, _, scope = rest.partition(":")
    _passes[name] = _passes.get(name, 0) + 1
    if _passes[name] == int(nth or 1):
        if scope == "term":
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if scope == "group":
            os.killpg(os.getpgid(0), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
