"""``utility_transfer[setting × generator]``: LLM-specific utility across the experiment's LLMs
(Zhang et al., 2025 §4–5; the work is ``evaluation.transfer``) — the generator's has_answer with no
passage, the top k, all candidates, the human-annotated passage and each generator's gold-utility
passages (Table 1 and the transfer of Figure 2), and the overlap of its gold sets with every other
generator's (Figure 3). It reads every generator's ``candidate_scores`` of the setting, so it runs
once they are all scored. The figures go to the partition's MLflow run beside ``metric_scores``'."""

import time

import dagster as dg
import polars as pl

from ragutil_dagster.assets.common import GROUP, MODEL_STEP, side_table_metadata, table_metadata
from ragutil_dagster.assets.generations import prompt_budget
from ragutil_dagster.assets.partitions import Partitions, dimension
from ragutil_dagster.evaluation.prompt_sampling import decode_prompts
from ragutil_dagster.evaluation.transfer import (
    gold_sets,
    overlap_table,
    transfer_metrics,
    transfer_prompts,
    transfer_table,
)
from ragutil_dagster.metrics import catalog
from ragutil_dagster.resources.models import ModelLoader
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.tables import DECODING_GREEDY, markdown_table
from ragutil_dagster.tracking import MlflowTracking, TrackedRun
from ragutil_dagster.tracking.partition_run import (
    OVERLAP_ARTIFACT,
    TRANSFER_ARTIFACT,
    log_step_tables,
)

ASSET = "utility_transfer"
OVERLAP = "overlap"
"""The side table of the overlap of the generator's gold-utility sets with every other generator's."""


def build(parts: Partitions) -> dg.AssetsDefinition:
    experiment = parts.experiment
    on_setting = dg.MultiToSingleDimensionPartitionMapping("setting")
    every_generator_of_setting = dg.MultiPartitionMapping(
        {
            "setting": dg.DimensionPartitionMapping("setting", dg.IdentityPartitionMapping()),
            "generator": dg.DimensionPartitionMapping("generator", dg.AllPartitionMapping()),
        }
    )

    @dg.asset(
        name=ASSET,
        partitions_def=parts.setting_generator,
        group_name=GROUP,
        kinds={"pytorch", "parquet"},
        **MODEL_STEP,
        deps=[
            "group_scores",
            "utility_generations",
            "metric_scores",
            dg.AssetDep("candidate_scores", partition_mapping=every_generator_of_setting),
            *(
                dg.AssetDep(name, partition_mapping=on_setting)
                for name in ("setting_queries", "retrieved_passages")
            ),
            *parts.model_dependencies("generator"),
        ],
        description="LLM-specific utility Table 1 and transfer: has_answer with no passage, the top k, all "
        "candidates, the human-annotated passage and each generator's gold-utility passages; the overlap "
        "(Jaccard, passages useful to one LLM and useless to the other) of the gold-utility sets.",
    )
    def utility_transfer(
        context: dg.AssetExecutionContext,
        store: ArtifactStore,
        models: ModelLoader,
        tracking: MlflowTracking,
    ) -> dg.MaterializeResult:
        setting = parts.setting_of(context)
        generator_name = dimension(context, "generator")
        partition = context.partition_key
        start = time.perf_counter()
        queries = store.read_table("setting_queries", setting.key)
        gold = {
            g.name: gold_sets(
                store.read_table(
                    "candidate_scores",
                    dg.MultiPartitionKey({"setting": setting.key, "generator": g.name}),
                )
            )
            for g in experiment.generators
        }
        spec = experiment.generator(generator_name)
        prompts = transfer_prompts(
            queries,
            store.read_table("retrieved_passages", setting.key),
            gold,
            experiment.prompts_for(spec.name),
            prompt_budget(context, models, experiment),
        )
        decoded = decode_prompts(
            prompts,
            models.generator(spec),
            spec.name,
            DECODING_GREEDY,
            experiment.sampling.greedy_params(experiment.seed),
        )
        table = transfer_table(
            queries,
            catalog.validate_scores("group_scores", store.read_table("group_scores", partition)),
            store.read_table("utility_generations", partition),
            gold,
            decoded,
        )
        overlap = overlap_table(generator_name, gold)
        path = store.write_table(ASSET, partition, table)
        overlap_path = store.write_table(ASSET, partition, overlap, OVERLAP)
        record = store.read_json("metric_scores", partition, "mlflow")
        run = TrackedRun(
            tracking.client(), record["experiment_id"], record["run_id"], record["url"], reused=True
        )
        metrics = log_step_tables(
            run,
            transfer_metrics(table, overlap),
            {TRANSFER_ARTIFACT: table, OVERLAP_ARTIFACT: overlap},
        )
        table_one = table.group_by("context", maintain_order=True).agg(
            pl.col("has_answer").mean(),
            pl.col("passages").mean().alias("mean_passages"),
            pl.len().alias("questions"),
        )
        metadata = {
            **table_metadata(table, path),
            **side_table_metadata(OVERLAP, overlap, overlap_path),
            "table_1": dg.MetadataValue.md(markdown_table(table_one.to_dicts())),
            "answers_generated": dg.MetadataValue.int(decoded.height),
            "transfer_seconds": dg.MetadataValue.float(time.perf_counter() - start),
            "mlflow_run_url": dg.MetadataValue.url(run.url),
        }
        metadata.update({name: dg.MetadataValue.float(value) for name, value in metrics.items()})
        return dg.MaterializeResult(metadata=metadata)

    return utility_transfer
