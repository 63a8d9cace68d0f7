"""``closed_book_generations[dataset × generator]``: N samples per question without context.

Sampled once per dataset and generator, never per retriever setting: every setting's ΔSePer
subtracts the same closed-book SePer.
"""

import dagster as dg

from ragutil_dagster.assets.common import GROUP, MODEL_STEP
from ragutil_dagster.assets.generations import (
    SAMPLE_COUNT_CHECK,
    partition_sampler,
    sample_and_store,
    sampling_model_dependencies,
)
from ragutil_dagster.assets.partitions import Partitions, dimension
from ragutil_dagster.evaluation import chain
from ragutil_dagster.resources.models import ModelLoader
from ragutil_dagster.resources.storage import ArtifactStore


def build(parts: Partitions) -> dg.AssetsDefinition:
    experiment = parts.experiment

    @dg.asset(
        name="closed_book_generations",
        partitions_def=parts.dataset_generator,
        group_name=GROUP,
        kinds={"pytorch", "parquet"},
        **MODEL_STEP,
        deps=[
            dg.AssetDep(
                "queries", partition_mapping=dg.MultiToSingleDimensionPartitionMapping("dataset")
            ),
            *sampling_model_dependencies(parts),
        ],
        check_specs=[dg.AssetCheckSpec(SAMPLE_COUNT_CHECK, asset="closed_book_generations")],
        description="N sampled answers per question without retrieval, with token log-probs.",
    )
    def closed_book_generations(
        context: dg.AssetExecutionContext, store: ArtifactStore, models: ModelLoader
    ) -> dg.MaterializeResult:
        dataset = dimension(context, "dataset")
        queries = store.read_table("queries", dataset)
        sampler = partition_sampler(context, models, experiment)
        _, result = sample_and_store(
            context,
            store,
            models,
            experiment,
            sampler,
            chain.closed_book(sampler, queries),
            queries,
            "closed_book_generations",
            dataset,
        )
        return result

    return closed_book_generations
