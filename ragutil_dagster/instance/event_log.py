"""Dagster's SQLite event log with pool-slot claims serialised across processes.

Dagster claims a pool slot by selecting a free slot row ``FOR UPDATE SKIP LOCKED`` and then
writing the step into it. PostgreSQL locks the row; SQLite ignores the clause, so two run
processes claiming at the same moment can both select the one free slot of the ``gpu`` pool and
both run a model step (seen with ``ragutil run --workers 2``: two ``generations`` steps started
together). Here each claim and each release holds an exclusive lock on a file beside the event
log, which makes the select-then-write atomic for every process on the machine — the only
processes that can share a SQLite instance.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path

from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage

from ragutil_dagster.infra.locks import exclusive_file_lock

LOCK_NAME = "pool_slots.lock"


class SerializedSqliteEventLogStorage(SqliteEventLogStorage):
    """:class:`SqliteEventLogStorage` whose pool-slot claims and releases hold one file lock."""

    def __init__(self, base_dir: str, inst_data=None) -> None:
        super().__init__(base_dir, inst_data=inst_data)
        # Releasing a slot assigns it to a pending step inside the same call: the lock is taken
        # once per thread (flock on a second descriptor of the same file would wait for itself).
        self._held = threading.local()

    @classmethod
    def from_config_value(cls, inst_data, config_value) -> SerializedSqliteEventLogStorage:
        return cls(inst_data=inst_data, **config_value)

    @contextmanager
    def _slots_locked(self) -> Iterator[None]:
        depth = getattr(self._held, "depth", 0)
        with nullcontext() if depth else exclusive_file_lock(Path(self._base_dir) / LOCK_NAME):
            self._held.depth = depth + 1
            try:
                yield
            finally:
                self._held.depth = depth

    def claim_concurrency_slot(
        self, concurrency_key: str, run_id: str, step_key: str, priority: int | None = None
    ):
        with self._slots_locked():
            return super().claim_concurrency_slot(concurrency_key, run_id, step_key, priority)

    def free_concurrency_slots_for_run(self, run_id: str) -> None:
        with self._slots_locked():
            super().free_concurrency_slots_for_run(run_id)

    def free_concurrency_slot_for_step(self, run_id: str, step_key: str) -> None:
        with self._slots_locked():
            super().free_concurrency_slot_for_step(run_id, step_key)

    def assign_pending_steps(self, concurrency_keys: Sequence[str]):
        with self._slots_locked():
            return super().assign_pending_steps(concurrency_keys)
