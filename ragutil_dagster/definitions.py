"""The Dagster ``Definitions`` of ragutil: the asset graph of one experiment config, its resources,
sensors and schedules. ``dagster dev -w workspace.yaml`` serves :data:`defs`; the experiment is
``$RAGUTIL_CONFIG`` (default ``examples/demo.yaml``), the executor ``$RAGUTIL_EXECUTOR``
(``infra/executor_names.py``; unset, Dagster's default: every step in a process of its own on this machine)."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from ragutil_dagster.assets import build_assets
from ragutil_dagster.automation import build_automation, with_weekly_reevaluation
from ragutil_dagster.config import ExperimentConfig, load_config
from ragutil_dagster.errors import ConfigError
from ragutil_dagster.infra.databases import (
    GENERATION_CACHE_URL_VARIABLE,
    MLFLOW_TRACKING_URI_VARIABLE,
)
from ragutil_dagster.infra.executor_names import (
    CELERY_EXECUTOR,
    EXECUTOR_VARIABLE,
    EXECUTORS,
    K8S_EXECUTOR,
)
from ragutil_dagster.infra.files import ragutil_home
from ragutil_dagster.infra.objectstore import ARTIFACTS_URL_VARIABLE
from ragutil_dagster.resources import ArtifactStore, ModelLoader
from ragutil_dagster.resources.storage import SCRATCH_DIR_VARIABLE
from ragutil_dagster.tracking import MlflowTracking
from ragutil_dagster.tracking.resource import DEFAULT_MLFLOW_UI_URL, MLFLOW_UI_URL_VARIABLE

DEFAULT_CONFIG = "examples/demo.yaml"


def build_resources(
    home: str | None = None, *, show_progress: bool = True, for_dagster: bool = True
) -> dict[str, dg.ConfigurableResource]:
    """Storage, models and MLflow tracking under ``$RAGUTIL_HOME``; the artifacts under
    ``$RAGUTIL_ARTIFACTS_URL`` when set (any fsspec URL, e.g. ``s3://bucket/ragutil``), the working
    files shared by step processes under ``$RAGUTIL_SCRATCH_DIR`` when set; the MLflow store is
    ``$MLFLOW_TRACKING_URI`` when set, else ``<home>/mlflow.db``, and its run links point at
    ``$RAGUTIL_MLFLOW_UI_URL`` (set by ``ragutil ui``) when set.

    For Dagster (``for_dagster``) those variables are read through ``EnvVar``, so the run
    worker resolves them; outside Dagster (``ragutil score``, ``compare``, the runner's summary)
    their values are used directly."""
    from_env = for_dagster and home is None
    home = home or str(ragutil_home())
    home_value: str | dg.EnvVar = (
        dg.EnvVar("RAGUTIL_HOME") if from_env and "RAGUTIL_HOME" in os.environ else home
    )
    return {
        "store": ArtifactStore(
            home=home_value,
            url=_environment_value(ARTIFACTS_URL_VARIABLE, for_dagster),
            scratch=_environment_value(SCRATCH_DIR_VARIABLE, for_dagster),
        ),
        "models": ModelLoader(
            nli_cache=str(Path(home).expanduser() / "cache" / "nli.sqlite"),
            generation_cache=_environment_value(GENERATION_CACHE_URL_VARIABLE, for_dagster)
            or str(Path(home).expanduser() / "cache" / "generations"),
            show_progress=show_progress,
        ),
        "tracking": MlflowTracking(
            home=home_value,
            tracking_uri=_environment_value(MLFLOW_TRACKING_URI_VARIABLE, for_dagster),
            ui_url=_environment_value(MLFLOW_UI_URL_VARIABLE, for_dagster) or DEFAULT_MLFLOW_UI_URL,
            artifacts_url=_environment_value(ARTIFACTS_URL_VARIABLE, for_dagster),
        ),
    }


def _environment_value(name: str, for_dagster: bool) -> str | dg.EnvVar:
    """The variable's value, or for Dagster an ``EnvVar`` the run worker resolves; empty when unset."""
    value = os.environ.get(name, "")
    return dg.EnvVar(name) if for_dagster and value else value


def executor(name: str | None) -> dg.ExecutorDefinition | None:
    """The executor of runs launched from the Dagster UI, the sensors or a run launcher, by name
    (``infra/executors.EXECUTORS``); ``None`` for Dagster's default."""
    if not name:
        return None
    if name == K8S_EXECUTOR:
        from dagster_k8s import k8s_job_executor  # the [k8s] extra, needed only where it runs

        return k8s_job_executor
    if name == CELERY_EXECUTOR:
        from ragutil_dagster.celery_executor import celery_executor  # the [celery] extra

        return celery_executor
    raise ConfigError(
        f"{EXECUTOR_VARIABLE}={name!r}: unknown executor; choose one of {', '.join(EXECUTORS)}"
    )


def build_definitions(
    experiment: ExperimentConfig,
    home: str | None = None,
    *,
    show_progress: bool = True,
    executor_name: str | None = None,
) -> dg.Definitions:
    _, assets = build_assets(experiment)
    return dg.Definitions(
        assets=with_weekly_reevaluation(assets),
        resources=build_resources(home, show_progress=show_progress),
        sensors=build_automation(experiment, assets),
        executor=executor(executor_name),
    )


@dg.definitions
def defs() -> dg.Definitions:
    """Loaded lazily, so importing this module reads no config."""
    return build_definitions(
        load_config(os.environ.get("RAGUTIL_CONFIG", DEFAULT_CONFIG)),
        executor_name=os.environ.get(EXECUTOR_VARIABLE),
    )
