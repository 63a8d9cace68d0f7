"""Materialise a whole experiment — the engine of ``ragutil run``.

Each asset partition whose inputs changed since it last ran (``skip_unchanged.py``) runs as its own
Dagster run, in dependency order, recorded in the Dagster
instance (``$DAGSTER_HOME``, else ``$RAGUTIL_HOME/dagster``, on PostgreSQL when
``$RAGUTIL_DAGSTER_POSTGRES_URL`` is set), so ``dagster dev`` on the same
instance shows every materialisation with its metadata. With one worker the runs execute in this
process, one after the other; with several, the partitions of a step run side by side on Dagster's
multiprocess executor (every step in a process of its own), the instance's ``gpu`` pool admitting
one model step at a time. On the Celery executor every step is a task for the Celery workers
(``celery_executor.py``).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import socket
import time
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import polars as pl
from tqdm.auto import tqdm

from ragutil_dagster.assets.partitions import Partitions
from ragutil_dagster.assets.reports import summary_table
from ragutil_dagster.config import ExperimentConfig, parse_config
from ragutil_dagster.errors import (
    RunInterruptedError,
    SerializedError,
    StepFailedError,
    is_interruption,
)
from ragutil_dagster.infra.databases import (
    DAGSTER_HOME_VARIABLE,
    DAGSTER_POSTGRES_URL_VARIABLE,
    check_reachable,
    dagster_postgres_url,
)
from ragutil_dagster.infra.executor_names import CELERY_EXECUTOR
from ragutil_dagster.infra.files import ragutil_home, write_text_atomic
from ragutil_dagster.infra.processes import process_alive
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.skip_unchanged import Freshness
from ragutil_dagster.tracking.report import report_artifact

INSTANCE_SETTINGS = """\
# Written by ragutil. Assets that run a model share the "gpu" pool: one step at a time per card.
concurrency:
  pools:
    default_limit: 1
# Evaluation machines are often offline, and the first-run notice would break the CLI's
# one-line errors; set `enabled: true` to send Dagster its usage statistics.
telemetry:
  enabled: false
"""


POSTGRES_STORAGE = f"""\
# ${DAGSTER_POSTGRES_URL_VARIABLE} is set: runs, the event log and schedules live in PostgreSQL.
storage:
  postgres:
    postgres_url:
      env: {DAGSTER_POSTGRES_URL_VARIABLE}
"""


def sqlite_storage(directory: Path) -> str:
    """The SQLite event log whose pool-slot claims hold a file lock (``instance/event_log.py``:
    SQLite alone lets two processes claim the one ``gpu`` slot), where Dagster keeps it by default."""
    base_dir = json.dumps(str(directory / "history" / "runs"))
    return f"""\
# SQLite storage, as Dagster's default, with pool-slot claims serialised across processes.
event_log_storage:
  module: ragutil_dagster.instance.event_log
  class: SerializedSqliteEventLogStorage
  config:
    base_dir: {base_dir}
"""


def compute_logs(directory: Path) -> str:
    """Each step's stdout and stderr under ``directory/storage`` as Dagster's default keeps them, but
    on a Celery worker under the worker's own home (``instance/compute_logs.py``)."""
    base_dir = json.dumps(str(directory / "storage"))
    return f"""\
# Step logs where the step ran: here, or under a Celery worker's own home.
compute_logs:
  module: ragutil_dagster.instance.compute_logs
  class: WorkerComputeLogManager
  config:
    base_dir: {base_dir}
"""


def instance_settings(directory: Path) -> str:
    """The ``dagster.yaml`` ragutil writes into ``directory``: pools, telemetry and compute logs,
    and dagster-postgres storage when ``$RAGUTIL_DAGSTER_POSTGRES_URL`` is set (read by whoever
    opens the instance, never stored), else SQLite with serialised pool-slot claims."""
    if os.environ.get(DAGSTER_POSTGRES_URL_VARIABLE):
        return INSTANCE_SETTINGS + compute_logs(directory) + POSTGRES_STORAGE
    return INSTANCE_SETTINGS + compute_logs(directory) + sqlite_storage(directory)


