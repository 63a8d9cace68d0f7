"""``index[dataset × retriever]``: a BM25 (bm25s) or dense (FAISS) index over the corpus (a hybrid
retriever has none of its own: it searches the indexes of the retrievers it fuses). A dense index
is built from the passage vectors its ``passage_embeddings`` shards wrote, once all are there.

The corpus fingerprint is computed once, when the corpus asset is materialised (its data version
and its ``corpus_record``); building and loading an index read it from that record instead of
hashing every passage again."""

import time

import dagster as dg

from ragutil_dagster.assets.common import GROUP, MODEL_STEP, check_result
from ragutil_dagster.assets.partitions import Partitions
from ragutil_dagster.assets.passage_embeddings import ASSET as PASSAGE_EMBEDDINGS
from ragutil_dagster.assets.passage_embeddings import (
    dense_config,
    gather_shards,
    sharded_embeddings,
)
from ragutil_dagster.config import (
    ExperimentConfig,
    RetrieverConfig,
    Setting,
    parse_index_partition_key,
)
from ragutil_dagster.resources.models import ModelLoader
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.retrieval.bm25 import BM25Retriever
from ragutil_dagster.retrieval.dense import DenseRetriever
from ragutil_dagster.retrieval.fusion import HybridSearcher, Searcher
from ragutil_dagster.tables import CORPUS_RECORD


def split_index_key(experiment: ExperimentConfig, key: str) -> tuple[str, RetrieverConfig]:
    dataset, retriever = parse_index_partition_key(key)
    return dataset, experiment.retriever(retriever)


def load_index(store: ArtifactStore, models: ModelLoader, retriever: RetrieverConfig, key: str):
    """Load a saved index, checked against the corpus record and (dense) the embedder it was built
    with, placed on the GPUs as the retriever's ``gpus`` says."""
    dataset, _ = parse_index_partition_key(key)
    record = store.read_json("corpus", dataset, CORPUS_RECORD)
    directory = store.local_files("index", key, "index")
    if retriever.kind == "bm25":
        return BM25Retriever.load(directory, record)
    embedder = models.embedder(retriever.model, retriever.revision)
    return DenseRetriever.load(directory, embedder, record, gpus=retriever.gpus)


def load_searcher(
    store: ArtifactStore, models: ModelLoader, experiment: ExperimentConfig, setting: Setting
) -> Searcher:
    """What ``setting``'s retriever searches with: its index, or a hybrid's fusion of the indexes
    of the retrievers it fuses."""
    indexes = [
        load_index(store, models, split_index_key(experiment, key)[1], key)
        for key in experiment.searched_indexes(setting)
    ]
    retriever = experiment.retriever(setting.retriever)
    if retriever.kind != "hybrid":
        return indexes[0]
    return HybridSearcher(indexes, rrf_k=retriever.rrf_k, depth=retriever.depth)


def build(parts: Partitions) -> dg.AssetsDefinition:
    experiment = parts.experiment

    @dg.asset(
        name="index",
        partitions_def=parts.index,
        group_name=GROUP,
        kinds={"faiss", "bm25s"},
        **MODEL_STEP,
        deps=[
            dg.AssetDep("corpus", partition_mapping=parts.dataset_to_index()),
            *(
                [dg.AssetDep(PASSAGE_EMBEDDINGS, partition_mapping=parts.embedding_to_index())]
                if parts.embedding
                else []
            ),
            *parts.model_dependencies("embedder"),
        ],
        check_specs=[dg.AssetCheckSpec("index_size_equals_corpus_size", asset="index")],
        description="Retrieval index (bm25s, or FAISS over the passage embeddings) with a manifest "
        "recording model identity and corpus fingerprint.",
    )
    def index(
        context: dg.AssetExecutionContext, store: ArtifactStore, models: ModelLoader
    ) -> dg.MaterializeResult:
        dataset, retriever = split_index_key(experiment, context.partition_key)
        corpus = store.read_table("corpus", dataset)
        record = store.read_json("corpus", dataset, CORPUS_RECORD)
        fingerprint = str(record["fingerprint"])
        start = time.perf_counter()
        metadata: dict[str, dg.MetadataValue] = {
            "corpus_fingerprint": dg.MetadataValue.text(fingerprint)
        }
        if retriever.kind == "bm25":
            built = BM25Retriever.build(corpus, fingerprint=fingerprint)
        else:
            # The identity names the embeddings to build from; the model itself is not loaded.
            identity = models.identity(retriever.model, retriever.revision)
            embeddings = sharded_embeddings(
                store, retriever, context.partition_key, record, identity
            )
            gather_shards(store, embeddings)
            built = DenseRetriever.from_embeddings(
                corpus["id"], embeddings.open(), identity, fingerprint, dense_config(retriever)
            )
            metadata["embedder_identity"] = dg.MetadataValue.text(identity)
            metadata["dim"] = dg.MetadataValue.int(built.dim)
            metadata["embeddings_path"] = dg.MetadataValue.path(str(embeddings.path))
            metadata["embedding_shards"] = dg.MetadataValue.int(embeddings.shards)
        with store.write_files("index", context.partition_key, "index") as directory:
            built.save(directory)
        metadata.update(
            {
                "passages": dg.MetadataValue.int(len(built)),
                "corpus_passages": dg.MetadataValue.int(corpus.height),
                "build_seconds": dg.MetadataValue.float(time.perf_counter() - start),
                "path": dg.MetadataValue.path(
                    store.location("index", context.partition_key, "index")
                ),
            }
        )
        size_check = check_result(
            "index_size_equals_corpus_size",
            len(built) == corpus.height,
            index=len(built),
            corpus=corpus.height,
        )
        return dg.MaterializeResult(metadata=metadata, check_results=[size_check])

    return index
