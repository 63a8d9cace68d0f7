"""``queries[dataset]`` and ``corpus[dataset]``: one step reads the dataset once and writes both —
the questions with their gold answers, qrels and ground-truth utility, and the validated passage
table every index is built from (its content fingerprint is the corpus's data version)."""

import dagster as dg

from ragutil_dagster.assets.common import GROUP, table_metadata
from ragutil_dagster.assets.partitions import Partitions
from ragutil_dagster.data.corpus import corpus_record
from ragutil_dagster.data.qa import load_dataset
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.tables import CORPUS_RECORD, QRELS, UTILITY


def build(parts: Partitions) -> dg.AssetsDefinition:
    experiment = parts.experiment

    @dg.multi_asset(
        name="dataset",
        partitions_def=parts.dataset,
        specs=[
            dg.AssetSpec(
                "queries",
                group_name=GROUP,
                kinds={"polars", "parquet"},
                description="Questions with gold answers, qrels and (when known) ground-truth passage utility.",
            ),
            dg.AssetSpec(
                "corpus",
                group_name=GROUP,
                kinds={"polars", "parquet"},
                description="Passages (id, title, text) of the dataset's retrieval corpus.",
            ),
        ],
    )
    def dataset(context: dg.AssetExecutionContext, store: ArtifactStore):
        key = context.partition_key
        loaded = load_dataset(experiment.dataset(key))
        path = store.write_table("queries", key, loaded.queries)
        store.write_table("queries", key, loaded.qrels, QRELS)
        if loaded.utility is not None:
            store.write_table("queries", key, loaded.utility, UTILITY)
        metadata = table_metadata(loaded.queries, path)
        metadata["qrels"] = dg.MetadataValue.int(loaded.qrels.height)
        metadata["ground_truth_utility"] = dg.MetadataValue.bool(loaded.utility is not None)
        yield dg.MaterializeResult(asset_key="queries", metadata=metadata)
        record = corpus_record(loaded.corpus)
        fingerprint = str(record["fingerprint"])
        path = store.write_table("corpus", key, loaded.corpus)
        store.write_json("corpus", key, CORPUS_RECORD, record)
        metadata = table_metadata(loaded.corpus, path)
        metadata["fingerprint"] = dg.MetadataValue.text(fingerprint)
        yield dg.MaterializeResult(
            asset_key="corpus", metadata=metadata, data_version=dg.DataVersion(fingerprint)
        )

    return dataset