def dagster_instance(home: Path | None = None) -> dg.DagsterInstance:
    """The persistent Dagster instance: ``$DAGSTER_HOME`` when set, else ``<RAGUTIL_HOME>/dagster``,
    whose ``dagster.yaml`` ragutil (re)writes to follow the environment (:func:`instance_settings`)."""
    if os.environ.get(DAGSTER_HOME_VARIABLE):
        return dg.DagsterInstance.get()
    if url := os.environ.get(DAGSTER_POSTGRES_URL_VARIABLE):
        check_reachable(url, "the Dagster instance's PostgreSQL", DAGSTER_POSTGRES_URL_VARIABLE)
        # dagster.yaml names the variable, not its value (no password on disk); Dagster reads it
        # here and in every process started from here (ragutil ui's dagster dev), with the driver
        # it needs.
        os.environ[DAGSTER_POSTGRES_URL_VARIABLE] = dagster_postgres_url(url)
    directory = (home or ragutil_home()) / "dagster"
    directory.mkdir(parents=True, exist_ok=True)
    settings = directory / "dagster.yaml"
    if not settings.exists() or settings.read_text() != instance_settings(directory):
        write_text_atomic(settings, instance_settings(directory))
    return dg.DagsterInstance.from_config(str(directory))


def plan(
    assets: Sequence[dg.AssetsDefinition | dg.SourceAsset],
) -> list[tuple[list[str], list[str | None]]]:
    """The steps of a full evaluation, read off the asset graph: (assets, partition keys).

    Assets in topological order; consecutive assets with the same partitioning are one step per
    partition key (one Dagster run materialises, e.g., a setting's generations, NLI clusters and
    scores together) unless one reads another partition of an asset of the step (e.g. every
    generator's ``candidate_scores``): it starts a step of its own, which runs once the step
    before has finished every partition. Among assets that are ready at the same time, one sharing
    the previous step's partitioning goes first, so such chains stay together."""
    by_key = {  # declaration order; source assets (model identities) are observed, not run
        spec.key: asset
        for asset in assets
        if isinstance(asset, dg.AssetsDefinition)
        for spec in asset.specs
    }
    deps = {
        key: {dep.asset_key for spec in asset.specs if spec.key == key for dep in spec.deps}
        & set(by_key)
        for key, asset in by_key.items()
    }
    across_partitions = {  # the parents a key reads through a mapping other than partition to itself
        key: {
            dep.asset_key
            for spec in asset.specs
            if spec.key == key
            for dep in spec.deps
            if dep.partition_mapping is not None
            and not isinstance(dep.partition_mapping, dg.IdentityPartitionMapping)
        }
        for key, asset in by_key.items()
    }
    ordered: list[dg.AssetKey] = []
    remaining = dict(deps)
    while remaining:
        ready = [key for key, needs in remaining.items() if needs <= set(ordered)]
        if not ready:
            raise ValueError(
                f"the asset graph has a cycle among {sorted(k.to_user_string() for k in remaining)}"
            )
        last = by_key[ordered[-1]].partitions_def if ordered else None
        ready.sort(key=lambda k: (by_key[k].partitions_def != last, list(by_key).index(k)))
        ordered.append(ready[0])
        del remaining[ready[0]]
    steps: list[tuple[list[str], list[str | None]]] = []
    for key in ordered:
        partitions = by_key[key].partitions_def
        if (
            steps
            and by_key[dg.AssetKey(steps[-1][0][-1])].partitions_def == partitions
            and not across_partitions[key] & {dg.AssetKey(name) for name in steps[-1][0]}
        ):
            steps[-1][0].append(key.to_user_string())
            continue
        keys = [str(k) for k in partitions.get_partition_keys()] if partitions else [None]
        steps.append(([key.to_user_string()], keys))
    return steps


PID_TAG, HOST_TAG = "ragutil/pid", "ragutil/host"


