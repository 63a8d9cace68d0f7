"""The graph on Dagster's Celery executor: ``ragutil run --executor celery`` with its steps on
Celery worker processes that share nothing with the launcher or each other but PostgreSQL (the
Dagster instance, MLflow, the generation cache), the S3 server (artifacts, the embedded world and
models) and the Redis broker — each worker has a home and scratch directory of its own. All of it
runs on 127.0.0.1 and is stopped by PID.

The tiny world with the embedded reader and world NLI (so workers must find the embedded build in
the object store), compared with the in-process run of the same config. One Celery run goes
through every fault at once — a worker SIGKILLed with its pool mid-step, workers whose home is
wiped before every step, the broker restarted mid-run — and is resumed by running the command
again: one run, because CI's time is short and the faults do not mask each other (each leaves its
own trace, checked below)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import redis
import yaml
from mlflow import MlflowClient

from ragutil_dagster.infra.databases import (
    DAGSTER_HOME_VARIABLE,
    DAGSTER_POSTGRES_URL_VARIABLE,
    GENERATION_CACHE_URL_VARIABLE,
    MLFLOW_TRACKING_URI_VARIABLE,
)
from ragutil_dagster.infra.failpoints import ENV as FAILPOINT
from ragutil_dagster.infra.files import embedded_tracking_uri
from ragutil_dagster.infra.objectstore import ARTIFACTS_URL_VARIABLE
from ragutil_dagster.infra.processes import RESET_SIGNALS_AND_EXEC, free_port
from ragutil_dagster.infra.shared import EMBEDDED_BUILD
from ragutil_dagster.resources import ArtifactStore
from ragutil_dagster.tracking.keys import KIND_TAG, RUN_KEY_TAG

HOOKS = Path(__file__).parent / "celery_worker_hooks"
PARTITION = "reader|world__bm25__k1"
SCORE_TABLES = [
    ("metric_scores", "table.parquet"),
    ("metric_scores", "summary.json"),
    ("document_scores", "table.parquet"),
    ("generations", "table.parquet"),
]


def _start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """``command`` in a session of its own with SIGINT / SIGTERM reset (they arrive ignored here)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", RESET_SIGNALS_AND_EXEC, *command],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def _kill(process: subprocess.Popen) -> None:
    """SIGKILL the process's group (a Celery worker and its pool) and reap it."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


class Redis:
    """A redis-server on a free port of 127.0.0.1, no persistence (a restart loses every queued
    step, as a broker without persistence does)."""

    def __init__(self, directory: Path) -> None:
        self.port, self.directory = free_port(), directory
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = self._start()

    def _start(self) -> subprocess.Popen:
        server = shutil.which("redis-server")
        assert server, (
            "redis-server is not installed: run install.sh (apt-get install redis-server)"
        )
        process = _start(
            [
                server,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            self.directory / "redis.log",
            dict(os.environ),
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                redis.Redis(port=self.port, socket_connect_timeout=1).ping()
                return process
            except redis.ConnectionError:
                assert process.poll() is None and time.monotonic() < deadline, (
                    self.directory / "redis.log"
                ).read_text()
                time.sleep(0.1)

    def restart(self) -> None:
        _kill(self.process)
        self.process = self._start()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = Redis(tmp_path_factory.mktemp("redis"))
    yield server
    _kill(server.process)


@pytest.fixture(scope="module")
def config(tiny_world, make_tiny_config, tmp_path_factory) -> Path:
    """The tiny world (3 queries, BM25, k = 1) read by the embedded reader (in float32: runs are
    compared to the bit, see docs/reliability.md "Determinism") and the world NLI."""
    _, world, models = tiny_world
    spec = make_tiny_config(models, world)
    spec.update(
        {
            "retrievers": spec["retrievers"][:1],
            "k": [1],
            "generators": [{"name": "reader", "model": "embedded:reader", "dtype": "float32"}],
            "nli": {"model": "embedded:world-nli"},
            "utility": {"candidates": 2, "methods": []},
        }
    )
    spec["datasets"][0]["max_queries"] = 3
    path = tmp_path_factory.mktemp("celery-config") / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


class Cluster:
    """One deployment's shared stores (fresh databases and an S3 prefix) and its workers."""

    def __init__(self, name: str, root: Path, postgres, s3_server, broker: Redis) -> None:
        self.root, self.broker, self.postgres, self.name = root, broker, postgres, name
        self.url = f"s3://{s3_server.bucket}/{uuid.uuid4().hex}/artifacts"
        base = {
            k: v
            for k, v in os.environ.items()
            if k not in (FAILPOINT, DAGSTER_HOME_VARIABLE, "RAGUTIL_HOME", "RAGUTIL_SCRATCH_DIR")
        }
        self.env = {
            **base,
            **s3_server.environment(),
            ARTIFACTS_URL_VARIABLE: self.url,
            DAGSTER_POSTGRES_URL_VARIABLE: postgres.create_database(f"{name}_dagster"),
            MLFLOW_TRACKING_URI_VARIABLE: postgres.create_database(f"{name}_mlflow"),
            GENERATION_CACHE_URL_VARIABLE: postgres.create_database(f"{name}_cache"),
            "RAGUTIL_CELERY_BROKER": broker.url,
            "PYTHONPATH": os.pathsep.join(
                [str(HOOKS), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }
        self.workers: dict[str, subprocess.Popen] = {}

    def home(self, name: str) -> Path:
        return self.root / name / "home"

    def start_workers(
        self, *names: str, wipe: bool = False, failpoint: str | None = None
    ) -> list[subprocess.Popen]:
        """Workers ``<name>@<host>``, each with an empty home and scratch directory of its own
        (``wipe``: deleted before every step; ``failpoint``: ``$RAGUTIL_FAILPOINT``), started
        together; returned once each log says it is ready."""
        logs = []
        for name in names:
            home, scratch = self.home(name), self.root / name / "tmp"
            home.mkdir(parents=True)
            scratch.mkdir()
            env = {**self.env, "RAGUTIL_HOME": str(home), "TMPDIR": str(scratch)}
            if failpoint:
                env[FAILPOINT] = failpoint
            logs.append(self.root / name / "worker.log")
            command = [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "ragutil_dagster.celery_executor",
                "worker",
                "--concurrency",
                "1",
                "--loglevel",
                "INFO",
                "-n",
                f"{name}@%h",
                "--without-gossip",
                "--without-mingle",
                *(["--include", "wipe_home"] if wipe else []),
            ]
            self.workers[name] = _start(command, logs[-1], env)
        deadline = time.monotonic() + 120
        for name, log in zip(names, logs):
            while not (log.exists() and " ready." in log.read_text()):
                assert self.workers[name].poll() is None and time.monotonic() < deadline, (
                    log.read_text()[-3000:]
                )
                time.sleep(0.2)
        return [self.workers[name] for name in names]

    def run(self, config: Path, *extra: str, wait: bool = True):
        """``ragutil run --executor celery`` from a launcher home of this deployment."""
        command = [
            sys.executable,
            "-m",
            "ragutil_dagster.cli",
            "run",
            str(config),
            "--quiet",
            "--executor",
            "celery",
            *extra,
        ]
        env = {**self.env, "RAGUTIL_HOME": str(self.root / "launcher")}
        if not wait:
            return subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)

    def query(self, store: str, sql: str) -> list[tuple]:
        return self.postgres.query(f"{self.name}_{store}", sql)

    def engine_messages(self) -> list[tuple[str, str]]:
        """(step, event JSON) of every engine event of the Dagster instance, in order."""
        return self.query(
            "dagster",
            "SELECT step_key, event FROM event_logs WHERE "
            "dagster_event_type = 'ENGINE_EVENT' ORDER BY id",
        )

    def stop(self) -> None:
        for process in self.workers.values():
            _kill(process)


def _scores(store: ArtifactStore) -> dict[str, object]:
    out: dict[str, object] = {}
    for asset, file in SCORE_TABLES:
        name = file.split(".")[0]
        out[f"{asset}/{file}"] = (
            store.read_table(asset, PARTITION, name)
            if file.endswith(".parquet")
            else store.read_json(asset, PARTITION, name)
        )
    return out


def _assert_identical(scores: dict[str, object], expected: dict[str, object]) -> None:
    for name, value in expected.items():
        if isinstance(value, pl.DataFrame):
            assert scores[name].equals(value), name
        else:
            assert scores[name] == value, name


def _mlflow_keys(uri: str) -> Counter:
    """MLflow runs per run key, every run FINISHED."""
    client = MlflowClient(uri)
    keys: Counter = Counter()
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id], max_results=1000):
            assert run.info.status == "FINISHED", (run.info.run_name, run.info.status)
            if run.data.tags.get(KIND_TAG) == "partition":
                keys[run.data.tags[RUN_KEY_TAG]] += 1
    return keys


