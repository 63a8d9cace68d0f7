"""The MLflow resource: where runs go, finding a run again by its key, and terminal statuses.

The tracking URI is ``tracking_uri`` (``MLFLOW_TRACKING_URI`` through ``EnvVar`` when set), else
the embedded default ``sqlite:///<home>/mlflow.db`` with artifacts under ``<home>/mlruns``.
MLflow is imported lazily: loading the Definitions must not pay for it.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dagster import ConfigurableResource

from ragutil_dagster.infra.databases import (
    MLFLOW_TRACKING_URI_VARIABLE,
    check_reachable,
    is_database_uri,
)
from ragutil_dagster.infra.files import embedded_tracking_uri
from ragutil_dagster.infra.locks import exclusive_file_lock
from ragutil_dagster.infra.objectstore import mlflow_artifact_root
from ragutil_dagster.infra.redaction import redact, redact_uri
from ragutil_dagster.tracking.claims import claim
from ragutil_dagster.tracking.keys import KIND_TAG, RUN_KEY_TAG

if TYPE_CHECKING:
    from mlflow import MlflowClient

FINISHED, FAILED, RUNNING = "FINISHED", "FAILED", "RUNNING"
MLFLOW_UI_URL_VARIABLE = "RAGUTIL_MLFLOW_UI_URL"
"""Where ``ragutil ui`` serves the MLflow UI; Dagster reads it into ``MlflowTracking.ui_url``."""
DEFAULT_MLFLOW_UI_URL = "http://127.0.0.1:5000"


@functools.cache
def _client(uri: str) -> MlflowClient:
    """One client per URI and process. For a database store, the first use creates or migrates
    MLflow's schema; under a claim, so processes starting together do that one at a time."""
    from mlflow import MlflowClient

    if not is_database_uri(uri):
        return MlflowClient(tracking_uri=uri)
    check_reachable(uri, "the MLflow tracking database", MLFLOW_TRACKING_URI_VARIABLE)
    with claim(uri, "mlflow-schema"):
        client = MlflowClient(tracking_uri=uri)
        # Opening the store creates or migrates its tables.
        client.search_experiments(max_results=1)
    return client


