"""Dagster resources: artifact storage and the model registry (one load per process)."""

from ragutil_dagster.resources.models import ModelRegistry
from ragutil_dagster.resources.storage import ArtifactStore

__all__ = ["ArtifactStore", "ModelRegistry"]
