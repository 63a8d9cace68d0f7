"""MLflow tracking: one run per ``metric_scores`` partition (setting × generator) in one
experiment per dataset, found again by a deterministic key; comparison runs across them.

- :mod:`.keys` — what a partition was computed from, its run key and params;
- :mod:`.resource` — the ``MlflowTracking`` Dagster resource (URI, reuse, terminal status);
- :mod:`.partition` — metrics with bootstrap intervals, cost figures, artifacts of a partition;
- :mod:`.compare` — the papers' cross-run tables, paired tests between retrievers, the comparison run;
- :mod:`.plots` — PNG plots.
"""

from ragutil_dagster.tracking.keys import (
    DAGSTER_ASSET_TAG,
    DAGSTER_PARTITION_TAG,
    DAGSTER_RUN_TAG,
    KIND_TAG,
    RUN_KEY_TAG,
    ModelIdentities,
    PartitionRun,
)
from ragutil_dagster.tracking.resource import MlflowTracking, TrackedRun


def dagster_tags(run_id: str, asset_key: str, partition: str | None = None) -> dict[str, str]:
    """The tags linking an MLflow run back to the Dagster run, asset and partition that wrote it."""
    tags = {DAGSTER_RUN_TAG: run_id, DAGSTER_ASSET_TAG: asset_key}
    if partition:
        tags[DAGSTER_PARTITION_TAG] = partition
    return tags


__all__ = [
    "KIND_TAG",
    "RUN_KEY_TAG",
    "MlflowTracking",
    "ModelIdentities",
    "PartitionRun",
    "TrackedRun",
    "dagster_tags",
]
