"""``passage_embeddings[dense index × shard]``: the passage vectors of a dense index, embedded in
``embedding_shards`` contiguous row ranges — one partition, one step, one GPU each — all written
into one ``.npy`` pre-allocated at the corpus's size, from which the index step builds FAISS
(retrieval/embedding_shards.py). The file is in the store's scratch directory
(``$RAGUTIL_SCRATCH_DIR``, default ``$RAGUTIL_HOME/scratch``), on a POSIX file system: a memory
map cannot live on an object store. Where step processes do not share it (an artifact store URL
and no ``$RAGUTIL_SCRATCH_DIR``: Celery workers with homes of their own), each shard also
publishes its rows to the store, and the index step copies them into its own file.

Partition keys are static, ``<index key>__shard-<i>-of-<n>`` (``world__e5__shard-2-of-8``), rather
than a Dagster multi-partition of index × shard: a multi-partition is the full cross product of
its dimensions, and the number of shards differs between retrievers. With ``embedding_shards: 1``
an index has one shard: every dense index is built through this asset."""

import time

import dagster as dg

from ragutil_dagster.assets.common import GROUP, MODEL_STEP
from ragutil_dagster.assets.partitions import Partitions
from ragutil_dagster.config import (
    RetrieverConfig,
    parse_embedding_partition_key,
    parse_index_partition_key,
)
from ragutil_dagster.resources.models import ModelLoader
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.retrieval.dense import DenseConfig, FaissIndexSpec
from ragutil_dagster.retrieval.embedding_shards import ShardedEmbeddings
from ragutil_dagster.tables import CORPUS_RECORD

ASSET = "passage_embeddings"
SHARD_EXPORT = "shard"
"""A shard's rows and record, published for index steps that do not share the scratch directory."""


def dense_config(retriever: RetrieverConfig) -> DenseConfig:
    """How a dense retriever of the config embeds passages and indexes them."""
    return DenseConfig(index=FaissIndexSpec(kind=retriever.index), gpus=retriever.gpus)


def sharded_embeddings(
    store: ArtifactStore,
    retriever: RetrieverConfig,
    index_key: str,
    corpus_record: dict,
    encoder_identity: str,
) -> ShardedEmbeddings:
    """The embeddings of index ``index_key``'s corpus (its record, as the corpus asset wrote it) by
    the encoder of that identity, in the retriever's number of shards: where the shard steps write
    and the index step reads."""
    return ShardedEmbeddings.under(
        store.scratch_directory(ASSET, index_key),
        index_key,
        str(corpus_record["fingerprint"]),
        int(corpus_record["rows"]),
        encoder_identity,
        dense_config(retriever),
        retriever.embedding_shards,
    )


def gather_shards(store: ArtifactStore, embeddings: ShardedEmbeddings) -> None:
    """Without a shared scratch directory, copy into this process's file the shards other
    processes embedded and published (:data:`SHARD_EXPORT`); those missing or embedded for other
    inputs are left for ``embeddings.open`` to report."""
    if store.scratch_is_shared:
        return
    for shard in range(1, embeddings.shards + 1):
        if embeddings.is_recorded(shard):
            continue
        try:
            exported = store.local_files(ASSET, embeddings.shard_name(shard), SHARD_EXPORT)
        except FileNotFoundError:
            continue
        embeddings.import_shard(shard, exported)


def build(parts: Partitions) -> list[dg.AssetsDefinition]:
    """The asset, or none when the config has no dense retriever."""
    if parts.embedding is None:
        return []
    experiment = parts.experiment

    @dg.asset(
        name=ASSET,
        partitions_def=parts.embedding,
        group_name=GROUP,
        kinds={"numpy"},
        **MODEL_STEP,
        deps=[
            dg.AssetDep("corpus", partition_mapping=parts.dataset_to_embedding()),
            *parts.model_dependencies("embedder", per_embedding_shard=True),
        ],
        description="Passage vectors of one row range of a dense index's corpus, written into the "
        "index's one pre-allocated .npy on the scratch file system.",
    )
    def passage_embeddings(
        context: dg.AssetExecutionContext, store: ArtifactStore, models: ModelLoader
    ) -> dg.MaterializeResult:
        index_key, shard, _ = parse_embedding_partition_key(context.partition_key)
        dataset, name = parse_index_partition_key(index_key)
        retriever = experiment.retriever(name)
        record = store.read_json("corpus", dataset, CORPUS_RECORD)
        embedder = models.embedder(retriever.model, retriever.revision)
        embeddings = sharded_embeddings(store, retriever, index_key, record, embedder.identity)
        start = time.perf_counter()
        passages = store.read_table("corpus", dataset, rows=embeddings.rows_of(shard))
        rows = embeddings.fill(shard, passages, embedder, dense_config(retriever))
        if not store.scratch_is_shared:  # the index step may run where this file is not
            with store.write_files(ASSET, context.partition_key, SHARD_EXPORT) as directory:
                embeddings.export_shard(shard, directory)
        seconds = time.perf_counter() - start
        return dg.MaterializeResult(
            metadata={
                "rows": dg.MetadataValue.int(len(rows)),
                "row_range": dg.MetadataValue.text(
                    f"[{rows.start}, {rows.stop}) of {embeddings.rows}"
                ),
                "seconds": dg.MetadataValue.float(seconds),
                "passages_per_second": dg.MetadataValue.float(
                    len(rows) / seconds if seconds else 0.0
                ),
                "path": dg.MetadataValue.path(str(embeddings.path)),
                "corpus_fingerprint": dg.MetadataValue.text(embeddings.fingerprint),
                "embedder_identity": dg.MetadataValue.text(embedder.identity),
                "dim": dg.MetadataValue.int(embedder.dim),
            }
        )

    return [passage_embeddings]
