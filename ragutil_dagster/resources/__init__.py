"""Dagster resources: artifact storage and the model loader (one load per process)."""

from ragutil_dagster.resources.models import ModelLoader
from ragutil_dagster.resources.storage import ArtifactStore

__all__ = ["ArtifactStore", "ModelLoader"]