def _materialised(instance) -> tuple[Counter, str]:
    """Materialisations per (asset, partition), and the corpus's data version (its fingerprint; the
    other assets' are Dagster's, new at every materialisation)."""
    from dagster._core.definitions.data_version import DATA_VERSION_TAG

    found: Counter = Counter()
    for key in instance.get_asset_keys():
        for record in instance.fetch_materializations(key, limit=1000).records:
            found[(key.to_user_string(), record.asset_materialization.partition)] += 1
    corpus = instance.fetch_materializations(dg.AssetKey("corpus"), limit=1).records[0]
    return found, corpus.asset_materialization.tags[DATA_VERSION_TAG]


@pytest.fixture(scope="module")
def in_process(config, tmp_path_factory):
    """The reference: ``ragutil run`` with its steps in this process, everything under one home."""
    from ragutil_dagster.cli import main

    home = tmp_path_factory.mktemp("in-process")
    with pytest.MonkeyPatch.context() as environment:
        for name in (
            FAILPOINT,
            DAGSTER_HOME_VARIABLE,
            MLFLOW_TRACKING_URI_VARIABLE,
            ARTIFACTS_URL_VARIABLE,
            DAGSTER_POSTGRES_URL_VARIABLE,
            GENERATION_CACHE_URL_VARIABLE,
        ):
            environment.delenv(name, raising=False)
        environment.setenv("RAGUTIL_HOME", str(home))
        assert main(["run", str(config), "--quiet"]) == 0
    return home


