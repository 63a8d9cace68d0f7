"""``corpus[dataset]``: the validated passage table every index is built from."""


import dagster as dg

from ragutil_dagster.assets.common import GROUP, table_metadata
from ragutil_dagster.assets.partitions import Partitions
from ragutil_dagster.data.corpus import corpus_fingerprint
from ragutil_dagster.data.qa import load_dataset
from ragutil_dagster.resources.storage import ArtifactStore


def build(parts: Partitions) -> dg.AssetsDefinition:
    experiment = parts.experiment

    @dg.asset(
        name="corpus", partitions_def=parts.dataset, group_name=GROUP, kinds={"polars", "parquet"},
        description="Passages (id, title, text) of the dataset's retrieval corpus.",
    )
    def corpus(context: dg.AssetExecutionContext, store: ArtifactStore) -> dg.MaterializeResult:
        passages = load_dataset(experiment.dataset(context.partition_key)).corpus
        path = store.write_table("corpus", context.partition_key, passages)
        metadata = table_metadata(passages, path)
        metadata["fingerprint"] = dg.MetadataValue.text(corpus_fingerprint(passages))
        return dg.MaterializeResult(metadata=metadata)

    return corpus
