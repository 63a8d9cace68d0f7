"""``validity[setting × generator]``: the papers' validity experiments on a judged dataset
(evaluation/validity.py) — every per-passage measure of the validity passages (the positives and
annotated or sampled negatives, sampled alone in ``generations``, NLI-judged and scored in ``group_scores`` as
``per_doc`` passages are) set against their 0/1 label: ROC AUC with a bootstrap interval and the
point-biserial r, in SePer Table 2's layout. The generator scores each passage's teacher-forced
signals here (likelihood, ConSens). The figures go to the partition's MLflow run, beside
``metric_scores``'; the table and the per-passage scores are its artifacts. Only with a
``validity`` section in the config."""

import time

import dagster as dg
import polars as pl

from ragutil_dagster.assets.common import GROUP, MODEL_STEP, side_table_metadata, table_metadata
from ragutil_dagster.assets.entailment_clusters import all_generations
from ragutil_dagster.assets.generations import prompt_budget
from ragutil_dagster.assets.partitions import Partitions, dimension
from ragutil_dagster.evaluation.conditions import (
    VALIDITY_CONDITION,
    closed_book_prompts,
    consens_passage_prompts,
    validity_prompts,
)
from ragutil_dagster.evaluation.groups import judged_answers
from ragutil_dagster.evaluation.signals import alone_signals
from ragutil_dagster.evaluation.validity import (
    NEGATIVE_KINDS,
    measures,
    passage_table,
    reference_scores,
    signal_columns,
    table_two,
    validity_table,
)
from ragutil_dagster.metrics import catalog
from ragutil_dagster.resources.models import ModelLoader
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.tables import UTILITY, VALIDITY_PASSAGES, markdown_table
from ragutil_dagster.tracking import MlflowTracking, TrackedRun
from ragutil_dagster.tracking.partition_run import log_validity

ASSET = "validity"
PASSAGES = "passages"
"""The side table of every validity passage with its label and measures."""


def build(parts: Partitions) -> list[dg.AssetsDefinition]:
    experiment = parts.experiment
    if experiment.validity is None:
        return []
    on_setting = dg.MultiToSingleDimensionPartitionMapping("setting")

    @dg.asset(
        name=ASSET,
        partitions_def=parts.setting_generator,
        group_name=GROUP,
        kinds={"pytorch", "parquet"},
        **MODEL_STEP,
        deps=[
            "generations",
            "group_scores",
            "metric_scores",
            # Its closed-book samples: SePer Table 2's ROUGE-L, BLEU and BERTScore of the closed book.
            dg.AssetDep(
                "closed_book_generations",
                partition_mapping=parts.dataset_generator_to_setting_generator(),
            ),
            *(
                dg.AssetDep(name, partition_mapping=on_setting)
                for name in ("setting_queries", "retrieved_passages")
            ),
            *parts.model_dependencies("generator"),
        ],
        description="Validity (SePer Table 2 layout: ΔEM, ΔROUGE-L, ΔBLEU, ΔBERTScore, the uncertainty "
        "reductions, ΔSePer; ΔF1 and the other papers' measures beside them): ROC AUC [bootstrap 95% CI] and "
        "point-biserial r of every per-passage measure against the judgments — positives vs annotated "
        "(or random and hard) negatives, each scored alone — questions answered closed book apart.",
    )
    def validity(
        context: dg.AssetExecutionContext,
        store: ArtifactStore,
        models: ModelLoader,
        tracking: MlflowTracking,
    ) -> dg.MaterializeResult:
        setting = parts.setting_of(context)
        spec = experiment.generator(dimension(context, "generator"))
        partition = context.partition_key
        start = time.perf_counter()
        queries = store.read_table("setting_queries", setting.key)
        judged = store.read_table("setting_queries", setting.key, VALIDITY_PASSAGES)
        corpus = store.read_table("retrieved_passages", setting.key)
        budget = prompt_budget(context, models, experiment)
        templates = experiment.prompts_for(spec.name)
        alone = validity_prompts(queries, corpus, judged, templates, budget)
        prompts = pl.concat(
            [
                closed_book_prompts(queries, templates, budget),
                alone,
                consens_passage_prompts(queries, alone, corpus, templates, budget),
            ]
        )
        generations = all_generations(store, parts, partition)  # closed book and with context
        answers = judged_answers(generations, "rag")
        signals = alone_signals(prompts, answers, queries, models.scorer(spec), VALIDITY_CONDITION)
        ground_truth = (
            store.read_table("setting_queries", setting.key, UTILITY)
            if store.has_table("setting_queries", setting.key, UTILITY)
            else None
        )
        # SePer Table 2's ROUGE-L, BLEU and BERTScore rows: every closed-book and validity sample
        # against the gold answers.
        config = experiment.validity
        bertscore = (
            models.bertscorer(config.bertscore_model, config.bertscore_layer)
            if config.bertscore_model
            else None
        )
        references = reference_scores(generations, queries, bertscore)
        passages = passage_table(
            catalog.validate_scores("group_scores", store.read_table("group_scores", partition)),
            queries,
            judged,
            signals,
            ground_truth,
            references,
        )
        table = validity_table(
            passages,
            measures(passages, signal_columns(signals)),
            experiment.bootstrap_resamples,
            experiment.seed,
        )
        path = store.write_table(ASSET, partition, table)
        passages_path = store.write_table(ASSET, partition, passages, PASSAGES)
        record = store.read_json("metric_scores", partition, "mlflow")
        run = TrackedRun(
            tracking.client(), record["experiment_id"], record["run_id"], record["url"], reused=True
        )
        logged = log_validity(run, table, passages)
        headline = table.filter((pl.col("subset") == "unanswered") & (pl.col("negatives") == "all"))
        metadata = {
            **table_metadata(table, path),
            **side_table_metadata(PASSAGES, passages, passages_path),
            "table_2": dg.MetadataValue.md(markdown_table(table_two(table, "unanswered"))),
            "table_2_answered_closed_book": dg.MetadataValue.md(
                markdown_table(table_two(table, "answered"))
            ),
            "negative_kinds": dg.MetadataValue.text(
                " + ".join(k for k in NEGATIVE_KINDS if k in set(judged["kind"]))
            ),
            "questions_answered_closed_book": dg.MetadataValue.int(
                passages.filter(pl.col("answered_closed_book"))["query_id"].n_unique()
            ),
            "validity_seconds": dg.MetadataValue.float(time.perf_counter() - start),
            "mlflow_run_url": dg.MetadataValue.url(run.url),
            "mlflow_metrics": dg.MetadataValue.int(len(logged)),
        }
        for row in headline.iter_rows(named=True):
            for statistic in ("auc", "r_pb", "n"):
                if row[statistic] is not None:
                    metadata[f"{statistic}/{row['measure']}"] = dg.MetadataValue.float(
                        float(row[statistic])
                    )
        return dg.MaterializeResult(metadata=metadata)

    return [validity]
