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


def build_resources(home: str | None = None) -> dict[str, dg.ConfigurableResource]:
    """Storage, models and MLflow tracking under ``$RAGUTIL_HOME`` (read through ``EnvVar`` when
    set); the MLflow store is ``$MLFLOW_TRACKING_URI`` when set, else ``<home>/mlflow.db``."""
    if home is None and "RAGUTIL_HOME" in os.environ:
        home_value: str | dg.EnvVar = dg.EnvVar("RAGUTIL_HOME")
        home = os.environ["RAGUTIL_HOME"]
    else:
        home = home or str(ragutil_home())
        home_value = home
    tracking_uri: str | dg.EnvVar = dg.EnvVar("MLFLOW_TRACKING_URI") if os.environ.get("MLFLOW_TRACKING_URI") else ""
    return {
        "store": ArtifactStore(home=home_value),
        "models": ModelRegistry(
            nli_cache=str(Path(home).expanduser() / "cache" / "nli.sqlite"),
            generation_cache=str(Path(home).expanduser() / "cache" / "generations"),
        ),
        "tracking": MlflowTracking(home=home_value, tracking_uri=tracking_uri),
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
