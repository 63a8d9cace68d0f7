"""One MLflow run per run key and one LoggedModel per identity when processes race — on SQLite and
on PostgreSQL — a dead holder's claim taken over, and a database that is down as one clear error."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from ragutil_dagster.errors import DatabaseUnavailableError
from ragutil_dagster.infra.processes import free_port
from ragutil_dagster.tracking import MlflowTracking
from ragutil_dagster.tracking.claims import CLAIMS_TABLE, claim
from ragutil_dagster.tracking.keys import RUN_KEY_TAG

WORKER = Path(__file__).with_name("race_worker.py")


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'mlflow.db'}"
    return request.getfixturevalue("postgres").create_database(
        f"race_{os.getpid()}_{time.monotonic_ns()}"
    )


@pytest.mark.slow
def test_racing_processes_share_one_run_and_one_model_and_never_interleave(
    store, tmp_path, release_together
) -> None:
    def contender(ready: Path, go: Path) -> list[str]:
        return [sys.executable, str(WORKER), store, str(tmp_path), "race-key", str(ready), str(go)]

    first, second = sorted(
        release_together([contender, contender], tmp_path), key=lambda r: r["start"]
    )
    assert first["run_id"] == second["run_id"]
    assert (first["reused"], second["reused"]) == (False, True)
    assert first["model_id"] == second["model_id"]
    # The second writer began only after the first had logged its last artifact.
    assert second["start"] >= first["end"]
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("ragutil/race").experiment_id
    runs = client.search_runs([experiment], filter_string=f"tags.`{RUN_KEY_TAG}` = 'race-key'")
    assert [r.info.run_id for r in runs] == [first["run_id"]]
    assert runs[0].info.status == "FINISHED"
    models = client.search_logged_models([experiment])
    assert [m.model_id for m in models] == [first["model_id"]]
    # Every artifact is the second writer's: its writes replaced the first's, none mixed in.
    artifacts = Path(
        client.download_artifacts(first["run_id"], "scores", str(tmp_path / "download"))
    )
    assert {p.read_text() for p in artifacts.iterdir()} == {str(second["pid"])}
    with sa.create_engine(store).connect() as db:  # every claim was released
        assert db.execute(sa.text(f"SELECT count(*) FROM {CLAIMS_TABLE}")).scalar() == 0


@pytest.mark.slow
def test_a_live_holder_is_waited_for_and_a_silent_one_taken_over(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'claims.db'}"
    released = threading.Event()

    def hold() -> None:
        with claim(url, "k"):
            time.sleep(1.0)
        released.set()

    holder = threading.Thread(target=hold)
    holder.start()
    time.sleep(0.3)
    with claim(url, "k"):
        assert released.is_set()
    holder.join()
    # A holder killed outright leaves its row; its beat never moves again.
    with sa.create_engine(url).begin() as db:
        db.execute(
            sa.text(f"INSERT INTO {CLAIMS_TABLE} (claim_key, holder, beat) VALUES ('k', 'dead', 7)")
        )
    start = time.monotonic()
    with claim(url, "k", stale_after=1.0):
        waited = time.monotonic() - start
        with sa.create_engine(url).connect() as db:
            holder_now = db.execute(sa.text(f"SELECT holder FROM {CLAIMS_TABLE}")).scalar()
    assert 1.0 <= waited < 10 and holder_now != "dead"


def test_a_killed_holder_on_this_machine_is_taken_over_without_waiting_out_its_heartbeat(
    tmp_path,
) -> None:
    url = f"sqlite:///{tmp_path / 'claims.db'}"
    held = tmp_path / "held"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import pathlib, sys, time\n"
                "from ragutil_dagster.tracking.claims import claim\n"
                "with claim(sys.argv[1], 'k'):\n"
                "    pathlib.Path(sys.argv[2]).touch()\n"
                "    time.sleep(600)\n"
            ),
            url,
            str(held),
        ]
    )
    try:
        deadline = time.monotonic() + 60
        while not held.exists():
            assert holder.poll() is None and time.monotonic() < deadline, (
                "the holder did not take the claim"
            )
            time.sleep(0.05)
    finally:
        holder.kill()  # SIGKILL, by PID: the claim's row stays behind
        holder.wait()
    start = time.monotonic()
    with claim(url, "k"):  # the default heartbeat rule would wait 60 s
        waited = time.monotonic() - start
    assert waited < 5


def test_a_database_that_is_down_is_one_clear_error(tmp_path) -> None:
    url = f"postgresql://ragutil:secret@127.0.0.1:{free_port()}/mlflow"
    start = time.monotonic()
    with pytest.raises(
        DatabaseUnavailableError,
        match=r"cannot reach the MLflow tracking database at "
        r"postgresql://ragutil:\*\*\*@127\.0\.0\.1:\d+/mlflow \(.*refused.*\); .* MLFLOW_TRACKING_URI",
    ):
        MlflowTracking(home=str(tmp_path), tracking_uri=url).client()
    assert time.monotonic() - start < 30  # not MLflow's hour of retries