def release_abandoned_runs(instance: dg.DagsterInstance) -> list[str]:
    """Mark failed the runs a dead ``ragutil run`` process on this host left in progress, and free
    their pool slots; return their ids.

    A process killed outright (SIGKILL, the OOM killer) cannot end its Dagster run: the run stays
    STARTED and keeps its slot of the "gpu" pool, and every later run would wait for that slot
    forever. Runs of live processes (another ``ragutil run`` here) are left alone.
    """
    in_progress = [
        dg.DagsterRunStatus.STARTED,
        dg.DagsterRunStatus.STARTING,
        dg.DagsterRunStatus.NOT_STARTED,
    ]
    released = []
    for run in instance.get_runs(
        filters=dg.RunsFilter(statuses=in_progress, tags={HOST_TAG: socket.gethostname()})
    ):
        pid = int(run.tags.get(PID_TAG, "0"))
        if pid == os.getpid() or (pid and process_alive(pid)):
            continue
        instance.report_run_failed(
            run, f"the ragutil process (pid {pid}) running it died; released by a later ragutil run"
        )
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        released.append(run.run_id)
    return released


STEP_JOB = "ragutil_step"


def _not_an_interruption(record: logging.LogRecord) -> bool:
    """False for Dagster's step and run failures caused by SIGTERM / Ctrl-C: their tracebacks say
    nothing the runner's one line does not (:class:`RunInterruptedError`)."""
    event = (getattr(record, "dagster_meta", None) or {}).get("dagster_event")
    return not is_interruption(getattr(getattr(event, "event_specific_data", None), "error", None))


@dg.logger(
    {
        "log_level": dg.Field(str, is_required=False, default_value="WARNING"),
        "name": dg.Field(str, is_required=False, default_value="dagster"),
    },
    description="Dagster's colored console logger, without the failures an interrupt causes.",
)
def console_logger(init_context: dg.InitLoggerContext) -> logging.Logger:
    log = dg.colored_console_logger.logger_fn(init_context)
    log.addFilter(_not_an_interruption)
    return log


CONSOLE_LOGGERS = {"console": console_logger}


def step_job(
    experiment_json: str,
    home: str | None,
    show_progress: bool,
    executor_name: str | None,
    assets: list[str],
) -> dg.JobDefinition:
    """The job materialising ``assets`` (one step of :func:`plan`) on Dagster's multiprocess
    executor, or the executor named (``infra/executor_names.py``). Module-level and built from JSON
    arguments, so the executor's child processes — or Celery workers — rebuild it
    (``build_reconstructable_job``)."""
    from ragutil_dagster.definitions import build_definitions, executor

    # Dagster's notices that ragutil uses beta APIs were shown once when ragutil built its
    # Definitions; every step's process rebuilding them must not print them again.
    for notice in (dg.BetaWarning, dg.PreviewWarning):
        warnings.filterwarnings("ignore", category=notice)
    defs = build_definitions(
        parse_config(json.loads(experiment_json)), home, show_progress=show_progress
    )
    job = dg.define_asset_job(
        STEP_JOB, selection=assets, executor_def=executor(executor_name) or dg.multiprocess_executor
    )
    return dg.Definitions.merge(
        defs, dg.Definitions(jobs=[job], loggers=CONSOLE_LOGGERS)
    ).resolve_job_def(STEP_JOB)


@dataclass(frozen=True)
class RunOutcome:
    summary: pl.DataFrame
    seconds: float
    runs: int
    """Partitions materialised."""
    skipped: int
    """Partitions left as they were: their inputs had not changed."""
    reports: str
    """Where the experiment's summary (summary.csv, summary.md, the ΔSePer heatmap) was published, in
    its own report folder (``tracking.report.report_artifact``)."""


