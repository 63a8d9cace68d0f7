"""``utility_judgments[setting × generator]``: LLM-specific utility judged by the generator itself
over each query's ``utility_candidates`` (Zhang et al., 2025 §3.3–3.4; the work is
``evaluation.verbalized``): every greedy generation of the step (``utility_generations``: the
pseudo-answer, the answers with candidates alone beyond the top k, the verbalized judgments, RAG
with each method's passages), the parsed judgments per query and method (``utility_judgments``,
with each method's parse-failure rate in the metadata) and the likelihood / attention utility of
every candidate (``utility_signals``)."""

import time

import dagster as dg
import polars as pl

from ragutil_dagster.assets.common import (
    MODEL_STEP,
    side_table_metadata,
    step_tables,
    table_metadata,
)
from ragutil_dagster.assets.partitions import Partitions, dimension
from ragutil_dagster.evaluation.verbalized import judge_utility, parse_failures
from ragutil_dagster.resources.models import ModelLoader
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.tables import PROMPTS, markdown_table


def build(parts: Partitions) -> dg.AssetsDefinition:
    experiment = parts.experiment
    deps = [
        *(
            dg.AssetDep(
                name, partition_mapping=dg.MultiToSingleDimensionPartitionMapping("setting")
            )
            for name in ("utility_candidates", "setting_queries", "retrieved_passages")
        ),
        *parts.model_dependencies("generator"),
    ]

    @dg.multi_asset(
        name="utility_judgments",
        partitions_def=parts.setting_generator,
        **MODEL_STEP,
        specs=step_tables(
            deps,
            {"pytorch", "parquet"},
            utility_generations="Greedy generations of LLM-specific utility: the pseudo-answer over the "
            "candidates, each candidate alone beyond the top k, the verbalized judgments, RAG with each "
            "method's passages.",
            utility_judgments="Per query and verbalized method: the candidates shown, selected or ranked, "
            "the RAG passages, judgments and unparseable answers.",
            utility_signals="Likelihood- and attention-based utility of every utility candidate to the generator.",
        ),
    )
    def utility_judgments(
        context: dg.AssetExecutionContext, store: ArtifactStore, models: ModelLoader
    ):
        setting = parts.setting_of(context)
        spec = experiment.generator(dimension(context, "generator"))
        generator = models.generator(spec)
        scorer = models.scorer(spec)
        start = time.perf_counter()
        result = judge_utility(
            store.read_table("setting_queries", setting.key),
            store.read_table("retrieved_passages", setting.key),
            store.read_table("utility_candidates", setting.key),
            setting.k,
            generator,
            spec.name,
            scorer,
            experiment,
        )
        seconds = time.perf_counter() - start
        partition = context.partition_key
        rows = result.generations
        prompts_path = store.write_table("utility_generations", partition, result.prompts, PROMPTS)
        path = store.write_table("utility_generations", partition, rows)
        metadata = table_metadata(rows.drop("token_logprobs"), path)
        metadata.update(
            {
                "sampling_seconds": dg.MetadataValue.float(seconds),
                "tokens_generated": dg.MetadataValue.int(int(rows["n_tokens"].sum())),
                "model_identity": dg.MetadataValue.text(generator.identity),
                "conditions": dg.MetadataValue.md(
                    markdown_table(rows.group_by("condition").len().sort("condition").to_dicts())
                ),
                "prompts_fitted_to_context": dg.MetadataValue.int(
                    result.prompts.filter(
                        (pl.col("passages_dropped") > 0)
                        | pl.col("last_passage_chars").is_not_null()
                    ).height
                ),
                **side_table_metadata(PROMPTS, result.prompts, prompts_path),
            }
        )
        yield dg.MaterializeResult(asset_key="utility_generations", metadata=metadata)

        path = store.write_table("utility_judgments", partition, result.judgments)
        failures = parse_failures(result.judgments)
        metadata = table_metadata(result.judgments, path)
        metadata["parse_failures"] = dg.MetadataValue.md(markdown_table(failures))
        metadata.update(
            {
                f"parse_failure_rate/{method}": dg.MetadataValue.float(rate)
                for method, rate in failures.select("method", "parse_failure_rate").iter_rows()
            }
        )
        if failures.height and failures["unparseable"].sum():
            context.log.warning(
                "unparseable utility judgments (answers not in the requested format; they select nothing): "
                + ", ".join(
                    f"{m} {r:.0%}"
                    for m, r in failures.select("method", "parse_failure_rate").iter_rows()
                )
            )
        yield dg.MaterializeResult(asset_key="utility_judgments", metadata=metadata)

        path = store.write_table("utility_signals", partition, result.signals)
        metadata = table_metadata(result.signals, path)
        if not scorer.supports_attention:
            metadata["attention_utility"] = dg.MetadataValue.text(
                f"unavailable: {scorer.attention_unavailable}"
            )
        yield dg.MaterializeResult(asset_key="utility_signals", metadata=metadata)

    return utility_judgments