def _reference_lineage(home: Path, monkeypatch) -> tuple[Counter, str]:
    from ragutil_dagster.runner import dagster_instance

    monkeypatch.delenv(DAGSTER_POSTGRES_URL_VARIABLE, raising=False)
    monkeypatch.delenv(DAGSTER_HOME_VARIABLE, raising=False)
    with dagster_instance(home) as instance:
        return _materialised(instance)


def test_a_celery_run_through_faults_gives_the_in_process_scores_runs_and_lineage(
    config, in_process, redis_server, postgres, s3_server, tmp_path, monkeypatch
) -> None:
    """One run, three faults: w1 takes the steps alone until its first sampling batch, where it
    dies with its pool (the failpoint kills its process group, as when its machine is lost); w2,
    started then, gets the lost step again; both have their home and scratch directory wiped before
    every step; while a later step runs the broker restarts, losing its queue; the same command
    run again completes. Scores, MLflow runs and lineage are those of the in-process run."""
    from ragutil_dagster.runner import dagster_instance

    cluster = Cluster("celery", tmp_path, postgres, s3_server, redis_server)
    resend = "Sent to the Celery workers again"
    try:
        [doomed] = cluster.start_workers("w1", wipe=True, failpoint="sampling:1:group")
        launcher = cluster.run(config, wait=False)
        assert doomed.wait(timeout=300) == -signal.SIGKILL, launcher.poll()
        [survivor] = cluster.start_workers("w2", wipe=True)
        deadline = time.monotonic() + 300
        while not any(resend in event for _, event in cluster.engine_messages()):
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
            time.sleep(0.5)
        lost_step = next(step for step, event in cluster.engine_messages() if resend in event)
        # The broker restarts while a step is under way on w2, stopped meanwhile so that the step
        # cannot finish before the launcher looks.
        seen = len(cluster.engine_messages())
        while not any("in celery worker" in event for _, event in cluster.engine_messages()[seen:]):
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
            time.sleep(0.1)
        os.killpg(survivor.pid, signal.SIGSTOP)
        redis_server.restart()
        out, err = launcher.communicate(timeout=120)
        os.killpg(survivor.pid, signal.SIGCONT)
        resumed = cluster.run(config)
    finally:
        cluster.stop()
    assert launcher.returncode == 2, err[-3000:]
    assert out.count("published for every worker") == 1  # the launcher's embedded build, once
    [error] = [line for line in err.splitlines() if line.startswith("ragutil run: error: ")]
    assert "Traceback" not in err and f"Celery broker at {redis_server.url} " in error, err
    assert "once the broker is up, run the same command again to resume (Dagster run " in error, (
        error
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "published" not in resumed.stdout

    # The lost step ran on w1, then again on w2; every step ran on a worker.
    events = cluster.engine_messages()
    executed = [(step, event) for step, event in events if "in celery worker" in event]
    assert all("w1@" in event or "w2@" in event for _, event in executed)
    ran = [event for step, event in executed if step == lost_step]
    assert len(ran) >= 2 and "w1@" in ran[0] and "w2@" in ran[1], ran
    # Only the run the broker's restart stopped failed, and it left no pool slot taken.
    assert cluster.query("dagster", "SELECT count(*) FROM runs WHERE status = 'FAILURE'") == [(1,)]
    assert cluster.query(
        "dagster", "SELECT count(*) FROM concurrency_slots WHERE run_id IS NOT NULL"
    ) == [(0,)]
    # The workers installed, trained and converted nothing, and kept their step logs at home.
    for worker in ("w1", "w2"):
        assert (
            not (cluster.home(worker) / "embedded").exists()
            and not (cluster.home(worker) / "models").exists()
        )
    assert list((cluster.home("w2") / "dagster" / "storage").rglob("*.complete"))
    assert not list((tmp_path / "launcher" / "dagster").rglob("*.complete"))  # no step ran there

    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    store = ArtifactStore(home=str(tmp_path / "launcher"), url=cluster.url)
    assert store._objects.exists(EMBEDDED_BUILD)
    _assert_identical(_scores(store), _scores(ArtifactStore(home=str(in_process))))
    keys = _mlflow_keys(cluster.env[MLFLOW_TRACKING_URI_VARIABLE])
    assert set(keys.values()) == {1} and keys == _mlflow_keys(embedded_tracking_uri(in_process))

    expected_partitions, expected_corpus = _reference_lineage(in_process, monkeypatch)
    monkeypatch.setenv(DAGSTER_POSTGRES_URL_VARIABLE, cluster.env[DAGSTER_POSTGRES_URL_VARIABLE])
    with dagster_instance(tmp_path / "launcher") as instance:
        partitions, corpus = _materialised(instance)
    # The partition the restart interrupted materialised its finished steps twice.
    assert set(partitions) == set(expected_partitions) and corpus == expected_corpus


def test_no_shared_stores_or_no_broker_is_one_line(
    config, redis_server, postgres, s3_server, tmp_path
) -> None:
    cluster = Cluster("setup", tmp_path, postgres, s3_server, redis_server)
    cluster.env.pop(ARTIFACTS_URL_VARIABLE)
    done = cluster.run(config)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "ragutil run: error: the Celery executor's workers share no disk with this machine: set "
        f"{ARTIFACTS_URL_VARIABLE} (the Dagster instance on PostgreSQL, MLflow on a database or server, the "
        "artifacts on an object store; docs/scale.md), for the workers too"
    ), done.stderr

    cluster = Cluster("nobroker", tmp_path / "nobroker", postgres, s3_server, redis_server)
    cluster.env["RAGUTIL_CELERY_BROKER"] = f"redis://127.0.0.1:{free_port()}/0"
    done = cluster.run(config)
    assert done.returncode == 2
    error = done.stderr.strip()
    assert (
        error.startswith("ragutil run: error: cannot reach the Celery broker at redis://127.0.0.1:")
        and error.endswith("; start it or change RAGUTIL_CELERY_BROKER")
        and "\n" not in error
    ), error


