"""Models from the MLflow Model Registry: ``models:/<name>/<version>`` or ``models:/<name>@<alias>``.

A registered model resolves to a concrete version through the registry, and that version's files
are downloaded once into ``<home>/cache/mlflow-models/<name>/<version>``. Moving an alias (or
registering the version a URI names) therefore changes the local directory — and with it the
model identity that keys every cache and that the model-identity sensor observes.

The registry is reached by its tracking URI alone (no Dagster resource), so model resolution
stays below the tracking layer.
"""

from __future__ import annotations

import re
from pathlib import Path

from ragutil_dagster.errors import ModelRegistryError, ModelUnavailableError
from ragutil_dagster.infra.prompt_registry import registry_not_found
from ragutil_dagster.infra.redaction import redact, redact_uri

PREFIX = "models:/"
_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[\w-]+))$")


def registered_model_dir(uri: str, home: Path, tracking_uri: str) -> str:
    """The local directory of the registry version ``uri`` names, downloaded on first use."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    match = _URI.match(uri)
    if match is None:
        raise ModelUnavailableError(
            f"model {uri!r}: expected models:/<name>/<version> or models:/<name>@<alias>"
        )
    client = MlflowClient(tracking_uri=tracking_uri)
    name = match["name"]
    try:
        version = (
            client.get_model_version(name, match["version"])
            if match["version"]
            else client.get_model_version_by_alias(name, match["alias"])
        )
    except MlflowException as err:
        registry = redact_uri(tracking_uri)
        if not registry_not_found(err, alias=match["alias"] is not None):
            raise ModelRegistryError(
                f"model {uri!r}: the MLflow registry at {registry} could not be asked "
                f"({err.error_code}: {redact(str(err).splitlines()[0])}); check that it is reachable "
                "and that its credentials (MLFLOW_TRACKING_TOKEN / _USERNAME / _PASSWORD) are accepted"
            ) from None
        raise ModelUnavailableError(
            f"model {uri!r} is not in the MLflow registry at {registry} "
            f"({str(err).splitlines()[0]}); register it there or set MLFLOW_TRACKING_URI to the "
            "registry that has it"
        ) from None
    target = home / "cache" / "mlflow-models" / name / str(version.version)
    if not (target / ".complete").is_file():
        import mlflow.artifacts

        staging = target.with_name(f".{target.name}.partial")
        staging.mkdir(parents=True, exist_ok=True)
        mlflow.artifacts.download_artifacts(
            artifact_uri=f"models:/{name}/{version.version}",
            dst_path=str(staging),
            tracking_uri=tracking_uri,
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
