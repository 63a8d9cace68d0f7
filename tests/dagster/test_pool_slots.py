"""The ``gpu`` pool admits one model step at a time on ragutil's SQLite instance, also when many
run processes claim its slot at the same moment (Dagster's plain SQLite event log lets several
of them win: it relies on ``SELECT … FOR UPDATE``, which SQLite ignores)."""

from __future__ import annotations

import multiprocessing

import dagster as dg
import pytest

from ragutil_dagster.assets.common import GPU_POOL
from ragutil_dagster.infra.databases import DAGSTER_HOME_VARIABLE, DAGSTER_POSTGRES_URL_VARIABLE
from ragutil_dagster.instance.event_log import SerializedSqliteEventLogStorage
from ragutil_dagster.runner import dagster_instance

CLAIMANTS = 8


def _claim(instance_ref, run_id: str, barrier, claims) -> None:
    with dg.DagsterInstance.from_ref(instance_ref) as instance:
        barrier.wait()
        claims.put(
            instance.event_log_storage.claim_concurrency_slot(
                GPU_POOL, run_id, "generations"
            ).is_claimed
        )


def _claimed_together(instance: dg.DagsterInstance) -> int:
    """How many of ``CLAIMANTS`` processes, released together, claim the pool's single slot."""
    instance.event_log_storage.set_concurrency_slots(GPU_POOL, 1)
    context = multiprocessing.get_context("fork")
    barrier, claims = context.Barrier(CLAIMANTS), context.Queue()
    processes = [
        context.Process(target=_claim, args=(instance.get_ref(), f"run-{i}", barrier, claims))
        for i in range(CLAIMANTS)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert all(process.exitcode == 0 for process in processes)
    return sum(claims.get(timeout=10) for _ in processes)


@pytest.mark.parametrize("trial", range(3))
def test_one_process_claims_the_single_gpu_slot(trial, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(DAGSTER_HOME_VARIABLE, raising=False)
    monkeypatch.delenv(DAGSTER_POSTGRES_URL_VARIABLE, raising=False)
    with dagster_instance(tmp_path) as instance:
        assert isinstance(instance.event_log_storage, SerializedSqliteEventLogStorage)
        assert _claimed_together(instance) == 1
        # Releasing assigns the slot to a pending step inside the lock: re-entered, not waited on.
        instance.event_log_storage.free_concurrency_slots_for_run("run-0")
        for run_id in (f"run-{i}" for i in range(CLAIMANTS)):
            instance.event_log_storage.free_concurrency_slots_for_run(run_id)
        assert instance.event_log_storage.get_concurrency_info(GPU_POOL).active_slot_count == 0
