"""``metric_scores[setting × generator]``: every paper's metric on the same samples — SePer_S/H
with and without context and ΔSePer per query and per document (and per 100 context tokens, with
the rag context's tokens before and after compression), semantic entropy, EM / F1 /
has_answer, eRAG labels and aggregates, MIRAGE's four metrics, ConSens (with its leave-one-out
attribution and Experiment 3's AUCs when the consens step scored them), LLM-specific gold
utility over the utility candidates with the set / rank metrics of likelihood, attention and the
verbalized judgments — with its finer tables, ``document_scores`` (per retrieved passage),
``candidate_scores`` (per utility candidate) and ``group_scores`` (per SePer group: the samples
of one prompt)."""

import time

import dagster as dg
import polars as pl

from ragutil_dagster.assets.common import check_result, step_tables, table_metadata
from ragutil_dagster.assets.entailment_clusters import all_generations
from ragutil_dagster.assets.partitions import Partitions, dimension
from ragutil_dagster.evaluation import chain
from ragutil_dagster.evaluation.predictors import (
    answer_containment,
    retrieval_predictors_table,
    table_one,
)
from ragutil_dagster.evaluation.prompt_sampling import ADAPTIVE_BIAS_NOTE
from ragutil_dagster.evaluation.utility_scores import utility_scores
from ragutil_dagster.infra.failpoints import failpoint
from ragutil_dagster.metrics import catalog
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.tables import (
    CONSENS_LEAVE_ONE_OUT,
    CONTEXTS,
    CORPUS_RECORD,
    QRELS,
    RETRIEVER_SUMMARY,
    UTILITY,
    markdown_table,
)
from ragutil_dagster.tracking import MlflowTracking, PartitionRun, dagster_tags
from ragutil_dagster.tracking.entities import link_partition
from ragutil_dagster.tracking.partition_run import (
    CORRELATIONS_ARTIFACT,
    DOCUMENTS_ARTIFACT,
    PER_QUERY_ARTIFACT,
    SUMMARY_ARTIFACT,
    cost_metrics,
    engine_placement_tags,
    log_partition,
    off_world_tags,
    partition_identities,
)


def score_checks(
    queries: pl.DataFrame,
    per_query: pl.DataFrame,
    documents: pl.DataFrame,
    summary: dict[str, float],
) -> list[dg.AssetCheckResult]:
    """Every query scored (ΔSePer; every other per-query metric's n is reported beside it — some
    are undefined for a query by design, e.g. ConSens of a blank pseudo-answer); every score
    inside its range; MIRAGE's four metrics sum to 1 (eq. 6)."""
    unscored = per_query.filter(
        pl.col("delta_seper_s").is_null() | pl.col("delta_seper_h").is_null()
    )
    missing = queries.height - per_query.height
    bounds = catalog.per_query_bounds()
    eps = 1e-9
    out_of_range = {
        column: int(
            per_query.filter((pl.col(column) < low - eps) | (pl.col(column) > high + eps)).height
        )
        for column, (low, high) in bounds.items()
        if column in per_query.columns
    }
    out_of_range["document_delta_seper_s"] = int(
        documents.filter(pl.col("delta_seper_s").abs() > 1 + eps).height
    )
    mirage = [summary[m.name] for m in catalog.mirage() if m.name in summary]
    mirage_total = sum(mirage)
    return [
        check_result(
            "every_query_has_scores",
            missing == 0 and unscored.height == 0,
            queries=queries.height,
            scored=per_query.height - unscored.height,
            **{
                f"n_{column}": int(per_query[column].is_not_null().sum())
                for column in catalog.per_query_means()
                if column in per_query.columns
            },
        ),
        check_result("scores_in_range", not any(out_of_range.values()), **out_of_range),
        check_result(
            "mirage_metrics_sum_to_one",
            not mirage or abs(mirage_total - 1) < 1e-9,
            total=mirage_total,
            metrics=len(mirage),
        ),
    ]


