"""The Dagster ``Definitions`` of ragutil: the asset graph of one experiment config, its resources,
sensors and schedules. ``dagster dev -w workspace.yaml`` serves :data:`defs`; the experiment is
``$RAGUTIL_CONFIG`` (default ``examples/demo.yaml``)."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from ragutil_dagster.assets import build_assets
from ragutil_dagster.automation import build_automation, with_weekly_reevaluation
from ragutil_dagster.config import ExperimentConfig, load_config
from ragutil_dagster.files import ragutil_home
from ragutil_dagster.resources import ArtifactStore, ModelRegistry
from ragutil_dagster.tracking import MlflowTracking

DEFAULT_CONFIG = "examples/demo.yaml"


def build_resources(
    home: str | None = None, *, show_progress: bool = True, for_dagster: bool = True
) -> dict[str, dg.ConfigurableResource]:
    """Storage, models and MLflow tracking under ``$RAGUTIL_HOME``; the MLflow store is
    ``$MLFLOW_TRACKING_URI`` when set, else ``<home>/mlflow.db``.

    For Dagster (``for_dagster``) those two variables are read through ``EnvVar``, so the run
    worker resolves them; outside Dagster (``ragutil score``, ``compare``, the runner's summary)
    their values are used directly."""
    from_env = for_dagster and home is None
    home = home or str(ragutil_home())
    home_value: str | dg.EnvVar = dg.EnvVar("RAGUTIL_HOME") if from_env and "RAGUTIL_HOME" in os.environ else home
    tracking_uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    tracking_value: str | dg.EnvVar = dg.EnvVar("MLFLOW_TRACKING_URI") if for_dagster and tracking_uri else tracking_uri
    return {
        "store": ArtifactStore(home=home_value),
        "models": ModelRegistry(
            nli_cache=str(Path(home).expanduser() / "cache" / "nli.sqlite"),
            generation_cache=str(Path(home).expanduser() / "cache" / "generations"),
            show_progress=show_progress,
        ),
        "tracking": MlflowTracking(home=home_value, tracking_uri=tracking_value),
    }


def build_definitions(experiment: ExperimentConfig, home: str | None = None) -> dg.Definitions:
    _, assets = build_assets(experiment)
    return dg.Definitions(
        assets=with_weekly_reevaluation(assets),
        resources=build_resources(home),
        sensors=build_automation(experiment, assets),
    )


@dg.definitions
def defs() -> dg.Definitions:
    """Loaded lazily, so importing this module reads no config."""
    return build_definitions(load_config(os.environ.get("RAGUTIL_CONFIG", DEFAULT_CONFIG)))