@dataclass(frozen=True)
class TrackedRun:
    """An MLflow run being written: its ids, UI link, and whether an earlier attempt made it."""

    client: MlflowClient
    experiment_id: str
    run_id: str
    url: str
    reused: bool
    model_id: str | None = None
    """The LoggedModel the run's metrics are linked to (``log_metric(model_id=)``)."""
    dataset: tuple[str, str] | None = None
    """The (name, digest) of the dataset the run's metrics are linked to."""

    def log_params(self, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        # Parameters are shown to everyone with access to the store: no credentials in them.
        items = [Param(name, redact(str(value))) for name, value in params.items()]
        for start in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def log_metrics(self, metrics: Mapping[str, float]) -> None:
        """Log finite metrics, linked to :attr:`model_id` and :attr:`dataset` when set; a re-used
        run gets a newer value, which MLflow shows as current."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        name_digest = self.dataset or (None, None)
        items = [
            Metric(name, float(value), now, 0, self.model_id, *name_digest)
            for name, value in metrics.items()
            if math.isfinite(value)
        ]
        for start in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[start : start + 1000])

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(
            self.run_id, tags=[RunTag(name, str(value)) for name, value in tags.items()]
        )

    def log_artifact(self, path: str | Path, directory: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), directory)


class MlflowTracking(ConfigurableResource):
    """MLflow tracking for ragutil: one experiment per dataset, one run per key.

    ``home``: ragutil's state directory (the embedded store lives there);
    ``tracking_uri``: an MLflow tracking URI, empty for the embedded SQLite store;
    ``ui_url``: where the MLflow UI for a non-HTTP store is served — ``$RAGUTIL_MLFLOW_UI_URL``
    through ``EnvVar`` under ``ragutil ui`` (the port it actually got), else ``mlflow ui``'s default;
    ``artifacts_url``: the artifact store (``$RAGUTIL_ARTIFACTS_URL``); on ``s3://`` or ``gs://``,
    experiments created for a database store keep their artifacts under ``<artifacts_url>/mlruns``.
    """

    home: str
    tracking_uri: str = ""
    ui_url: str = DEFAULT_MLFLOW_UI_URL
    artifacts_url: str = ""

    @property
    def uri(self) -> str:
        """The tracking URI, credentials included: for connecting only, never for display."""
        if self.tracking_uri:
            return self.tracking_uri
        return embedded_tracking_uri(self._home())

    @property
    def display_uri(self) -> str:
        """The tracking URI with any password or token masked: for messages and metadata."""
        return redact_uri(self.uri)

    def _home(self) -> Path:
        return Path(self.home).expanduser().resolve()

    @contextmanager
    def claim(self, key: str) -> Iterator[None]:
        """Hold ``key`` (file-name safe) against every other ragutil process for the block.

        A database store holds it in the database (``tracking.claims``: across machines). An
        ``http(s)://`` server gives ragutil no database access: the key is then held by a file
        lock in ragutil's home, which only orders the processes of this machine."""
        if is_database_uri(self.uri):
            with claim(self.uri, key):
                yield
        else:
            with exclusive_file_lock(self._home() / "claims" / f"{key}.lock"):
                yield

    def client(self) -> MlflowClient:
        if not self.tracking_uri:
            self._home().mkdir(parents=True, exist_ok=True)
        return _client(self.uri)

    def experiment_id(self, name: str) -> str:
        """The id of experiment ``name``, created on first use (artifacts, for a database store,
        under ``<artifacts_url>/mlruns`` on an object store, else ``<home>/mlruns`` — MLflow's
        default would be ``./mlruns`` of whatever directory the process runs in; the server's
        artifact root for a tracking server)."""
        from mlflow.exceptions import MlflowException

        client = self.client()
        found = client.get_experiment_by_name(name)
        if found is not None:
            if found.lifecycle_stage == "deleted":
                raise RuntimeError(
                    f"MLflow experiment {name!r} is deleted in {self.display_uri}; restore it "
                    f"(mlflow experiments restore --experiment-id {found.experiment_id}) or remove it for good"
                )
            return found.experiment_id
        location = None
        if is_database_uri(self.uri):
            folder = name.replace("/", "_")
            remote = mlflow_artifact_root(self.artifacts_url)
            location = (
                f"{remote}/{folder}" if remote else (self._home() / "mlruns" / folder).as_uri()
            )
        try:
            return client.create_experiment(name, artifact_location=location)
        except MlflowException:
            # Another process created it between our lookup and create.
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def run_url(self, experiment_id: str, run_id: str) -> str:
        """The run's page in the MLflow UI."""
        base = self.display_uri if self.uri.startswith(("http://", "https://")) else self.ui_url
        return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"

    def find_run(self, experiment_id: str, key: str):
        """The oldest live run tagged with ``key`` (any status), or ``None``."""
        runs = self.client().search_runs(
            [experiment_id],
            filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'",
            order_by=["attributes.start_time ASC"],
            max_results=1,
        )
        return runs[0] if runs else None

    @contextmanager
    def run(
        self, experiment: str, key: str, name: str, kind: str, tags: Mapping[str, str]
    ) -> Iterator[TrackedRun]:
        """Open the run tagged ``key`` in ``experiment`` — reusing one an earlier attempt left
        FINISHED, FAILED or RUNNING (a killed process) — and end it FINISHED, or FAILED if the
        body raises.

        The whole block holds the key's claim (:meth:`claim`): a process opening the same key
        meanwhile waits, then reuses this run, so a key never gets two runs and two processes
        never interleave their writes to one."""
        client = self.client()
        experiment_id = self.experiment_id(experiment)
        with self.claim(f"run-{key}"):
            existing = self.find_run(experiment_id, key)
            if existing is None:
                created = client.create_run(
                    experiment_id, run_name=name, tags={RUN_KEY_TAG: key, KIND_TAG: kind}
                )
                run_id = created.info.run_id
            else:
                run_id = existing.info.run_id
                client.update_run(run_id, status=RUNNING)
            tracked = TrackedRun(
                client,
                experiment_id,
                run_id,
                self.run_url(experiment_id, run_id),
                existing is not None,
            )
            status = FAILED
            try:
                tracked.set_tags(tags)
                yield tracked
                status = FINISHED
            finally:
                client.set_terminated(run_id, status)
