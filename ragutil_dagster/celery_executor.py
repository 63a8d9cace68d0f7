"""Dagster's Celery executor (dagster-celery) for ragutil: every step of a run is a Celery task,
executed by ``celery worker`` processes that share nothing with the launching machine but the
Dagster instance and MLflow on PostgreSQL (or another database), the artifact store and, for
real-LLM steps, the vLLM servers. Chosen by ``ragutil run --executor celery`` or, for runs the
Dagster UI, sensors or a run launcher start, ``RAGUTIL_EXECUTOR=celery``.

A worker, on any machine, with the launcher's store and broker variables and a home of its own::

    celery -A ragutil_dagster.celery_executor worker --concurrency 1 --loglevel INFO

The broker and the result backend are Redis: ``$RAGUTIL_CELERY_BROKER`` (default
:data:`DEFAULT_BROKER`) and ``$RAGUTIL_CELERY_BACKEND`` (default: the broker's URL).

Two faults Celery does not recover from by itself, the launcher's loop does (:class:`WatchedStep`):

- a worker dying mid-step. A task is acknowledged when it starts, so a worker killed with its
  machine takes only that step with it (``worker_disable_prefetch``: it holds no queued one), and
  its state stays ``STARTED`` for ever; a pool process killed alone leaves ``WorkerLostError``.
  The launcher pings the worker that started each unfinished step; one silent for
  :data:`LOST_AFTER_SECONDS` is lost, and the step is sent again, to whichever worker is free, at
  most :data:`MAX_ATTEMPTS` times in all. (Late acknowledgement would instead leave the message
  to Redis's visibility timeout — an hour by default, and any step running longer than it would
  run twice.)
- the broker restarting. Redis without persistence loses the queued steps and their results; the
  launcher notices the server's new ``run_id`` and fails the run with one message; ``ragutil run``
  again skips what finished and runs the rest.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator

import dagster as dg
from celery import signals
from celery.exceptions import DuplicateTaskNameWarning
from dagster._core.events import EngineEventData
from dagster._core.execution.retries import RetryMode, get_retries_config
from dagster_celery.core_execution_loop import core_celery_execution_loop
from dagster_celery.executor import CeleryExecutor, _submit_task
from dagster_celery.make_app import make_app
from dagster_celery.tasks import create_task

from ragutil_dagster.errors import BrokerUnavailableError, DistributedSetupError
from ragutil_dagster.infra.databases import (
    DAGSTER_HOME_VARIABLE,
    DAGSTER_POSTGRES_URL_VARIABLE,
    MLFLOW_TRACKING_URI_VARIABLE,
    dagster_postgres_url,
)
from ragutil_dagster.infra.files import ragutil_home
from ragutil_dagster.infra.objectstore import ARTIFACTS_URL_VARIABLE
from ragutil_dagster.infra.redaction import redact_uri
from ragutil_dagster.instance.compute_logs import WORKER_LOGS_VARIABLE

BROKER_VARIABLE = "RAGUTIL_CELERY_BROKER"
BACKEND_VARIABLE = "RAGUTIL_CELERY_BACKEND"
DEFAULT_BROKER = "redis://127.0.0.1:6379/0"
SHARED_STORE_VARIABLES = (
    DAGSTER_POSTGRES_URL_VARIABLE,
    MLFLOW_TRACKING_URI_VARIABLE,
    ARTIFACTS_URL_VARIABLE,
)
"""What workers and launcher must name alike: the stores on no one machine's disk."""

WATCH_SECONDS = 2.0
"""How often the launcher checks the broker and the worker of each unfinished step."""
LOST_AFTER_SECONDS = 10.0
"""A worker that answered no ping for this long has died: its step is sent again."""
PING_SECONDS = 1.0
MAX_ATTEMPTS = 3

SETTINGS = {
    # The task's STARTED state names the worker running it: the launcher pings that worker.
    "task_track_started": True,
    # Acknowledged at start, and no step reserved beyond the one running: a dead worker strands
    # nothing in the broker (see the module's notes).
    "task_acks_late": False,
    "worker_disable_prefetch": True,
    "worker_prefetch_multiplier": 1,
    "result_expires": 7 * 24 * 3600,
}


def broker_url() -> str:
    return os.environ.get(BROKER_VARIABLE) or DEFAULT_BROKER


def backend_url() -> str:
    return os.environ.get(BACKEND_VARIABLE) or broker_url()