def test_ragutil_executor_celery_gives_the_definitions_the_celery_executor(
    tiny_experiment, tmp_path
) -> None:
    from ragutil_dagster.celery_executor import celery_executor
    from ragutil_dagster.definitions import build_definitions

    assert (
        build_definitions(tiny_experiment, str(tmp_path), executor_name="celery").executor
        is celery_executor
    )


class _FailingResult:
    """A Celery result that raises ``failure`` from ``ready()``, or once ready from ``get()``."""

    def __init__(self, failure: Exception, at: str) -> None:
        self.failure, self.at, self.result = failure, at, None

    def ready(self) -> bool:
        if self.at == "ready":
            raise self.failure
        return True

    def get(self):
        raise self.failure


def _watched(failure: Exception, at: str = "ready"):
    """A WatchedStep polling a result that raises ``failure`` at ``at``; its broker still answers."""
    from types import SimpleNamespace

    from ragutil_dagster.celery_executor import WatchedStep

    broker = SimpleNamespace(check=lambda run_id: None)
    plan_context = SimpleNamespace(dagster_run=SimpleNamespace(run_id="run-1"))
    return WatchedStep(
        lambda: _FailingResult(failure, at), None, broker, plan_context, "generations"
    )


@pytest.mark.parametrize("at", ["ready", "get"])
@pytest.mark.parametrize(
    "failure",
    [
        redis.exceptions.ConnectionError(
            "Error 111 connecting to 127.0.0.1:6379. Connection refused."
        ),
        redis.exceptions.ConnectionError("Connection closed by server."),
        redis.exceptions.TimeoutError("Timeout reading from socket"),
    ],
    ids=["refused", "closed", "timeout"],
)
def test_an_unreachable_result_backend_is_reported_as_lost_with_its_cause(
    failure: Exception, at: str
) -> None:
    """Lost while polling the task, or between its result being ready and fetched (seen in CI: the
    step was reported failed with the bare ``ConnectionError``)."""
    from ragutil_dagster.errors import BrokerUnavailableError

    with pytest.raises(
        BrokerUnavailableError,
        match=r"lost the Celery result backend at .* during Dagster run run-1 "
        rf"\({type(failure).__name__}: ",
    ) as err:
        _watched(failure, at).ready()
    assert err.value.__cause__ is failure


def test_a_failed_task_is_ready_and_raises_its_failure_when_fetched() -> None:
    """dagster-celery's loop turns what ``get`` raises into the step's failure."""
    failure = RuntimeError("the step's task failed")
    step = _watched(failure, at="get")
    assert step.ready()
    with pytest.raises(RuntimeError) as err:
        step.get()
    assert err.value is failure


@pytest.mark.parametrize(
    "failure",
    [
        RuntimeError("a bug in the loop"),
        KeyError("status"),
        PermissionError(13, "Permission denied", "/home/dagster/storage"),
    ],
    ids=["bug", "key-error", "storage-permission"],
)
def test_another_failure_while_polling_a_step_is_reported_as_itself(failure: Exception) -> None:
    with pytest.raises(type(failure)) as err:
        _watched(failure).ready()
    assert err.value is failure
