"""``reports``: the cross-partition tables and plots — every setting × generator side by side, as
the partition runs in MLflow hold them — and the comparison run in MLflow (the papers' tables,
paired tests between retrievers), in the experiment's own report folder
(``tracking.report.report_artifact``)."""

import dagster as dg
import polars as pl

from ragutil_dagster.assets.common import GROUP
from ragutil_dagster.assets.partitions import Partitions
from ragutil_dagster.config import Setting
from ragutil_dagster.evaluation.world_scope import known_causes
from ragutil_dagster.metrics import catalog
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.tables import markdown_table
from ragutil_dagster.tracking import MlflowTracking, dagster_tags
from ragutil_dagster.tracking.compare import PartitionScores
from ragutil_dagster.tracking.plots import delta_seper_heatmap
from ragutil_dagster.tracking.report import compare_runs, report_artifact


def report_columns() -> tuple[str, ...]:
    """The summary columns of the reports: the catalogue's headline metrics, then MIRAGE's four."""
    return tuple(dict.fromkeys(m.name for m in (*catalog.headline(), *catalog.mirage())))


def summary_row(setting: Setting, generator: str, summary: dict[str, float]) -> dict[str, object]:
    """A setting × generator and its headline numbers."""
    return {
        "dataset": setting.dataset,
        "retriever": setting.retriever,
        "k": setting.k,
        "reranker": setting.reranker or "",
        "compression": setting.compressor or "",
        "multistep_round": setting.step or 1,
        "generator": generator,
        **{c: summary.get(c) for c in report_columns()},
    }


def _summary_frame(rows: list[dict[str, object]]) -> pl.DataFrame:
    """The rows as a table, without the measures no row has (adaptive sampling's share on a fixed-N
    run, verbalized utility of a generator that gives none) and, when no setting compresses its
    context, without the compression measures."""
    if not rows:
        raise FileNotFoundError("no metric_scores partition has been materialised yet")
    table = pl.DataFrame(rows).sort(
        "dataset", "generator", "retriever", "k", "compression", "multistep_round"
    )
    compressed = (table["compression"] != "").any()
    return table.drop(
        [
            c
            for c in report_columns()
            if table[c].is_null().all() or (not compressed and c in catalog.compression_only())
        ]
    )


def summary_table(store: ArtifactStore, parts: Partitions) -> pl.DataFrame:
    """One row per setting × generator materialised on this machine (what ``ragutil run`` just
    computed) with its headline numbers."""
    rows = []
    for key in parts.setting_generator.get_partition_keys():
        if store.has_json("metric_scores", str(key), "summary"):
            summary = store.read_json("metric_scores", str(key), "summary")
            rows.append(
                summary_row(
                    parts.experiment.setting(key.keys_by_dimension["setting"]),
                    key.keys_by_dimension["generator"],
                    summary,
                )
            )
    return _summary_frame(rows)


def compared_summary_table(partitions: list[PartitionScores]) -> pl.DataFrame:
    """One row per compared partition run (from MLflow, whichever machine logged it)."""
    return _summary_frame([summary_row(p.setting, p.generator, p.summary) for p in partitions])


def build(parts: Partitions) -> dg.AssetsDefinition:
    @dg.asset(
        name="reports",
        group_name=GROUP,
        kinds={"polars", "csv"},
        deps=[
            "metric_scores",
            "utility_transfer",
            *(["validity"] if parts.experiment.validity else []),
        ],
        description="Cross-partition comparison: headline metrics of every setting × generator, "
        "as CSV, Markdown and a ΔSePer heatmap; the papers' comparison tables with paired tests "
        "between retrievers, LLM-specific utility's Table 1, transfer and overlap (and, with validity, SePer Table 2), logged as an MLflow comparison run "
        "per dataset.",
    )
    def reports(
        context: dg.AssetExecutionContext, store: ArtifactStore, tracking: MlflowTracking
    ) -> dg.MaterializeResult:
        outcome = compare_runs(
            store,
            tracking,
            parts.experiment,
            dagster_tags(context.run.run_id, context.asset_key.to_user_string()),
        )
        table = compared_summary_table(outcome.partitions)
        markdown = "\n\n".join(
            [
                markdown_table(table.to_dicts()),
                *(f"Note: {note}" for note in known_causes(parts.experiment, table)),
            ]
        )
        summary = report_artifact(parts.experiment)
        with store.write_files(*summary) as directory:
            table.write_csv(directory / "summary.csv")
            (directory / "summary.md").write_text(markdown + "\n")
            delta_seper_heatmap(table, directory / "delta_seper_heatmap.png")
        metadata = {
            "dagster/row_count": dg.MetadataValue.int(table.height),
            "summary": dg.MetadataValue.md(markdown),
            "comparison": dg.MetadataValue.md(outcome.markdown()),
            "path": dg.MetadataValue.path(store.location(*summary)),
        }
        for dataset, run in outcome.runs.items():
            metadata[f"mlflow_comparison_url/{dataset}"] = dg.MetadataValue.url(run.url)
            metadata[f"mlflow_comparison_run_id/{dataset}"] = dg.MetadataValue.text(run.run_id)
        return dg.MaterializeResult(metadata=metadata)

    return reports