def check_shared_stores() -> None:
    """Raise :class:`DistributedSetupError` naming every store still on this machine's disk: the
    workers could not reach it."""
    missing = [
        name
        for name in SHARED_STORE_VARIABLES
        if not os.environ.get(name)
        and not (name == DAGSTER_POSTGRES_URL_VARIABLE and os.environ.get(DAGSTER_HOME_VARIABLE))
    ]
    if missing:
        raise DistributedSetupError(
            f"the Celery executor's workers share no disk with this machine: set {', '.join(missing)} "
            "(the Dagster instance on PostgreSQL, MLflow on a database or server, the artifacts on an "
            "object store; docs/scale.md), for the workers too"
        )


def check_setup() -> None:
    """Before a run: the shared stores named and the broker reachable, else one clear error."""
    check_shared_stores()
    Broker(broker_url())


class Broker:
    """The Redis server behind the broker: reachable, and the same server (its ``run_id``) as when
    the run started."""

    def __init__(self, url: str) -> None:
        import redis

        if not url.startswith(("redis://", "rediss://")):
            raise DistributedSetupError(
                f"{BROKER_VARIABLE}={redact_uri(url)}: the Celery executor needs a Redis broker "
                "(redis://host:port/db), whose restarts ragutil can notice"
            )
        self.url = url
        self.client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)
        self.server = self.server_id()

    def server_id(self) -> str:
        import redis

        try:
            return self._server_id()
        except redis.RedisError as err:
            raise BrokerUnavailableError(
                f"cannot reach the Celery broker at {redact_uri(self.url)} ({err}); start it or change "
                f"{BROKER_VARIABLE}"
            ) from None

    def _server_id(self) -> str:
        return str(self.client.info("server")["run_id"])

    def check(self, run_id: str) -> None:
        """Raise :class:`BrokerUnavailableError` when the broker is down or another server answers:
        the steps queued there are lost."""
        import redis

        try:
            if self._server_id() == self.server:
                return
            what = (
                f"the Celery broker at {redact_uri(self.url)} restarted during Dagster run {run_id}"
            )
        except redis.RedisError as err:
            what = f"lost the Celery broker at {redact_uri(self.url)} during Dagster run {run_id} ({err})"
        raise BrokerUnavailableError(
            f"{what}: the steps queued there are lost; the partitions that finished are kept — once the "
            "broker is up, run the same command again to resume"
        )


def _backend_errors() -> tuple[type[Exception], ...]:
    """What redis-py raises when the result backend cannot be reached or does not answer in time
    (it wraps the socket's OSError)."""
    import redis

    return redis.exceptions.ConnectionError, redis.exceptions.TimeoutError


class WatchedStep:
    """A step's Celery task as dagster-celery's loop polls it (``ready``, ``get``, ``revoke``), sent
    again when the worker running it died; every check raises when the broker went away."""

    def __init__(
        self, submit: Callable[[], object], app, broker: Broker, plan_context, step_key: str
    ) -> None:
        self.submit, self.app, self.broker = submit, app, broker
        self.context, self.step_key = plan_context, step_key
        self.result, self.attempts = submit(), 1
        self.next_check, self.silent_since = time.monotonic() + WATCH_SECONDS, None
        self.failure: Exception | None = None
        self.events: list | None = None

    def ready(self) -> bool:
        if self.failure is not None or self.events is not None:
            return True
        with self._backend_watched():
            if self.result.ready():
                if type(self.result.result).__name__ != "WorkerLostError":
                    # Fetched here, where a lost backend ends the run with its cause: dagster-celery
                    # turns what ``get`` raises into a failure of the step.
                    try:
                        self.events = self.result.get()
                    except _backend_errors():
                        raise
                    except Exception as err:  # the task's own failure, re-raised by ``get``
                        self.failure = err
                    return True
                self._resend(f"its worker's pool process died ({self.result.result})")
                return False
        now = time.monotonic()
        if now < self.next_check:
            return False
        self.next_check = now + WATCH_SECONDS
        self.broker.check(self.context.dagster_run.run_id)
        info = self.result.info if self.result.state == "STARTED" else None
        worker = info.get("hostname") if isinstance(info, dict) else None
        if worker is None:  # queued, or not yet reported started
            self.silent_since = None
            return False
        if self.app.control.ping(destination=[worker], timeout=PING_SECONDS):
            self.silent_since = None
        elif self.silent_since is None:
            self.silent_since = now
        elif now - self.silent_since >= LOST_AFTER_SECONDS:
            self._resend(
                f"its worker {worker} answered no ping for {now - self.silent_since:.0f} s"
            )
        return False

    def _resend(self, why: str) -> None:
        if self.attempts >= MAX_ATTEMPTS:
            self.failure = DistributedSetupError(
                f"step {self.step_key} was lost with its Celery worker {self.attempts} times ({why}); "
                "giving up — see the workers' logs (out of memory?)"
            )
            return
        self.attempts += 1
        self.context.instance.report_engine_event(
            f"Step {self.step_key} lost: {why}. Sent to the Celery workers again (attempt "
            f"{self.attempts} of {MAX_ATTEMPTS}).",
            self.context.dagster_run,
            EngineEventData({"step_key": self.step_key, "attempt": str(self.attempts)}),
            step_key=self.step_key,
        )
        self.result, self.silent_since = self.submit(), None

    def get(self):
        if self.failure is not None:
            raise self.failure
        return self.events

    @contextlib.contextmanager
    def _backend_watched(self) -> Iterator[None]:
        """A lost result backend becomes :class:`BrokerUnavailableError`; any other failure is
        reported as itself."""
        try:
            yield
        except _backend_errors() as err:
            run_id = self.context.dagster_run.run_id
            self.broker.check(run_id)  # the broker's fate, if it is the cause
            raise BrokerUnavailableError(
                f"lost the Celery result backend at {redact_uri(backend_url())} during Dagster run "
                f"{run_id} ({type(err).__name__}: {err}); once it is up, run the same command "
                "again to resume"
            ) from err

    def revoke(self) -> None:
        self.result.revoke()


