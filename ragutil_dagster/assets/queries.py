"""``queries[dataset]``: the questions with their gold answers, qrels and ground-truth utility."""


import dagster as dg

from ragutil_dagster.assets.common import GROUP, table_metadata
from ragutil_dagster.assets.partitions import Partitions
from ragutil_dagster.data.qa import load_dataset
from ragutil_dagster.resources.storage import ArtifactStore


def build(parts: Partitions) -> dg.AssetsDefinition:
    experiment = parts.experiment

    @dg.asset(
        name="queries", partitions_def=parts.dataset, group_name=GROUP, kinds={"polars", "parquet"},
        description="Questions with gold answers, qrels and (when known) ground-truth passage utility.",
    )
    def queries(context: dg.AssetExecutionContext, store: ArtifactStore) -> dg.MaterializeResult:
        dataset = load_dataset(experiment.dataset(context.partition_key))
        path = store.write_table("queries", context.partition_key, dataset.queries)
        store.write_table("queries", context.partition_key, dataset.qrels, "qrels")
        if dataset.utility is not None:
            store.write_table("queries", context.partition_key, dataset.utility, "utility")
        metadata = table_metadata(dataset.queries, path)
        metadata["qrels"] = dg.MetadataValue.int(dataset.qrels.height)
        metadata["ground_truth_utility"] = dg.MetadataValue.bool(dataset.utility is not None)
        return dg.MaterializeResult(metadata=metadata)

    return queries
