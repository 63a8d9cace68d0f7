"""``entailment_clusters[setting × generator]`` and ``nli_probabilities``: NLI over every distinct
pair SePer needs — closed book and context samples, both directions, against the gold answers —
and the semantic cluster of every sample. The NLI model runs here only; ``metric_scores`` reads
the stored probabilities."""


import time

import dagster as dg
import polars as pl

from ragutil_dagster.assets.common import MODEL_STEP, step_tables, table_metadata
from ragutil_dagster.assets.partitions import Partitions, dimension
from ragutil_dagster.config import Setting
from ragutil_dagster.evaluation.sampling import sampling_mismatch
from ragutil_dagster.evaluation.scoring import cluster_table, compute_nli
from ragutil_dagster.resources.models import ModelRegistry
from ragutil_dagster.resources.storage import ArtifactStore


def closed_book_partition(context: dg.AssetExecutionContext, setting: Setting) -> str:
    return str(dg.MultiPartitionKey({"dataset": setting.dataset, "generator": dimension(context, "generator")}))


def all_generations(store: ArtifactStore, context: dg.AssetExecutionContext, setting: Setting) -> pl.DataFrame:
    """Closed-book and context samples of this setting × generator, as one table. Both must come
    from the same model and sampling settings: after a model or config change, scoring waits for
    both to be re-sampled."""
    closed = store.read_table("closed_book_generations", closed_book_partition(context, setting))
    with_context = store.read_table("generations", context.partition_key)
    mismatch = sampling_mismatch(closed, with_context)
    if mismatch is not None:
        raise RuntimeError(
            f"{context.partition_key}: closed-book and context samples were drawn differently ({mismatch}); "
            f"materialise closed_book_generations and generations for this generator first"
        )
    return pl.concat([closed, with_context])


def build(parts: Partitions) -> dg.AssetsDefinition:
    experiment = parts.experiment

    deps = [
        "generations",
        dg.AssetDep("closed_book_generations", partition_mapping=parts.dataset_generator_to_setting_generator()),
        dg.AssetDep("setting_queries", partition_mapping=dg.MultiToSingleDimensionPartitionMapping("setting")),
        *parts.model_dependencies("nli"),
    ]

    @dg.multi_asset(
        name="entailment_clusters", partitions_def=parts.setting_generator, **MODEL_STEP,
        specs=step_tables(
            deps, {"pytorch", "parquet"},
            entailment_clusters="The semantic cluster (bidirectional entailment) of every sample.",
            nli_probabilities="NLI probabilities of every distinct (premise, hypothesis) pair SePer judges.",
        ),
    )
    def entailment_clusters(context: dg.AssetExecutionContext, store: ArtifactStore, models: ModelRegistry):
        setting = Setting.parse(dimension(context, "setting"))
        queries = store.read_table("setting_queries", setting.key)
        samples = all_generations(store, context, setting)
        nli_model = models.entailment(experiment.nli)
        start = time.perf_counter()
        nli = compute_nli(samples, queries, nli_model)
        clusters = cluster_table(samples, queries, nli)
        seconds = time.perf_counter() - start
        path = store.write_table("nli_probabilities", context.partition_key, nli)
        yield dg.MaterializeResult(asset_key="nli_probabilities", metadata={
            **table_metadata(nli, path), "nli_identity": dg.MetadataValue.text(nli_model.identity),
            "nli_dtype": dg.MetadataValue.text(str(nli_model.dtype).removeprefix("torch.")),
        })
        path = store.write_table("entailment_clusters", context.partition_key, clusters)
        per_group = clusters.group_by("query_id", "condition", "doc_id").agg(pl.col("cluster_id").max() + 1)
        yield dg.MaterializeResult(asset_key="entailment_clusters", metadata={
            **table_metadata(clusters, path),
            "nli_pairs": dg.MetadataValue.int(nli.height),
            "nli_pairs_without_dedup": dg.MetadataValue.int(
                int(sum(n * (n - 1) + 2 * n for n in clusters.group_by("query_id", "condition", "doc_id").len()["len"]))
            ),
            "nli_seconds": dg.MetadataValue.float(seconds),
            "mean_clusters_per_prompt": dg.MetadataValue.float(float(per_group["cluster_id"].mean())),
            "nli_identity": dg.MetadataValue.text(nli_model.identity),
        })

    return entailment_clusters
