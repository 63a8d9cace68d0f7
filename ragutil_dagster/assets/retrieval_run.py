"""``retrieval_run[setting]``: top-k passages per query (reranked when configured), with the
standard IR measures against qrels, answer recall@k and MIRAGE's retriever metrics (Table 2) in
the metadata; ``utility_candidates[setting]``: the top ``utility.candidates`` of the same ranking,
the passages LLM-specific utility judges whatever k.

The same step writes the setting's evaluation inputs, ``setting_queries`` (questions, gold
answers, qrels, ground-truth utility) and ``retrieved_passages`` (the text of every passage a
prompt of the setting can show: the top k, the utility candidates, the positives and any validity
passages), so every step downstream reads only its declared parents — Dagster maps a setting ×
generator partition onto its setting, not onto its dataset — and no generation step loads a
Wikipedia-scale corpus for a few thousand passages.

A multi-step round's setting (``…__step-<t>``) gathers its run over rounds 1..t here
(evaluation/multistep.py): the query writer is loaded in this step, and the queries each round
searched are its side table ``multistep_queries``."""

import time

import dagster as dg
import polars as pl

from ragutil_dagster.assets.common import MODEL_STEP, step_tables, table_metadata
from ragutil_dagster.assets.index import load_searcher
from ragutil_dagster.assets.partitions import Partitions
from ragutil_dagster.assets.run_files import RUN_FILE, observed_run_file
from ragutil_dagster.config import Setting
from ragutil_dagster.data.run_files import NAMED_MISSING_QUERIES, read_external_run
from ragutil_dagster.errors import ConfigError
from ragutil_dagster.evaluation.conditions import PromptBudget
from ragutil_dagster.evaluation.multistep import Ranked, run_rounds
from ragutil_dagster.evaluation.summary import retriever_summary
from ragutil_dagster.resources.models import ModelLoader
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.retrieval.dense import DenseRetriever
from ragutil_dagster.retrieval.rerank import rerank
from ragutil_dagster.retrieval.runs import (
    answer_recall,
    evaluate_run,
    mirage_retrieval,
    top_k,
    write_trec,
)
from ragutil_dagster.tables import (
    CORPUS_RECORD,
    MULTISTEP_QUERIES,
    QRELS,
    RETRIEVER_SUMMARY,
    UTILITY,
    VALIDITY_PASSAGES,
    markdown_table,
)
from ragutil_dagster.tracking.partition_run import (
    EMBEDDER_IDENTITY,
    QUERY_WRITER_IDENTITY,
    RERANKER_IDENTITY,
    RUN_FILE_VERSION,
)


def write_setting_queries(
    store: ArtifactStore,
    partition: str,
    dataset: str,
    queries: pl.DataFrame,
    qrels: pl.DataFrame,
    validity: pl.DataFrame | None = None,
) -> dg.MaterializeResult:
    """The dataset's queries, qrels, ground-truth utility, corpus record and (with a validity
    section) validity passages as the setting's own."""
    path = store.write_table("setting_queries", partition, queries)
    store.write_table("setting_queries", partition, qrels, QRELS)
    store.write_json(
        "setting_queries",
        partition,
        CORPUS_RECORD,
        store.read_json("corpus", dataset, CORPUS_RECORD),
    )
    has_utility = store.has_table("queries", dataset, UTILITY)
    if has_utility:
        store.write_table(
            "setting_queries", partition, store.read_table("queries", dataset, UTILITY), UTILITY
        )
    else:  # a dataset that lost its ground truth must not keep an earlier version's
        store.delete_table("setting_queries", partition, UTILITY)
    if validity is not None:
        store.write_table("setting_queries", partition, validity, VALIDITY_PASSAGES)
    else:  # validity turned off: no stale passages
        store.delete_table("setting_queries", partition, VALIDITY_PASSAGES)
    metadata = table_metadata(queries, path)
    metadata["qrels"] = dg.MetadataValue.int(qrels.height)
    metadata["ground_truth_utility"] = dg.MetadataValue.bool(has_utility)
    if validity is not None:
        metadata["validity_passages"] = dg.MetadataValue.int(validity.height)
    return dg.MaterializeResult(asset_key="setting_queries", metadata=metadata)


