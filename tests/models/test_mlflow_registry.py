"""Resolving ``models:/`` URIs: only the registry's "does not exist" answers mean the model is
not there; any other MLflow error (credentials refused, server unreachable) says so."""

from __future__ import annotations

import pytest
from mlflow.exceptions import MlflowException
from mlflow.protos import databricks_pb2

from ragutil_dagster.errors import ModelRegistryError, ModelUnavailableError
from ragutil_dagster.models.mlflow_registry import registered_model_dir

REGISTRY = "http://user:secret@registry.example:5000"


class _Client:
    """An MlflowClient whose every look-up fails with ``error``."""

    error: MlflowException

    def __init__(self, tracking_uri: str) -> None:
        assert tracking_uri == REGISTRY

    def get_model_version(self, name: str, version: str):
        raise self.error

    def get_model_version_by_alias(self, name: str, alias: str):
        raise self.error


def _resolve(monkeypatch, tmp_path, uri: str, error: MlflowException) -> str:
    monkeypatch.setattr("mlflow.tracking.MlflowClient", _Client)
    monkeypatch.setattr(_Client, "error", error, raising=False)
    return registered_model_dir(uri, tmp_path, REGISTRY)


def test_a_missing_model_or_alias_is_not_in_the_registry(monkeypatch, tmp_path) -> None:
    missing = MlflowException(
        "Model Version (name=reader, version=3) not found",
        error_code=databricks_pb2.RESOURCE_DOES_NOT_EXIST,
    )
    with pytest.raises(
        ModelUnavailableError,
        match=r"is not in the MLflow registry at http://user:\*\*\*@registry.example:5000",
    ):
        _resolve(monkeypatch, tmp_path, "models:/reader/3", missing)
    no_alias = MlflowException(
        "Registered model alias champion not found.",
        error_code=databricks_pb2.INVALID_PARAMETER_VALUE,
    )
    with pytest.raises(ModelUnavailableError, match="is not in the MLflow registry"):
        _resolve(monkeypatch, tmp_path, "models:/reader@champion", no_alias)


@pytest.mark.parametrize(
    "code", ["PERMISSION_DENIED", "UNAUTHENTICATED", "INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE"]
)
def test_other_registry_errors_are_not_reported_as_missing(
    monkeypatch, tmp_path, code: str
) -> None:
    error = MlflowException(
        f"API request to {REGISTRY}/api/2.0/mlflow/model-versions/get failed",
        error_code=getattr(databricks_pb2, code),
    )
    with pytest.raises(ModelRegistryError, match=f"could not be asked \\({code}: ") as raised:
        _resolve(monkeypatch, tmp_path, "models:/reader/1", error)
    assert not isinstance(raised.value, ModelUnavailableError)
    assert "secret" not in str(raised.value) and "reachable" in str(raised.value)
