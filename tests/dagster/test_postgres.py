"""The Dagster instance and MLflow on PostgreSQL, chosen by environment variables: a whole tiny
``ragutil run`` against a real server (the session's ``postgres`` fixture), then PostgreSQL is
queried for what landed there; a Dagster database that is down is one line."""

from __future__ import annotations

import re

import pytest
import yaml

from ragutil_dagster.cli import main
from ragutil_dagster.infra.databases import (
    DAGSTER_HOME_VARIABLE,
    DAGSTER_POSTGRES_URL_VARIABLE,
    MLFLOW_TRACKING_URI_VARIABLE,
)
from ragutil_dagster.infra.processes import free_port
from ragutil_dagster.tracking.claims import CLAIMS_TABLE


@pytest.fixture()
def tiny_yaml(tiny_world, make_tiny_config, tmp_path, monkeypatch):
    _, world, models = tiny_world
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(make_tiny_config(models, world)))
    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(DAGSTER_HOME_VARIABLE, raising=False)
    return path


def test_ragutil_run_keeps_dagster_and_mlflow_in_postgres(
    postgres, tiny_yaml, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv(DAGSTER_POSTGRES_URL_VARIABLE, postgres.create_database("dagster"))
    monkeypatch.setenv(MLFLOW_TRACKING_URI_VARIABLE, postgres.create_database("mlflow"))
    assert main(["run", str(tiny_yaml), "--quiet"]) == 0
    steps = int(re.search(r"experiment tiny: (\d+) runs", capsys.readouterr().out).group(1))
    home = tmp_path / "home"
    settings = (home / "dagster" / "dagster.yaml").read_text()
    assert f"env: {DAGSTER_POSTGRES_URL_VARIABLE}" in settings and "postgresql://" not in settings
    assert not list(home.rglob("*.db"))  # no SQLite store was written on the side
    # MLflow's artifacts under ragutil's home, not ./mlruns of the working directory.
    assert len(list((home / "mlruns").rglob("scores/table.parquet"))) == 4

    # Dagster: every step a successful run, its events in the event log, pool slots all freed.
    assert postgres.query("dagster", "SELECT status, count(*) FROM runs GROUP BY status") == [
        ("SUCCESS", steps)
    ]
    materialised = dict(
        postgres.query(
            "dagster",
            "SELECT asset_key, count(*) FROM event_logs WHERE dagster_event_type = "
            "'ASSET_MATERIALIZATION' GROUP BY asset_key",
        )
    )
    assert materialised['["metric_scores"]'] == 4 and materialised['["reports"]'] == 1
    assert postgres.query(
        "dagster", "SELECT count(*) FROM concurrency_slots WHERE run_id IS NOT NULL"
    ) == [(0,)]

    # MLflow: one FINISHED run per setting × generator, plus the comparison the reports logged.
    kinds = postgres.query(
        "mlflow",
        "SELECT t.value, r.status, count(*) FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
        "WHERE t.key = 'ragutil.kind' GROUP BY t.value, r.status ORDER BY t.value",
    )
    assert kinds == [("comparison", "FINISHED", 1), ("partition", "FINISHED", 4)]
    assert (
        postgres.query("mlflow", "SELECT count(*) FROM metrics WHERE key = 'delta_seper_s'")[0][0]
        >= 4
    )
    assert postgres.query("mlflow", f"SELECT count(*) FROM {CLAIMS_TABLE}") == [(0,)]


def test_a_dagster_database_that_is_down_is_one_line(tiny_yaml, monkeypatch, capsys) -> None:
    monkeypatch.setenv(
        DAGSTER_POSTGRES_URL_VARIABLE, f"postgresql://ragutil:pw@127.0.0.1:{free_port()}/dagster"
    )
    assert main(["run", str(tiny_yaml), "--quiet"]) == 2
    error = capsys.readouterr().err.strip()
    assert re.fullmatch(
        r"ragutil run: error: cannot reach the Dagster instance's PostgreSQL at postgresql://ragutil:\*\*\*@"
        rf"127\.0\.0\.1:\d+/dagster \(.*refused.*\); start the database or change or unset {DAGSTER_POSTGRES_URL_VARIABLE}",
        error,
    ), error