def build(parts: Partitions) -> dg.AssetsDefinition:
    experiment = parts.experiment

    on_setting = dg.MultiToSingleDimensionPartitionMapping("setting")
    deps = [
        "generations",
        "nli_probabilities",
        "consens",
        "utility_signals",
        "utility_generations",
        "utility_judgments",
        dg.AssetDep(
            "closed_book_generations",
            partition_mapping=parts.dataset_generator_to_setting_generator(),
        ),
        *(
            dg.AssetDep(name, partition_mapping=on_setting)
            for name in (
                "retrieval_run",
                "setting_queries",
                "retrieved_passages",
                "utility_candidates",
            )
        ),
    ]

    @dg.multi_asset(
        name="metric_scores",
        partitions_def=parts.setting_generator,
        specs=step_tables(
            deps,
            {"polars", "parquet"},
            metric_scores="Per-query scores of all five papers' metrics, and their summary.",
            document_scores="Per retrieved passage: ΔSePer alone, eRAG labels, utility signals, ConSens "
            "leave-one-out attribution and ground truth.",
            group_scores="Per SePer group (the samples of one prompt): SePer_S/H, entropy, EM / F1.",
            candidate_scores="Per utility candidate: its answer alone, gold utility (LLM-specific utility eq. 1), "
            "likelihood and attention utility.",
            retrieval_correlations="eRAG Table 1: Kendall τ and Spearman ρ (bootstrap 95% CIs) over queries "
            "between each retrieval evaluation and the rag condition's EM / has_answer.",
        ),
        check_specs=[
            dg.AssetCheckSpec(name, asset="metric_scores")
            for name in ("every_query_has_scores", "scores_in_range", "mirage_metrics_sum_to_one")
        ],
    )
    def metric_scores(
        context: dg.AssetExecutionContext,
        store: ArtifactStore,
        tracking: MlflowTracking,
    ):
        setting = parts.setting_of(context)
        generator = dimension(context, "generator")
        partition = context.partition_key
        start = time.perf_counter()
        samples = all_generations(store, parts, partition)
        tracked = PartitionRun(
            experiment,
            setting,
            generator,
            partition_identities(experiment, setting, samples, context.instance, str(partition)),
        )
        tags = {
            **dagster_tags(context.run.run_id, "metric_scores", str(partition)),
            **off_world_tags(experiment, setting, generator),
            **engine_placement_tags(context.instance, str(partition)),
            **({"adaptive_sampling": ADAPTIVE_BIAS_NOTE} if experiment.sampling.adaptive else {}),
        }
        # The run is open while scoring: a failure here leaves it FAILED, never RUNNING.
        with tracking.run(
            tracked.mlflow_experiment, tracked.key, tracked.run_name, "partition", tags
        ) as run:
            queries = store.read_table("setting_queries", setting.key)
            run = link_partition(
                tracking,
                run,
                tracked,
                queries,
                store.read_json("setting_queries", setting.key, CORPUS_RECORD),
                store.read_table("retrieval_run", setting.key),
            )
            nli = store.read_table("nli_probabilities", partition)
            ground_truth = (
                store.read_table("setting_queries", setting.key, UTILITY)
                if store.has_table("setting_queries", setting.key, UTILITY)
                else None
            )
            retrieved = store.read_table("retrieval_run", setting.key)
            qrels = store.read_table("setting_queries", setting.key, QRELS)
            contexts = (
                store.read_table("generations", partition, CONTEXTS)
                if store.has_table("generations", partition, CONTEXTS)
                else None
            )  # older generations have none
            scored = chain.scores(
                samples,
                queries,
                nli,
                retrieved,
                consens=store.read_table("consens", partition),
                contexts=contexts,
                leave_one_out=store.read_table("consens", partition, CONSENS_LEAVE_ONE_OUT),
                qrels=qrels,
                utility_signals=store.read_table("utility_signals", partition),
                ground_truth=ground_truth,
            )
            groups, documents, per_query = scored.groups, scored.documents, scored.per_query
            utility = utility_scores(
                groups,
                queries,
                store.read_table("utility_candidates", setting.key),
                store.read_table("utility_generations", partition),
                store.read_table("utility_signals", partition),
                store.read_table("utility_judgments", partition),
            )
            summary = chain.summary(
                scored,
                samples,
                setting.k,
                experiment.sampling,
                experiment.erag.label,
                utility,
                store.read_json("retrieval_run", setting.key, RETRIEVER_SUMMARY),
            )
            containment = answer_containment(
                documents, store.read_table("retrieved_passages", setting.key), queries
            )
            correlations = retrieval_predictors_table(
                per_query,
                documents,
                qrels,
                containment,
                setting.k,
                experiment.bootstrap_resamples,
                experiment.seed,
            )
            failpoint("scoring")
            groups_path = store.write_table(
                "group_scores", partition, catalog.validate_scores("group_scores", groups)
            )
            documents_path = store.write_table(
                "document_scores", partition, catalog.validate_scores("document_scores", documents)
            )
            candidates_path = store.write_table("candidate_scores", partition, utility.candidates)
            correlations_path = store.write_table("retrieval_correlations", partition, correlations)
            path = store.write_table(
                "metric_scores", partition, catalog.validate_scores("metric_scores", per_query)
            )
            store.write_json(
                "metric_scores", partition, "summary", catalog.validate_summary(summary)
            )
            scoring_seconds = time.perf_counter() - start
            costs = cost_metrics(
                context.instance,
                {
                    "closed_book_generations": parts.closed_book_partition(partition),
                    "generations": str(partition),
                    "entailment_clusters": str(partition),
                    "consens": str(partition),
                    "utility_generations": str(partition),
                },
                samples,
                nli,
                scoring_seconds,
            )
            logged = {
                PER_QUERY_ARTIFACT: ("metric_scores", "table.parquet"),
                DOCUMENTS_ARTIFACT: ("document_scores", "table.parquet"),
                SUMMARY_ARTIFACT: ("metric_scores", "summary.json"),
                CORRELATIONS_ARTIFACT: ("retrieval_correlations", "table.parquet"),
            }
            with store.write_files("metric_scores", partition, "plots") as plots:
                log_partition(
                    run,
                    tracked.params(),
                    summary,
                    per_query,
                    costs,
                    {
                        name: store.local_files(asset, partition, file) / file
                        for name, (asset, file) in logged.items()
                    },
                    plots,
                    documents,
                    experiment.seed,
                )
            store.write_json(
                "metric_scores",
                partition,
                "mlflow",
                {
                    "run_id": run.run_id,
                    "experiment_id": run.experiment_id,
                    "run_key": tracked.key,
                    "url": run.url,
                    "tracking_uri": tracking.display_uri,
                },
            )
        headline = {m.name: summary[m.name] for m in catalog.headline() if m.name in summary}
        yield dg.MaterializeResult(
            asset_key="group_scores", metadata=table_metadata(groups, groups_path)
        )
        yield dg.MaterializeResult(
            asset_key="document_scores", metadata=table_metadata(documents, documents_path)
        )
        yield dg.MaterializeResult(
            asset_key="candidate_scores",
            metadata=table_metadata(utility.candidates, candidates_path),
        )
        yield dg.MaterializeResult(
            asset_key="retrieval_correlations",
            metadata={
                **table_metadata(correlations, correlations_path),
                "erag_table_1": dg.MetadataValue.md(markdown_table(table_one(correlations))),
            },
        )
        metadata: dict[str, dg.MetadataValue] = {
            "dagster/row_count": dg.MetadataValue.int(per_query.height),
            "path": dg.MetadataValue.path(str(path)),
            "documents": dg.MetadataValue.int(documents.height),
            "scoring_seconds": dg.MetadataValue.float(scoring_seconds),
            "headline": dg.MetadataValue.md(markdown_table([headline])),
            "mlflow_run_url": dg.MetadataValue.url(run.url),
            "mlflow_run_id": dg.MetadataValue.text(run.run_id),
            "mlflow_run_reused": dg.MetadataValue.bool(run.reused),
        }
        metadata.update({name: dg.MetadataValue.float(value) for name, value in summary.items()})
        yield dg.MaterializeResult(
            asset_key="metric_scores",
            metadata=metadata,
            check_results=score_checks(queries, per_query, documents, summary),
        )

    return metric_scores
