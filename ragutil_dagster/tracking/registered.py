"""Models from the MLflow Model Registry: ``models:/<name>/<version>`` or ``models:/<name>@<alias>``.

A registered model resolves to a concrete version through the registry, and that version's files
are downloaded once into ``$RAGUTIL_HOME/cache/mlflow-models/<name>/<version>``. Moving an alias
(or registering the version a URI names) therefore changes the local directory — and with it the
model identity that keys every cache and that the model-identity sensor observes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ragutil_dagster.models.identity import ModelUnavailableError
from ragutil_dagster.tracking.resource import MlflowTracking

PREFIX = "models:/"
_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[\w-]+))$")


def is_registered_model(name: str) -> bool:
    return name.startswith(PREFIX)


def registered_model_dir(uri: str, home: Path) -> str:
    """The local directory of the registry version ``uri`` names, downloaded on first use."""
    match = _URI.match(uri)
    if match is None:
        raise ModelUnavailableError(
            f"model {uri!r}: expected models:/<name>/<version> or models:/<name>@<alias>"
        )
    tracking = MlflowTracking(home=str(home), tracking_uri=os.environ.get("MLFLOW_TRACKING_URI", ""))
    client = tracking.client()
    name = match["name"]
    try:
        version = (
            client.get_model_version(name, match["version"])
            if match["version"]
            else client.get_model_version_by_alias(name, match["alias"])
        )
    except Exception as err:  # noqa: BLE001 — MLflow raises several types for "not found"
        raise ModelUnavailableError(
            f"model {uri!r} is not in the MLflow registry at {tracking.display_uri} ({str(err).splitlines()[0]}); "
            "register it there or set MLFLOW_TRACKING_URI to the registry that has it"
        ) from None
    target = home / "cache" / "mlflow-models" / name / str(version.version)
    if not (target / ".complete").is_file():
        import mlflow.artifacts

        staging = target.with_name(f".{target.name}.partial")
        staging.mkdir(parents=True, exist_ok=True)
        mlflow.artifacts.download_artifacts(
            artifact_uri=f"models:/{name}/{version.version}", dst_path=str(staging), tracking_uri=tracking.uri
        )
        (staging / ".complete").write_text(str(version.version))
        staging.replace(target)
    return str(_model_root(target))


def _model_root(directory: Path) -> Path:
    """The folder holding the model's config (downloads may nest the files one level down)."""
    if (directory / "config.json").is_file():
        return directory
    nested = [p.parent for p in directory.rglob("config.json")]
    return min(nested, key=lambda p: len(p.parts)) if nested else directory
