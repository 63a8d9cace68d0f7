"""``retrieval_run[setting]``: top-k passages per query (reranked when configured), with the
standard IR measures against qrels and answer recall@k in the metadata."""


import time

import dagster as dg
import polars as pl

from ragutil_dagster.assets.common import GPU_POOL, GROUP, table_metadata
from ragutil_dagster.assets.index import load_index
from ragutil_dagster.assets.partitions import Partitions
from ragutil_dagster.config import Setting
from ragutil_dagster.errors import ConfigError
from ragutil_dagster.resources.models import ModelRegistry
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.retrieval.rerank import rerank
from ragutil_dagster.retrieval.runs import answer_recall, evaluate_run, write_trec
from ragutil_dagster.tables import QRELS, markdown_table


def build(parts: Partitions) -> dg.AssetsDefinition:
    experiment = parts.experiment

    @dg.asset(
        name="retrieval_run", partitions_def=parts.setting, group_name=GROUP, kinds={"polars", "parquet"},
        pool=GPU_POOL,
        deps=[
            dg.AssetDep("index", partition_mapping=parts.index_to_setting()),
            dg.AssetDep("queries", partition_mapping=parts.dataset_to_setting()),
            *parts.model_dependencies("reranker"),
        ],
        description="Ranked passages per query (query_id, rank, doc_id, score, retriever) and a TREC run file.",
    )
    def retrieval_run(context: dg.AssetExecutionContext, store: ArtifactStore, models: ModelRegistry) -> dg.MaterializeResult:
        setting = Setting.parse(context.partition_key)
        retriever = experiment.retriever(setting.retriever)
        queries = store.read_table("queries", setting.dataset)
        qrels = store.read_table("queries", setting.dataset, QRELS)
        corpus = store.read_table("corpus", setting.dataset)
        if setting.k > corpus.height:
            raise ConfigError(
                f"k: {setting.k} exceeds the {corpus.height} passages of dataset {setting.dataset!r}; "
                f"list only k values up to the corpus size"
            )
        searcher = load_index(store, models, retriever, setting.index_key)
        query_table = queries.select(pl.col("query_id").alias("id"), pl.col("question").alias("text"))
        reranker = experiment.reranker
        depth = min(reranker.candidates, corpus.height) if reranker else setting.k
        start = time.perf_counter()
        run = searcher.search(query_table, k=depth, name=retriever.name)
        if reranker:
            model = models.reranker(reranker.model, reranker.revision)
            run = rerank(run, query_table, corpus, model, top_n=depth, k=setting.k, name=f"{retriever.name}+{reranker.name}")
        seconds = time.perf_counter() - start
        run = run.filter(pl.col("rank") <= setting.k)
        path = store.write_table("retrieval_run", context.partition_key, run)
        write_trec(run, store.directory("retrieval_run", context.partition_key) / "run.trec", tag=context.partition_key)
        k = setting.k
        _, ir = evaluate_run(run, qrels, [f"recall_{k}", f"ndcg_cut_{k}", "recip_rank", "map"])
        golds = dict(queries.select("query_id", "answers").iter_rows())
        recall = answer_recall(run, corpus, golds, ks=[k])
        headline = {**ir.drop("retriever").row(0, named=True), f"answer_recall_{k}": recall["answer_recall"][0]}
        metadata = table_metadata(run, path)
        metadata.update({name: dg.MetadataValue.float(float(v)) for name, v in headline.items()})
        metadata["search_seconds"] = dg.MetadataValue.float(seconds)
        metadata["ir_measures"] = dg.MetadataValue.md(markdown_table([headline]))
        return dg.MaterializeResult(metadata=metadata)

    return retrieval_run
