"""``entailment_clusters[setting × generator]`` and ``nli_probabilities``: NLI over every distinct
pair SePer needs — closed book and context samples, both directions, against the gold answers —
and the semantic cluster of every sample. The NLI model runs here only; ``metric_scores`` reads
the stored probabilities."""

import time

import dagster as dg
import polars as pl

from ragutil_dagster.assets.common import MODEL_STEP, step_tables, table_metadata
from ragutil_dagster.assets.partitions import Partitions
from ragutil_dagster.evaluation import chain
from ragutil_dagster.evaluation.groups import cluster_table
from ragutil_dagster.evaluation.prompt_sampling import sampling_mismatch
from ragutil_dagster.resources.models import ModelLoader
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.tracking.partition_run import NLI_DTYPE, NLI_IDENTITY


def all_generations(store: ArtifactStore, parts: Partitions, partition: str) -> pl.DataFrame:
    """Closed-book and context samples of setting × generator ``partition``, as one table. Both
    must come from the same model and sampling settings: after a model or config change, scoring
    waits for both to be re-sampled."""
    closed = store.read_table("closed_book_generations", parts.closed_book_partition(partition))
    with_context = store.read_table("generations", partition)
    mismatch = sampling_mismatch(closed, with_context)
    if mismatch is not None:
        raise RuntimeError(
            f"{partition}: closed-book and context samples were drawn differently ({mismatch}); "
            f"materialise closed_book_generations and generations for this generator first"
        )
    return pl.concat([closed, with_context])


def build(parts: Partitions) -> dg.AssetsDefinition:
    experiment = parts.experiment

    deps = [
        "generations",
        dg.AssetDep(
            "closed_book_generations",
            partition_mapping=parts.dataset_generator_to_setting_generator(),
        ),
        dg.AssetDep(
            "setting_queries",
            partition_mapping=dg.MultiToSingleDimensionPartitionMapping("setting"),
        ),
        *parts.model_dependencies("nli"),
    ]

    @dg.multi_asset(
        name="entailment_clusters",
        partitions_def=parts.setting_generator,
        **MODEL_STEP,
        specs=step_tables(
            deps,
            {"pytorch", "parquet"},
            entailment_clusters="The semantic cluster (bidirectional entailment) of every sample.",
            nli_probabilities="NLI probabilities of every distinct (premise, hypothesis) pair SePer judges.",
        ),
    )
    def entailment_clusters(
        context: dg.AssetExecutionContext, store: ArtifactStore, models: ModelLoader
    ):
        queries = store.read_table("setting_queries", parts.setting_of(context).key)
        samples = all_generations(store, parts, context.partition_key)
        nli_model = models.entailment(experiment.nli)
        start = time.perf_counter()
        judged_before = (
            nli_model.stats.computed,
            nli_model.stats.cache_hits,
            nli_model.stats.content_rejected,
        )
        nli = chain.nli(samples, queries, nli_model)
        clusters = cluster_table(samples, queries, nli)
        seconds = time.perf_counter() - start
        path = store.write_table("nli_probabilities", context.partition_key, nli)
        yield dg.MaterializeResult(
            asset_key="nli_probabilities",
            metadata={
                **table_metadata(nli, path),
                NLI_IDENTITY: dg.MetadataValue.text(nli_model.identity),
                NLI_DTYPE: dg.MetadataValue.text(str(nli_model.dtype).removeprefix("torch.")),
            },
        )
        path = store.write_table("entailment_clusters", context.partition_key, clusters)
        per_group = clusters.group_by("query_id", "condition", "doc_id").agg(
            pl.col("cluster_id").max() + 1
        )
        yield dg.MaterializeResult(
            asset_key="entailment_clusters",
            metadata={
                **table_metadata(clusters, path),
                "nli_pairs": dg.MetadataValue.int(nli.height),
                "nli_pairs_without_dedup": dg.MetadataValue.int(
                    int(
                        sum(
                            n * (n - 1) + 2 * n
                            for n in clusters.group_by("query_id", "condition", "doc_id").len()[
                                "len"
                            ]
                        )
                    )
                ),
                # Pairs the model ran here; the others were judged before, for another setting or
                # generator (closed-book samples recur in every setting) or in an earlier run.
                "nli_pairs_computed": dg.MetadataValue.int(
                    nli_model.stats.computed - judged_before[0]
                ),
                "nli_pairs_from_cache": dg.MetadataValue.int(
                    nli_model.stats.cache_hits - judged_before[1]
                ),
                # Pairs ragutil's content check decided without the model (nli.answer_check: content).
                "nli_pairs_content_rejected": dg.MetadataValue.int(
                    nli_model.stats.content_rejected - judged_before[2]
                ),
                "nli_seconds": dg.MetadataValue.float(seconds),
                "mean_clusters_per_prompt": dg.MetadataValue.float(
                    float(per_group["cluster_id"].mean())
                ),
                NLI_IDENTITY: dg.MetadataValue.text(nli_model.identity),
            },
        )

    return entailment_clusters
