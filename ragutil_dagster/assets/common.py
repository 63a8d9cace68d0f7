"""Shared pieces of the asset modules: asset group, metadata helpers."""

import dagster as dg
import polars as pl

from ragutil_dagster.tables import markdown_table

GROUP = "ragutil"
GPU_POOL = "gpu"
MODEL_KINDS = ("generator", "nli", "embedder", "reranker")


def model_asset_key(kind: str) -> dg.AssetKey:
    """The observable source asset of the configured models of one kind (``MODEL_KINDS``): its
    data version is the model's identity, so a new identity marks what reads it stale."""
    return dg.AssetKey(["model", kind])


"""Assets running a model sit in this pool; the instance limits it to one run per card."""

MODEL_STEP = {
    "pool": GPU_POOL,
    # On Dagster's Kubernetes executor (deploy/) a model step is a pod holding one GPU; dagster-k8s
    # reads this tag (its USER_DEFINED_K8S_CONFIG_KEY), other executors ignore it.
    "op_tags": {
        "dagster-k8s/config": {
            "container_config": {"resources": {"limits": {"nvidia.com/gpu": "1"}}},
            "pod_spec_config": {
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                ]
            },
        }
    },
}
"""The arguments of every asset that runs a model: the ``gpu`` pool and one GPU per step pod."""


def step_tables(deps: list, kinds: set[str], **descriptions: str) -> list[dg.AssetSpec]:
    """The asset specs of a step writing several tables (a multi-asset): one per table, named by
    the keyword, all reading the step's inputs ``deps`` — a step's outputs share its parents."""
    return [
        dg.AssetSpec(name, group_name=GROUP, kinds=kinds, deps=deps, description=description)
        for name, description in descriptions.items()
    ]


def table_metadata(frame: pl.DataFrame, path: object) -> dict[str, dg.MetadataValue]:
    return {
        "dagster/row_count": dg.MetadataValue.int(frame.height),
        "dagster/column_schema": dg.TableSchema(
            columns=[dg.TableColumn(name, str(dtype)) for name, dtype in frame.schema.items()]
        ),
        "path": dg.MetadataValue.path(str(path)),
        "preview": dg.MetadataValue.md(markdown_table(frame.head(5).to_dicts())),
    }


def side_table_metadata(
    name: str, frame: pl.DataFrame, path: object
) -> dict[str, dg.MetadataValue]:
    """A side table written beside an asset's main table (diagnostics, or a table a child step reads): its
    rows, columns, path and first rows under ``<name>/...`` in the asset's metadata."""
    return {
        f"{name}/{key.removeprefix('dagster/')}": value
        for key, value in table_metadata(frame, path).items()
    }


def check_result(name: str, passed: bool, **metadata: object) -> dg.AssetCheckResult:
    """An inline asset check result; metadata values are shown beside it in the UI."""
    return dg.AssetCheckResult(
        check_name=name,
        passed=bool(passed),
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            k: v if isinstance(v, dg.MetadataValue) else dg.MetadataValue.text(str(v))
            for k, v in metadata.items()
        },
    )
