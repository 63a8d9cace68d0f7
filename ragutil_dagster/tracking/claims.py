"""One writer per key, across processes and machines: a claim row in the tracking database.

MLflow has no unique constraint on tags, so two processes that look for the run of a key at the
same moment both miss and both create one. ragutil therefore keeps a small table,
``ragutil_claims``, in the tracking database itself (through SQLAlchemy, which MLflow already
uses): its primary key is what the database enforces. Whoever INSERTs a key holds it; anyone else
waits until the row is gone and then finds what the holder made (the run, the LoggedModel).

- The holder keeps the claim for the whole body (finding or creating the run, scoring, logging
  artifacts), so two processes never interleave their writes to one run, and DELETEs the row when
  it leaves.
- A holder that dies (SIGKILL, OOM, a lost machine) cannot delete its row. It therefore bumps the
  row's ``beat`` every :data:`HEARTBEAT_SECONDS`; a waiter that sees the beat unchanged for
  :data:`STALE_SECONDS` by its own clock takes the claim over, and that UPDATE names the beat it
  saw, so of several waiters exactly one wins. No clocks are compared across machines.
- A holder on the waiter's own machine (same kernel boot and PID namespace, named in the holder
  id) whose process is gone is taken over at once: a ``ragutil run`` started again after a crash
  does not wait out the heartbeat. A PID reused since falls back to the heartbeat rule.

Transactions stay short (one statement each), so the claim never blocks MLflow's own writes,
even on SQLite where a transaction locks the whole file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import sqlalchemy as sa

from ragutil_dagster.infra.databases import database_engine
from ragutil_dagster.infra.processes import process_alive

CLAIMS_TABLE = "ragutil_claims"
HEARTBEAT_SECONDS = 5.0
STALE_SECONDS = 60.0
"""A holder whose beat has not moved for this long is presumed dead (12 missed heartbeats)."""
POLL_SECONDS = 0.2

_log = logging.getLogger(__name__)
_metadata = sa.MetaData()
_claims = sa.Table(
    CLAIMS_TABLE,
    _metadata,
    sa.Column("claim_key", sa.String(128), primary_key=True),
    sa.Column("holder", sa.String(32), nullable=False),
    sa.Column("beat", sa.Integer, nullable=False),
)


_UNKNOWN_MACHINE = "unknown0"


@cache
def _machine() -> str:
    """This process's PID space: the kernel's boot id and the PID namespace, hashed (8 hex)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # not Linux: no PID is ever judged, the heartbeat decides
        return _UNKNOWN_MACHINE
    return hashlib.sha256(f"{boot}:{namespace}".encode()).hexdigest()[:8]


def _new_holder() -> str:
    """``<machine>.<pid in hex>.<random>``, 32 characters (the column's width)."""
    return f"{_machine()}.{os.getpid():x}.{uuid.uuid4().hex}"[:32]


def _holder_is_gone(holder: str) -> bool:
    """Whether ``holder`` names a process of this PID space that no longer exists (ids of other
    machines, and of older ragutil versions, are never judged)."""
    machine, _, rest = holder.partition(".")
    pid, dot, _ = rest.partition(".")
    if not dot or machine != _machine() or machine == _UNKNOWN_MACHINE:
        return False
    try:
        return not process_alive(int(pid, 16))
    except ValueError:
        return False


def _try_insert(engine: sa.Engine, key: str, holder: str) -> bool:
    try:
        with engine.begin() as db:
            db.execute(_claims.insert().values(claim_key=key, holder=holder, beat=0))
        return True
    except sa.exc.IntegrityError:
        return False


def _acquire(engine: sa.Engine, key: str, holder: str, stale_after: float) -> None:
    seen, seen_at, waited = None, time.monotonic(), False
    while not _try_insert(engine, key, holder):
        with engine.connect() as db:
            row = db.execute(
                sa.select(_claims.c.holder, _claims.c.beat).where(_claims.c.claim_key == key)
            ).first()
        if row is None:  # released between our INSERT and SELECT: try again at once
            continue
        if tuple(row) != seen:
            seen, seen_at = tuple(row), time.monotonic()
        gone = _holder_is_gone(row.holder)
        if gone or time.monotonic() - seen_at > stale_after:
            with engine.begin() as db:
                taken = db.execute(
                    _claims.update()
                    .where(
                        _claims.c.claim_key == key,
                        _claims.c.holder == row.holder,
                        _claims.c.beat == row.beat,
                    )
                    .values(holder=holder, beat=0)
                ).rowcount
            if taken:
                why = "its process is gone" if gone else f"silent for {stale_after:.0f} s"
                _log.warning("took over claim %s from %s: %s", key, row.holder, why)
                return
        if not waited:
            _log.info("waiting for claim %s, held by another process (%s)", key, row.holder)
            waited = True
        time.sleep(POLL_SECONDS)


def _heartbeat(engine: sa.Engine, key: str, holder: str, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_SECONDS):
        try:
            with engine.begin() as db:
                db.execute(
                    _claims.update()
                    .where(_claims.c.claim_key == key, _claims.c.holder == holder)
                    .values(beat=_claims.c.beat + 1)
                )
        except sa.exc.SQLAlchemyError as err:  # a blip: the next beat tries again
            _log.warning("heartbeat of claim %s failed: %s", key, err)


@contextmanager
def claim(url: str, key: str, stale_after: float = STALE_SECONDS) -> Iterator[None]:
    """Hold ``key`` in the database at ``url`` (a SQLAlchemy URL) for the ``with`` block, waiting
    while another live process holds it."""
    engine, holder = database_engine(url, _metadata), _new_holder()
    _acquire(engine, key, holder, stale_after)
    stop = threading.Event()
    beating = threading.Thread(target=_heartbeat, args=(engine, key, holder, stop), daemon=True)
    beating.start()
    try:
        yield
    finally:
        stop.set()
        beating.join()
        with engine.begin() as db:
            db.execute(
                _claims.delete().where(_claims.c.claim_key == key, _claims.c.holder == holder)
            )
