"""``index[dataset × retriever]``: a BM25 (bm25s) or dense (FAISS) index over the corpus (a hybrid
retriever has none of its own: it searches the indexes of the retrievers it fuses)."""


import time

import dagster as dg

from ragutil_dagster.assets.common import GPU_POOL, GROUP, check_result
from ragutil_dagster.assets.partitions import Partitions
from ragutil_dagster.config import ExperimentConfig, RetrieverConfig, Setting, parse_index_partition_key
from ragutil_dagster.resources.models import ModelRegistry
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.retrieval.bm25 import BM25Retriever
from ragutil_dagster.retrieval.dense import DenseConfig, DenseRetriever, FaissIndexSpec
from ragutil_dagster.retrieval.fusion import HybridSearcher, Searcher


def split_index_key(experiment: ExperimentConfig, key: str) -> tuple[str, RetrieverConfig]:
    dataset, retriever = parse_index_partition_key(key)
    return dataset, experiment.retriever(retriever)


def load_index(store: ArtifactStore, models: ModelRegistry, retriever: RetrieverConfig, key: str):
    """Load a saved index, checked against the corpus and (dense) the embedder it was built with."""
    dataset, _ = parse_index_partition_key(key)
    corpus = store.read_table("corpus", dataset)
    directory = store.directory("index", key)
    if retriever.kind == "bm25":
        return BM25Retriever.load(directory, corpus)
    return DenseRetriever.load(directory, models.embedder(retriever.model, retriever.revision), corpus)


def load_searcher(store: ArtifactStore, models: ModelRegistry, experiment: ExperimentConfig, setting: Setting) -> Searcher:
    """What ``setting``'s retriever searches with: its index, or a hybrid's fusion of the indexes
    of the retrievers it fuses."""
    indexes = [
        load_index(store, models, split_index_key(experiment, key)[1], key) for key in experiment.searched_indexes(setting)
    ]
    retriever = experiment.retriever(setting.retriever)
    if retriever.kind != "hybrid":
        return indexes[0]
    return HybridSearcher(indexes, rrf_k=retriever.rrf_k, depth=retriever.depth)


def build(parts: Partitions) -> dg.AssetsDefinition:
    experiment = parts.experiment

    @dg.asset(
        name="index", partitions_def=parts.index, group_name=GROUP, kinds={"faiss", "bm25s"}, pool=GPU_POOL,
        deps=[
            dg.AssetDep("corpus", partition_mapping=parts.dataset_to_index()),
            *parts.model_dependencies("embedder"),
        ],
        check_specs=[dg.AssetCheckSpec("index_size_equals_corpus_size", asset="index")],
        description="Retrieval index (bm25s, or sentence-transformers + FAISS) with a manifest "
        "recording model identity and corpus fingerprint.",
    )
    def index(context: dg.AssetExecutionContext, store: ArtifactStore, models: ModelRegistry) -> dg.MaterializeResult:
        dataset, retriever = split_index_key(experiment, context.partition_key)
        corpus = store.read_table("corpus", dataset)
        directory = store.directory("index", context.partition_key)
        start = time.perf_counter()
        metadata: dict[str, dg.MetadataValue] = {}
        if retriever.kind == "bm25":
            built = BM25Retriever.build(corpus)
        else:
            embedder = models.embedder(retriever.model, retriever.revision)
            config = DenseConfig(index=FaissIndexSpec(kind=retriever.index))
            built = DenseRetriever.build(corpus, embedder, config)
            metadata["embedder_identity"] = dg.MetadataValue.text(embedder.identity)
            metadata["dim"] = dg.MetadataValue.int(built.dim)
        built.save(directory)
        metadata.update({
            "passages": dg.MetadataValue.int(len(built)),
            "corpus_passages": dg.MetadataValue.int(corpus.height),
            "build_seconds": dg.MetadataValue.float(time.perf_counter() - start),
            "path": dg.MetadataValue.path(str(directory)),
        })
        size_check = check_result(
            "index_size_equals_corpus_size", len(built) == corpus.height, index=len(built), corpus=corpus.height
        )
        return dg.MaterializeResult(metadata=metadata, check_results=[size_check])

    return index