def build(parts: Partitions) -> dg.AssetsDefinition:
    experiment = parts.experiment

    deps = [
        dg.AssetDep("index", partition_mapping=parts.index_to_setting()),
        *(
            [dg.AssetDep(RUN_FILE, partition_mapping=parts.run_file_to_setting())]
            if parts.run_file
            else []
        ),
        dg.AssetDep("queries", partition_mapping=parts.dataset_to_setting()),
        dg.AssetDep("corpus", partition_mapping=parts.dataset_to_setting()),
        *(
            [dg.AssetDep("validity_passages", partition_mapping=parts.dataset_to_setting())]
            if experiment.validity
            else []
        ),
        *parts.model_dependencies("reranker"),
        *parts.query_writer_dependencies(),
    ]

    def ranked(run: pl.DataFrame) -> dict[str, Ranked]:
        grouped = (
            run.sort("query_id", "rank")
            .group_by("query_id", maintain_order=True)
            .agg("doc_id", "score")
        )
        return {qid: list(zip(docs, scores)) for qid, docs, scores in grouped.iter_rows()}

    def gathered_run(
        context: dg.AssetExecutionContext,
        store: ArtifactStore,
        models: ModelLoader,
        setting: Setting,
        queries: pl.DataFrame,
        corpus: pl.DataFrame,
        first: pl.DataFrame,
        search,
        metadata: dict[str, dg.MetadataValue],
    ) -> pl.DataFrame:
        """Multi-step round ``setting.step``'s run: the passages gathered over rounds 1..t after
        ``first`` (round 1's top k), each later round searching the query writer's query with
        ``search`` (query table → ranking); its queries go to side table ``multistep_queries``."""
        spec = experiment.query_writer()
        writer = models.generator(spec)
        params = experiment.sampling.greedy_params(experiment.seed)
        texts = dict(corpus.select("id", "text").iter_rows())
        start = time.perf_counter()
        rounds = run_rounds(
            dict(queries.select("query_id", "question").iter_rows()),
            ranked(first),
            texts.__getitem__,
            lambda written: ranked(
                search(pl.DataFrame({"id": list(written), "text": list(written.values())}))
            ),
            lambda prompts: [samples[0].text for samples in writer.sample(prompts, params)],
            setting.step,
            experiment.multistep.max_passages,
            PromptBudget.of(writer, params.max_new_tokens),
            experiment.prompts.template("multistep"),
        )
        path = store.write_table(
            "retrieval_run", context.partition_key, rounds.queries, MULTISTEP_QUERIES
        )
        added = rounds.queries.group_by("round").agg(pl.col("passages_added").mean()).sort("round")
        metadata.update(
            {
                "multistep_round": dg.MetadataValue.int(setting.step),
                "query_writer": dg.MetadataValue.text(spec.name),
                QUERY_WRITER_IDENTITY: dg.MetadataValue.text(writer.identity),
                "query_writing_seconds": dg.MetadataValue.float(time.perf_counter() - start),
                "passages_per_query": dg.MetadataValue.float(
                    sum(len(c) for c in rounds.contexts.values()) / max(len(rounds.contexts), 1)
                ),
                "passages_added_per_round": dg.MetadataValue.md(markdown_table(added)),
                "multistep_queries": dg.MetadataValue.path(str(path)),
            }
        )
        return rounds.run(first["retriever"][0] if first.height else setting.retriever)

    def read_run_file(
        context: dg.AssetExecutionContext,
        setting: Setting,
        queries: pl.DataFrame,
        corpus: pl.DataFrame,
        metadata: dict[str, dg.MetadataValue],
    ) -> pl.DataFrame:
        """A run retriever's ranking, read from its file and checked against the dataset; the file,
        its version, the rows left out and the questions without a row (``missing_queries:
        empty``; also logged) go into ``metadata``."""
        path = experiment.run_file(setting.dataset, setting.retriever)
        # Hashed before reading: a file replaced in between keeps the older version, so the sensor re-runs it.
        version = observed_run_file(path)
        external = read_external_run(
            path,
            setting.retriever,
            setting.dataset,
            queries["query_id"],
            corpus["id"],
            queries_cut=experiment.dataset(setting.dataset).max_queries is not None,
            missing_queries=experiment.retriever(setting.retriever).missing_queries,
        )
        missing = external.queries_without_rows
        metadata["run_file"] = dg.MetadataValue.path(str(path))
        metadata[RUN_FILE_VERSION] = dg.MetadataValue.text(version)
        metadata["rows_of_other_queries"] = dg.MetadataValue.int(external.rows_of_other_queries)
        metadata["queries_without_rows"] = dg.MetadataValue.int(len(missing))
        if missing:
            named = missing[:NAMED_MISSING_QUERIES]
            metadata["queries_without_rows_named"] = dg.MetadataValue.text(", ".join(named))
            context.log.warning(
                f"{len(missing)} of the {queries.height} questions have no row in run file {path} and are scored as "
                f"a retriever that returned nothing (missing_queries: empty), e.g. {', '.join(map(repr, named))}"
            )
        return external.run

    @dg.multi_asset(
        name="retrieval",
        partitions_def=parts.setting,
        **MODEL_STEP,
        specs=step_tables(
            deps,
            {"polars", "parquet"},
            retrieval_run="Ranked passages per query (query_id, rank, doc_id, score, retriever) and a TREC run file.",
            utility_candidates="The top utility.candidates passages per query of the same ranking, "
            "judged by LLM-specific utility whatever k.",
            setting_queries="The questions this setting evaluates, with gold answers, qrels and "
            "(when known) ground-truth passage utility.",
            retrieved_passages="Every passage a prompt of this setting can show (the top k and the "
            "utility candidates of each query, and its positives), with title and text.",
        ),
    )
    def retrieval(context: dg.AssetExecutionContext, store: ArtifactStore, models: ModelLoader):
        setting = parts.setting_of(context)
        retriever = experiment.retriever(setting.retriever)
        queries = store.read_table("queries", setting.dataset)
        qrels = store.read_table("queries", setting.dataset, QRELS)
        corpus = store.read_table("corpus", setting.dataset)
        if setting.k > corpus.height:
            raise ConfigError(
                f"k: {setting.k} exceeds the {corpus.height} passages of dataset {setting.dataset!r}; "
                f"list only k values up to the corpus size"
            )
        query_table = queries.select(
            pl.col("query_id").alias("id"), pl.col("question").alias("text")
        )
        reranker = experiment.reranker
        depth = min(
            reranker.candidates if reranker else max(setting.k, experiment.utility.candidates),
            corpus.height,
        )
        start = time.perf_counter()
        metadata: dict[str, dg.MetadataValue] = {}

        rerank_model = models.reranker(reranker.model, reranker.revision) if reranker else None
        searcher = (
            load_searcher(store, models, experiment, setting) if retriever.kind != "run" else None
        )
        # The models this step runs, as it ran them: the partition's MLflow run reads them here.
        if rerank_model is not None:
            metadata[RERANKER_IDENTITY] = dg.MetadataValue.text(rerank_model.identity)
        if isinstance(searcher, DenseRetriever):
            metadata[EMBEDDER_IDENTITY] = dg.MetadataValue.text(searcher.encoder_identity)

        def reranked(found: pl.DataFrame, table: pl.DataFrame, depth: int) -> pl.DataFrame:
            if rerank_model is None:
                return found
            return rerank(
                found,
                table,
                corpus,
                rerank_model,
                top_n=depth,
                k=depth,
                name=f"{retriever.name}+{reranker.name}",
            )

        def search(table: pl.DataFrame, depth: int) -> pl.DataFrame:
            """The ranking of a query table (id, text), reranked when configured, ``depth`` deep."""
            return reranked(searcher.search(table, k=depth, name=retriever.name), table, depth)

        if searcher is None:
            # Cut as deep as a search would go, so a reranker and the candidates see the same.
            ranking = reranked(
                top_k(read_run_file(context, setting, queries, corpus, metadata), depth),
                query_table,
                depth,
            )
        else:
            ranking = search(query_table, depth)
        seconds = time.perf_counter() - start
        run = top_k(ranking, setting.k)
        if setting.step is not None:
            round_depth = min(reranker.candidates if reranker else setting.k, corpus.height)
            run = gathered_run(
                context,
                store,
                models,
                setting,
                queries,
                corpus,
                run,
                lambda table: top_k(search(table, round_depth), setting.k),
                metadata,
            )
        candidates = top_k(ranking, experiment.utility.candidates)
        path = store.write_table("retrieval_run", context.partition_key, run)
        with store.write_files("retrieval_run", context.partition_key, "trec") as directory:
            write_trec(run, directory / "run.trec", tag=context.partition_key)
        k = setting.k
        _, ir = evaluate_run(run, qrels, [f"recall_{k}", f"ndcg_cut_{k}", "recip_rank", "map"])
        golds = dict(queries.select("query_id", "answers").iter_rows())
        recall = answer_recall(run, corpus, golds, ks=[k])
        headline = {
            **ir.drop("retriever").row(0, named=True),
            f"answer_recall_{k}": recall["answer_recall"][0],
        }
        metadata.update(table_metadata(run, path))
        metadata.update({name: dg.MetadataValue.float(float(v)) for name, v in headline.items()})
        metadata["search_seconds"] = dg.MetadataValue.float(seconds)
        metadata["ir_measures"] = dg.MetadataValue.md(markdown_table([headline]))
        mirage = mirage_retrieval(run, qrels, k)
        metadata["mirage_retrieval"] = dg.MetadataValue.md(markdown_table(mirage))
        summary = retriever_summary(mirage)
        store.write_json("retrieval_run", context.partition_key, RETRIEVER_SUMMARY, summary)
        metadata.update({name: dg.MetadataValue.float(v) for name, v in summary.items()})
        yield dg.MaterializeResult(asset_key="retrieval_run", metadata=metadata)
        path = store.write_table("utility_candidates", context.partition_key, candidates)
        yield dg.MaterializeResult(
            asset_key="utility_candidates", metadata=table_metadata(candidates, path)
        )
        validity = (
            store.read_table("validity_passages", setting.dataset) if experiment.validity else None
        )
        yield write_setting_queries(
            store, context.partition_key, setting.dataset, queries, qrels, validity
        )
        shown = pl.concat(
            [
                candidates.select("doc_id"),
                run.select("doc_id"),
                qrels.filter(pl.col("relevance") > 0).select("doc_id"),
                *([validity.select("doc_id")] if validity is not None else []),
            ]
        ).unique()
        passages = corpus.join(shown, left_on="id", right_on="doc_id", how="semi").sort("id")
        path = store.write_table("retrieved_passages", context.partition_key, passages)
        yield dg.MaterializeResult(
            asset_key="retrieved_passages", metadata=table_metadata(passages, path)
        )

    return retrieval
