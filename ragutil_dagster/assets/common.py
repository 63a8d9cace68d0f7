"""Shared pieces of the asset modules: asset group, metadata helpers."""


from collections.abc import Mapping

import dagster as dg
import polars as pl

GROUP = "ragutil"
GPU_POOL = "gpu"
"""Assets running a model sit in this pool; the instance limits it to one run per card."""


def markdown_table(rows: list[Mapping[str, object]], digits: int = 3) -> str:
    """A Markdown table of dict rows (shared keys as columns), floats rounded."""
    if not rows:
        return "(empty)"
    columns = list(rows[0])

    def cell(value: object) -> str:
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def table_metadata(frame: pl.DataFrame, path: object) -> dict[str, dg.MetadataValue]:
    return {
        "dagster/row_count": dg.MetadataValue.int(frame.height),
        "path": dg.MetadataValue.path(str(path)),
        "preview": dg.MetadataValue.md(markdown_table(frame.head(5).to_dicts())),
    }


def check_result(name: str, passed: bool, **metadata: object) -> dg.AssetCheckResult:
    """An inline asset check result; metadata values are shown beside it in the UI."""
    return dg.AssetCheckResult(
        check_name=name,
        passed=bool(passed),
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={k: v if isinstance(v, dg.MetadataValue) else dg.MetadataValue.text(str(v)) for k, v in metadata.items()},
    )
