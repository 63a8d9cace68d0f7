"""``validity_passages[dataset]``: the passages of the validity experiments — every judged query's
positives and negatives (``annotated``: the qrels' own, where the query has them; else sampled,
``random`` and ``hard``: from the ranking of the dataset's BM25 index; with
``validity.ground_truth_negatives`` the passages its ground-truth utility judges are annotated too),
evaluation/validity.py. Only with a ``validity`` section in the config; the retrieval
step copies it into each setting's ``setting_queries`` and ``retrieved_passages``."""

import dagster as dg
import polars as pl

from ragutil_dagster.assets.common import GROUP, table_metadata
from ragutil_dagster.assets.index import load_index
from ragutil_dagster.assets.partitions import Partitions
from ragutil_dagster.config import index_partition_key
from ragutil_dagster.evaluation.validity import (
    HARD_NEGATIVE_DEPTH,
    negative_kinds,
    negative_shortfall,
    validity_passages,
    with_ground_truth_negatives,
)
from ragutil_dagster.resources.models import ModelLoader
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.tables import QRELS, UTILITY

ASSET = "validity_passages"


def build(parts: Partitions) -> list[dg.AssetsDefinition]:
    experiment = parts.experiment
    config = experiment.validity
    if config is None:
        return []
    hard = experiment.hard_negative_retriever()
    deps = [
        "queries",
        "corpus",
        *(
            [dg.AssetDep("index", partition_mapping=parts.hard_negative_index_to_dataset())]
            if hard
            else []
        ),
    ]

    @dg.asset(
        name=ASSET,
        partitions_def=parts.dataset,
        group_name=GROUP,
        kinds={"polars", "parquet"},
        deps=deps,
        description="Validity experiments: every judged query's positives (label 1) and negatives "
        "(label 0: the qrels' annotated negatives where the query has them, as SePer Table 2; else "
        "random passages of other documents, best-ranked unjudged BM25 passages), none of the "
        "negatives holding a gold answer.",
    )
    def validity_passages_asset(
        context: dg.AssetExecutionContext, store: ArtifactStore, models: ModelLoader
    ) -> dg.MaterializeResult:
        dataset = context.partition_key
        queries = store.read_table("queries", dataset)
        corpus = store.read_table("corpus", dataset)
        hard_run = None
        if hard is not None:
            index = load_index(store, models, hard, index_partition_key(dataset, hard.name))
            query_table = queries.select(
                pl.col("query_id").alias("id"), pl.col("question").alias("text")
            )
            hard_run = index.search(
                query_table, k=min(HARD_NEGATIVE_DEPTH, corpus.height), name=hard.name
            )
        qrels = store.read_table("queries", dataset, QRELS)
        if config.ground_truth_negatives and store.has_table("queries", dataset, UTILITY):
            qrels = with_ground_truth_negatives(
                qrels, store.read_table("queries", dataset, UTILITY)
            )
        passages = validity_passages(dataset, queries, qrels, corpus, config, hard_run)
        kinds = negative_kinds(qrels, config)
        path = store.write_table(ASSET, dataset, passages)
        kinds = dict(passages.group_by("kind").len().iter_rows())
        metadata = table_metadata(passages, path)
        metadata.update(
            {
                "judged_queries": dg.MetadataValue.int(passages["query_id"].n_unique()),
                "negative_kinds": dg.MetadataValue.text(
                    " + ".join(k for k in kinds if k in set(passages["kind"]))
                ),
                **{
                    f"passages/{kind}": dg.MetadataValue.int(count)
                    for kind, count in sorted(kinds.items())
                },
                **{
                    f"queries_short_of_{kind}_negatives": dg.MetadataValue.int(count)
                    for kind, count in negative_shortfall(passages, config, kinds).items()
                },
            }
        )
        return dg.MaterializeResult(metadata=metadata)

    return [validity_passages_asset]