def materialize_all(
    defs: dg.Definitions,
    experiment: ExperimentConfig,
    parts: Partitions,
    instance: dg.DagsterInstance,
    progress: bool = True,
    console_log_level: str = "WARNING",
    workers: int = 1,
    force: bool = False,
    executor: str | None = None,
) -> RunOutcome:
    """Run every step of :func:`plan` whose inputs changed since it last ran (``skip_unchanged.py``;
    ``force``: every step), printing each partition run or skipped and why; stop at the first
    failure with :class:`StepFailedError`.

    ``console_log_level``: Dagster events at or above it are echoed to the terminal (all of them
    are stored in the instance's event log either way). ``workers`` > 1 runs that many partitions
    of a step at once, each a Dagster run on the multiprocess executor; the instance must then be
    persistent (the executor's processes open it), and a step's partitions all finish before the
    next step starts. ``executor`` ``celery``: every run's steps go to the Celery workers
    (``celery_executor.py``), ``workers`` runs at a time."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if executor == CELERY_EXECUTOR:
        from ragutil_dagster.celery_executor import check_setup

        check_setup()  # one clear error now rather than one per partition
    for run_id in release_abandoned_runs(instance):
        tqdm.write(f"released Dagster run {run_id}, left in progress by a killed ragutil process")
    assets = list(defs.assets or [])
    resources = dict(defs.resources or {})
    tags = {
        "ragutil/experiment": experiment.name,
        PID_TAG: str(os.getpid()),
        HOST_TAG: socket.gethostname(),
    }
    # The instance keeps every event; the terminal shows only what needs attention.
    loggers = {"console": {"config": {"log_level": console_log_level}}}
    steps = plan(assets)
    start = time.perf_counter()
    freshness = Freshness(defs, experiment, instance, resources["models"], force)
    bar = tqdm(
        total=sum(len(keys) for _, keys in steps),
        desc="ragutil run",
        unit="step",
        disable=not progress,
    )

    def in_process(
        names: list[str], key: str | None, versions: dict[str, str]
    ) -> tuple[bool, str, SerializedError | None]:
        # dg.materialize, with ragutil's console logger
        defs = dg.Definitions(
            assets=assets,
            jobs=[dg.define_asset_job(STEP_JOB, selection=names)],
            resources=resources,
            loggers=CONSOLE_LOGGERS,
        )
        return _outcome(
            defs.resolve_job_def(STEP_JOB).execute_in_process(
                run_config={"loggers": loggers},
                instance=instance,
                partition_key=key,
                raise_on_error=False,
                tags={**tags, **versions},
            )
        )

    parallel = (
        ParallelRuns(resources, experiment, instance, tags, loggers, workers, executor)
        if workers > 1 or executor
        else None
    )
    ran = skipped = 0
    current = "the run's start"
    try:
        for names, keys in steps:
            bar.set_postfix_str("+".join(names))
            decisions = {key: freshness.decide(names, key) for key in keys}
            for key, decision in decisions.items():
                tqdm.write(step_line(names, key, decision.reason))
            due = [key for key in keys if decisions[key].reason is not None]
            bar.update(len(keys) - len(due))
            skipped += len(keys) - len(due)
            outcomes = (
                parallel.map(names, due, [decisions[key].tags for key in due])
                if parallel
                else (in_process(names, key, decisions[key].tags) for key in due)
            )
            current = step_label(names, due[0] if due else None)
            for key, (success, run_id, error) in zip(due, outcomes):
                bar.update()
                if not success and is_interruption(error):
                    raise RunInterruptedError(step_label(names, key))
                if not success:
                    raise StepFailedError(step_label(names, key), run_id, error)
                freshness.ran(names, key)
                ran += 1
                current = step_label(names, key)
    except KeyboardInterrupt:
        # Between Dagster runs, a SIGINT — or SIGTERM, which Dagster maps to it — lands here.
        raise RunInterruptedError(current) from None
    finally:
        bar.close()
        if parallel:  # after a failure, partitions not yet started are not started
            parallel.close()
    store = _resolved_store(resources)
    return RunOutcome(
        summary_table(store, parts),
        time.perf_counter() - start,
        ran,
        skipped,
        store.location(*report_artifact(experiment)),
    )


def step_label(names: list[str], key: str | None) -> str:
    """A step's partition as the runner's messages name it: ``index[world__bm25]``."""
    return f"{'+'.join(names)}[{key}]" if key else "+".join(names)


def step_line(names: list[str], key: str | None, reason: str | None) -> str:
    """What the runner says of a step's partition: ``run  …: config changed`` or
    ``skip …: unchanged`` (a step of many assets is named by its first and their count)."""
    label = step_label([names[0], f"{len(names) - 1} more"] if len(names) > 2 else names, key)
    return f"run   {label}: {reason}" if reason else f"skip  {label}: unchanged"


def _outcome(result: dg.ExecutionResult) -> tuple[bool, str, SerializedError | None]:
    """What the runner needs of a run's result: success, run id, the first step failure's error,
    else the run's own (an executor that failed, e.g. its broker gone)."""
    failure = next((e for e in result.all_events if e.is_step_failure), None)
    if failure is not None:
        return result.success, result.run_id, failure.step_failure_data.error
    run_failure = next(
        (e for e in result.all_events if e.event_type == dg.DagsterEventType.RUN_FAILURE), None
    )
    error = run_failure.event_specific_data.error if run_failure is not None else None
    return result.success, result.run_id, error


