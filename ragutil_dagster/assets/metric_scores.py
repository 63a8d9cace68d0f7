"""``metric_scores[setting × generator]``: every paper's metric on the same samples — SePer_S/H
with and without context and ΔSePer per query and per document, semantic entropy, EM / F1 /
has_answer, eRAG labels and aggregates, MIRAGE's four metrics, ConSens, LLM-specific gold
utility and the set / rank metrics of likelihood- and attention-based utility."""


import time

import dagster as dg
import polars as pl

from ragutil_dagster.assets.common import GROUP, check_result
from ragutil_dagster.assets.entailment_clusters import all_generations, closed_book_partition
from ragutil_dagster.assets.partitions import Partitions, dimension
from ragutil_dagster.config import Setting
from ragutil_dagster.evaluation.scoring import (
    document_scores,
    group_scores,
    query_scores,
    summarize,
)
from ragutil_dagster.failpoints import failpoint
from ragutil_dagster.metrics import catalog
from ragutil_dagster.resources.models import ModelRegistry
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.tables import (
    CONSENS,
    DOCUMENTS,
    GROUPS,
    NLI,
    UTILITY,
    UTILITY_SIGNALS,
    markdown_table,
)
from ragutil_dagster.tracking import MlflowTracking, PartitionRun, dagster_tags
from ragutil_dagster.tracking.partition import cost_metrics, log_partition, off_world_tags, partition_identities


def score_checks(
    queries: pl.DataFrame, per_query: pl.DataFrame, documents: pl.DataFrame, summary: dict[str, float]
) -> list[dg.AssetCheckResult]:
    """Every query scored; every score inside its range; MIRAGE's four metrics sum to 1 (eq. 6)."""
    unscored = per_query.filter(pl.col("delta_seper_s").is_null() | pl.col("delta_seper_h").is_null())
    missing = queries.height - per_query.height
    bounds = catalog.per_query_bounds()
    eps = 1e-9
    out_of_range = {
        column: int(per_query.filter((pl.col(column) < low - eps) | (pl.col(column) > high + eps)).height)
        for column, (low, high) in bounds.items()
        if column in per_query.columns
    }
    out_of_range["document_delta_seper_s"] = int(documents.filter(pl.col("delta_seper_s").abs() > 1 + eps).height)
    mirage = [summary[m.name] for m in catalog.mirage() if m.name in summary]
    mirage_total = sum(mirage)
    return [
        check_result("every_query_has_scores", missing == 0 and unscored.height == 0,
                     queries=queries.height, scored=per_query.height - unscored.height),
        check_result("scores_in_range", not any(out_of_range.values()), **out_of_range),
        check_result("mirage_metrics_sum_to_one", not mirage or abs(mirage_total - 1) < 1e-9,
                     total=mirage_total, metrics=len(mirage)),
    ]


def build(parts: Partitions) -> dg.AssetsDefinition:
    experiment = parts.experiment

    @dg.asset(
        name="metric_scores", partitions_def=parts.setting_generator, group_name=GROUP, kinds={"polars", "parquet"},
        deps=[
            "entailment_clusters",
            "generations",
            dg.AssetDep("closed_book_generations", partition_mapping=parts.dataset_generator_to_setting_generator()),
            dg.AssetDep("retrieval_run", partition_mapping=dg.MultiToSingleDimensionPartitionMapping("setting")),
        ],
        check_specs=[
            dg.AssetCheckSpec(name, asset="metric_scores")
            for name in ("every_query_has_scores", "scores_in_range", "mirage_metrics_sum_to_one")
        ],
        description="Per-query and per-document scores of all five papers' metrics, and their summary.",
    )
    def metric_scores(
        context: dg.AssetExecutionContext, store: ArtifactStore, models: ModelRegistry, tracking: MlflowTracking
    ) -> dg.MaterializeResult:
        setting = Setting.parse(dimension(context, "setting"))
        generator = dimension(context, "generator")
        partition = context.partition_key
        start = time.perf_counter()
        samples = all_generations(store, context, setting)
        tracked = PartitionRun(experiment, setting, generator, partition_identities(experiment, setting, samples, models))
        tags = {**dagster_tags(context.run.run_id, context.asset_key.to_user_string(), str(partition)),
                **off_world_tags(experiment, setting, generator)}
        # The run is open while scoring: a failure here leaves it FAILED, never RUNNING.
        with tracking.run(tracked.mlflow_experiment, tracked.key, tracked.run_name, "partition", tags) as run:
            queries = store.read_table("queries", setting.dataset)
            nli = store.read_table("entailment_clusters", partition, NLI)
            groups = group_scores(samples, queries, nli)
            ground_truth_path = store.table_path("queries", setting.dataset, UTILITY)
            ground_truth = pl.read_parquet(ground_truth_path) if ground_truth_path.is_file() else None
            documents = document_scores(
                groups, store.read_table("retrieval_run", setting.key), setting.k,
                store.read_table("generations", partition, UTILITY_SIGNALS), ground_truth,
            )
            per_query = query_scores(groups, queries, store.read_table("generations", partition, CONSENS))
            summary = summarize(per_query, documents, setting.k)
            failpoint("scoring")
            store.write_table("metric_scores", partition, groups, GROUPS)
            documents_path = store.write_table("metric_scores", partition, documents, DOCUMENTS)
            path = store.write_table("metric_scores", partition, per_query)
            summary_path = store.write_json("metric_scores", partition, "summary", summary)
            scoring_seconds = time.perf_counter() - start
            costs = cost_metrics(context.instance, {
                "closed_book_generations": closed_book_partition(context, setting),
                "generations": str(partition), "entailment_clusters": str(partition),
            }, samples, nli, scoring_seconds)
            log_partition(
                run, tracked.params(), summary, per_query, costs, [path, documents_path, summary_path],
                store.directory("metric_scores", partition) / "plots", documents, experiment.seed,
            )
            store.write_json("metric_scores", partition, "mlflow", {
                "run_id": run.run_id, "experiment_id": run.experiment_id, "run_key": tracked.key, "url": run.url,
                "tracking_uri": tracking.display_uri,
            })
        headline = {m.name: summary[m.name] for m in catalog.headline() if m.name in summary}
        metadata: dict[str, dg.MetadataValue] = {
            "dagster/row_count": dg.MetadataValue.int(per_query.height),
            "path": dg.MetadataValue.path(str(path)),
            "documents": dg.MetadataValue.int(documents.height),
            "scoring_seconds": dg.MetadataValue.float(scoring_seconds),
            "headline": dg.MetadataValue.md(markdown_table([headline])),
            "mlflow_run_url": dg.MetadataValue.url(run.url),
            "mlflow_run_id": dg.MetadataValue.text(run.run_id),
            "mlflow_run_reused": dg.MetadataValue.bool(run.reused),
        }
        metadata.update({name: dg.MetadataValue.float(value) for name, value in summary.items()})
        return dg.MaterializeResult(metadata=metadata, check_results=score_checks(queries, per_query, documents, summary))

    return metric_scores