class WatchedCeleryExecutor(CeleryExecutor):
    """dagster-celery's executor, its broker and backend from the environment, its steps watched
    (:class:`WatchedStep`)."""

    def execute(self, plan_context, execution_plan):
        broker = Broker(self.broker)
        # dagster-celery registers its task on the app again for every step it submits: the same
        # callable each time, which Celery warns about on the terminal.
        warnings.filterwarnings("ignore", category=DuplicateTaskNameWarning)

        def submit(app, context, step, queue, priority, known_state) -> WatchedStep:
            send = lambda: _submit_task(app, context, step, queue, priority, known_state)  # noqa: E731
            return WatchedStep(send, app, broker, context, step.key)

        try:
            yield from core_celery_execution_loop(
                plan_context, execution_plan, step_execution_fn=submit
            )
        except BaseException:
            # A step still running on a worker, or lost with one, never reports its end to this run:
            # the pool slot it holds would stay taken, and every later model step wait for it.
            plan_context.instance.event_log_storage.free_concurrency_slots_for_run(
                plan_context.dagster_run.run_id
            )
            raise


@dg.executor(
    name="celery",
    config_schema={"retries": get_retries_config()},
    requirements=dg.multiple_process_executor_requirements(),
)
def celery_executor(init_context) -> WatchedCeleryExecutor:
    """Every step a task for the Celery workers of ``$RAGUTIL_CELERY_BROKER``."""
    return _executor(RetryMode.from_config(init_context.executor_config["retries"]))


def _executor(retries: RetryMode) -> WatchedCeleryExecutor:
    return WatchedCeleryExecutor(
        retries=retries, broker=broker_url(), backend=backend_url(), config_source=SETTINGS
    )


# What `celery -A ragutil_dagster.celery_executor worker` runs: dagster-celery's task, on the
# broker of $RAGUTIL_CELERY_BROKER.
app = make_app(_executor(RetryMode.DISABLED).app_args())
execute_plan = create_task(app)


@signals.worker_init.connect
def _prepare_worker(**_) -> None:
    """Before the pool starts: the shared stores named, the Dagster database's URL in the form
    dagster-postgres needs (as the launcher hands it), step logs under this worker's own home, the
    steps' code imported."""
    try:
        check_setup()
    except (DistributedSetupError, BrokerUnavailableError) as err:
        print(f"ragutil celery worker: error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    if url := os.environ.get(DAGSTER_POSTGRES_URL_VARIABLE):
        os.environ[DAGSTER_POSTGRES_URL_VARIABLE] = dagster_postgres_url(url)
    os.environ[WORKER_LOGS_VARIABLE] = str(ragutil_home() / "dagster" / "storage")
    # The steps' code imported once here, before the pool forks, rather than by each pool process at
    # its first step (≈ 15 s of imports on a 2-core machine).
    import ragutil_dagster.assets  # noqa: F401