class ParallelRuns:
    """Runs the partitions of a step ``workers`` at a time, each in a process of its own (Dagster
    runs are not thread-safe: two in one process can deadlock in ``logging``). Those ``workers``
    processes fork from a forkserver that imported ragutil once (a fresh interpreter spends ≈ 6 s
    on imports) and serve every step; each executes its runs on the multiprocess executor, whose
    step processes fork from a forkserver of that process, and rebuild the job from the
    experiment's JSON and the store's home (or ``$RAGUTIL_HOME`` when the store reads it).
    Forkservers keep the environment they started with. With ``executor`` ``celery`` the steps
    run on the Celery workers instead, each rebuilding the job under its own ``$RAGUTIL_HOME``."""

    def __init__(
        self,
        resources: dict,
        experiment: ExperimentConfig,
        instance: dg.DagsterInstance,
        tags: dict[str, str],
        loggers: dict,
        workers: int,
        executor: str | None = None,
    ) -> None:
        if instance.is_ephemeral:
            raise ValueError("running partitions in parallel needs a persistent Dagster instance")
        home = resources["store"].home
        # A Celery worker's home is its own, never this machine's.
        shared_home = None if executor or isinstance(home, dg.EnvVar) else home
        self.arguments = (
            experiment.model_dump_json(),
            shared_home,
            resources["models"].show_progress,
            executor,
        )
        execution = (
            {} if executor else {"max_concurrent": workers, "start_method": {"forkserver": {}}}
        )
        self.run_config = {"execution": {"config": execution}, "loggers": loggers}
        self.instance_ref, self.tags = instance.get_ref(), tags
        self.pool = None
        # One Celery run at a time is orchestrated in this process: a process of its own would only
        # add its imports (the steps run on the workers either way).
        if workers > 1 or not executor:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([__name__])
            self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=context)

    def map(
        self, names: list[str], keys: list[str | None], versions: list[dict[str, str]]
    ) -> Iterator[tuple[bool, str, SerializedError | None]]:
        """The outcomes of one run per key (tagged with its input versions), in the order of ``keys``."""
        calls = [
            (
                _execute_partition,
                self.instance_ref,
                self.arguments,
                names,
                key,
                self.run_config,
                {**self.tags, **tags},
            )
            for key, tags in zip(keys, versions)
        ]
        if self.pool is None:
            return (call[0](*call[1:]) for call in calls)
        futures = [self.pool.submit(*call) for call in calls]
        return (future.result() for future in futures)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


def _execute_partition(
    instance_ref,
    arguments: tuple,
    names: list[str],
    key: str | None,
    run_config: dict,
    tags: dict[str, str],
) -> tuple[bool, str, SerializedError | None]:
    """One Dagster run of ``names`` for partition ``key`` on the multiprocess executor (in a
    process of :class:`ParallelRuns`)."""
    job = dg.build_reconstructable_job(__name__, step_job.__name__, (*arguments, names))
    # The partition's tags, one per dimension of a multi-partition key included, as materialize sets them.
    partition = job.get_definition().get_tags_for_partition_key(key, None) if key else {}
    with dg.DagsterInstance.from_ref(instance_ref) as instance:
        return _outcome(
            dg.execute_job(job, instance, run_config=run_config, tags={**tags, **partition})
        )


def _resolved_store(resources: dict) -> ArtifactStore:
    """The store resource with its ``EnvVar`` fields resolved, for use outside a Dagster run."""
    store = resources["store"]
    home, url = (
        value.get_value() if isinstance(value, dg.EnvVar) else value
        for value in (store.home, store.url)
    )
    return ArtifactStore(home=home, url=url)
