"""``generations[setting × generator]``: N samples per prompt of the context conditions — the
top-k passages together (``rag``, also MIRAGE's mixed setting; in a compressed setting their
compressed context, side table ``contexts``), each passage alone
(``per_doc``), the positives alone (``oracle``) and, with a validity section, every validity
passage alone (``validity``) — and, from the same loaded generator, its
teacher-forced ``consens`` per query (and, with ``consens.leave_one_out``, per passage left out of
the context: side table ``leave_one_out``).

A question a run file has no row for (``missing_queries: empty``) has the closed-book prompt as
its rag prompt and its ``closed_book_generations`` samples as its rag samples, not drawn again.

The prompts sampled and the generation issues (empty or non-finite samples) are the step's
diagnostics: written beside the samples and shown in the metadata (path, columns, preview)."""

import time

import dagster as dg
import polars as pl

from ragutil_dagster.assets.common import (
    MODEL_STEP,
    check_result,
    side_table_metadata,
    step_tables,
    table_metadata,
)
from ragutil_dagster.assets.partitions import Partitions, dimension
from ragutil_dagster.config import ExperimentConfig, SamplingConfig, Setting
from ragutil_dagster.errors import ConfigError
from ragutil_dagster.evaluation import chain
from ragutil_dagster.evaluation.chain import Sampler
from ragutil_dagster.evaluation.compression import (
    compress_contexts,
    context_token_count,
    ranked_contexts,
    summary_prompt,
)
from ragutil_dagster.evaluation.conditions import (
    CONSENS_LEAVE_OUT,
    PromptBudget,
    consens_prompts,
    empty_retrieval_samples,
    queries_without_passages,
    validity_prompts,
)
from ragutil_dagster.evaluation.prompt_sampling import (
    ADAPTIVE_BIAS_NOTE,
    drawn_share,
    generation_issues,
    off_schedule_groups,
    sample_schedule,
    samples_drawn,
)
from ragutil_dagster.evaluation.signals import consens_scores
from ragutil_dagster.evaluation.world_scope import off_world_models, off_world_warning
from ragutil_dagster.models.backends import runtime_metadata
from ragutil_dagster.resources.models import ModelLoader
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.tables import (
    CONSENS_LEAVE_ONE_OUT,
    CONTEXTS,
    GENERATION_SCHEMA,
    GROUP_KEYS,
    ISSUES,
    PROMPTS,
    QRELS,
    VALIDITY_PASSAGES,
    markdown_table,
)
from ragutil_dagster.tracking.partition_run import GENERATOR_DTYPE

SAMPLE_COUNT_CHECK = "sample_counts_follow_schedule"
"""The generation assets' check that every prompt drew the samples the sampling schedule allows."""


def partition_sampler(
    context: dg.AssetExecutionContext, models: ModelLoader, experiment: ExperimentConfig
) -> Sampler:
    """The evaluation chain's sampler of the partition's generator (loaded once by the model
    loader, which keeps it)."""
    spec = experiment.generator(dimension(context, "generator"))
    return Sampler.of(experiment, spec.name, models.generator(spec))


def prompt_budget(
    context: dg.AssetExecutionContext, models: ModelLoader, experiment: ExperimentConfig
) -> PromptBudget | None:
    """The prompt budget of the partition's generator (its context minus ``max_new_tokens``)."""
    return partition_sampler(context, models, experiment).budget


def setting_contexts(
    context: dg.AssetExecutionContext,
    models: ModelLoader,
    experiment: ExperimentConfig,
    setting: Setting,
    queries: pl.DataFrame,
    passages: pl.DataFrame,
    run: pl.DataFrame,
) -> tuple[pl.DataFrame, dict[str, dg.MetadataValue]]:
    """The context of every query's rag prompt — compressed by the setting's compressor, if any —
    with its context tokens before and after (``CONTEXT_SCHEMA``), and the step's metadata about it.
    An abstractive summary that cannot fit the generator's context is a ConfigError naming the
    compressor's budget, raised before anything is written."""
    spec = experiment.generator(dimension(context, "generator"))
    generator = models.generator(spec)
    compressor = experiment.compressor(setting)
    prompts = experiment.prompts_for(spec.name)
    questions, contexts = ranked_contexts(queries, passages, run)
    count, unit = context_token_count(generator)
    embed = generate = None
    if compressor is not None and compressor.method == "extractive":
        embed = models.embedder(compressor.ranking_embedder).encode
    if compressor is not None and compressor.method == "abstractive":
        field = f"compression.{experiment.compression.index(compressor)}.budget"
        length = generator.context_length
        longest = max(
            count(
                [
                    summary_prompt(questions[q], c, prompts.template("compression"))
                    for q, c in contexts.items()
                ]
            ),
            default=0,
        )
        if length is not None and longest + compressor.budget > length:
            raise ConfigError(
                f"{field}: compressor {compressor.key!r} asks generator {spec.name!r} for a summary of up to "
                f"{compressor.budget} tokens after a prompt of up to {longest}, beyond its context of {length} "
                "tokens; lower the budget or k"
            )
        generate = generator.sample
    start = time.perf_counter()
    table = compress_contexts(
        questions,
        contexts,
        compressor,
        count,
        prompts.with_context,
        embed,
        generate,
        experiment.seed,
        prompts.template("compression"),
    )
    before, after = (
        int(table["context_tokens_before"].sum()),
        int(table["context_tokens_after"].sum()),
    )
    metadata = {
        "compressor": dg.MetadataValue.text(compressor.key if compressor else "none"),
        "context_token_unit": dg.MetadataValue.text(unit),
        "context_tokens_before": dg.MetadataValue.float(before / max(table.height, 1)),
        "context_tokens_after": dg.MetadataValue.float(after / max(table.height, 1)),
        "compression_ratio": dg.MetadataValue.float(after / before if before else 1.0),
        "compression_seconds": dg.MetadataValue.float(time.perf_counter() - start),
    }
    return table, metadata


def sampling_model_dependencies(parts: Partitions) -> list[dg.AssetDep]:
    """The models a generation step reads: its generator, and with adaptive sampling the NLI
    model that scores SePer between rounds."""
    adaptive = parts.experiment.sampling.adaptive is not None
    return [
        *parts.model_dependencies("generator"),
        *(parts.model_dependencies("nli") if adaptive else []),
    ]


def draw_samples(
    models: ModelLoader,
    experiment: ExperimentConfig,
    sampler: Sampler,
    prompts: pl.DataFrame,
    queries: pl.DataFrame,
) -> tuple[pl.DataFrame, dict[str, dg.MetadataValue]]:
    """The sample rows of ``prompts`` — N per prompt, or adaptively (``sampling.adaptive``) with
    SePer scored between rounds by the experiment's NLI model — and the draw's metadata."""
    sampling = sampler.sampling
    start = time.perf_counter()
    nli = None if sampling.adaptive is None else models.entailment(experiment.nli)
    rows, nli_seconds = chain.sample_prompts_by_config(sampler, prompts, queries, nli)
    metadata = {"sampling_seconds": dg.MetadataValue.float(time.perf_counter() - start)}
    if sampling.adaptive is not None:
        metadata["adaptive_nli_seconds"] = dg.MetadataValue.float(nli_seconds)
    return rows, metadata


def sample_and_store(
    context: dg.AssetExecutionContext,
    store: ArtifactStore,
    models: ModelLoader,
    experiment: ExperimentConfig,
    sampler: Sampler,
    prompts: pl.DataFrame,
    queries: pl.DataFrame,
    asset: str,
    dataset: str,
    reused: pl.DataFrame | None = None,
) -> tuple[pl.DataFrame, dg.MaterializeResult]:
    """Sample a prompt table (of ``queries`` of ``dataset``) with the partition's ``sampler``, store
    prompts and samples, and return the sample rows with the materialisation's metadata and checks.
    The prompts ``reused`` holds sample rows for (the rag prompts of queries without passages:
    :func:`~ragutil_dagster.evaluation.conditions.empty_retrieval_samples`) are not drawn again."""
    spec = experiment.generator(sampler.name)
    generator = sampler.generator
    reused = pl.DataFrame(schema=GENERATION_SCHEMA) if reused is None else reused
    drawn_prompts = prompts.join(
        reused.select(GROUP_KEYS).unique(), on=list(GROUP_KEYS), how="anti", nulls_equal=True
    )
    rows, draw_metadata = draw_samples(models, experiment, sampler, drawn_prompts, queries)
    rows = pl.concat([rows, reused])
    seconds = draw_metadata["sampling_seconds"].value
    drawn = samples_drawn(rows, experiment.sampling.n)
    n_drawn = int(drawn["samples_drawn"].sum())
    partition = context.partition_key
    prompts_path = store.write_table(asset, partition, prompts, PROMPTS)
    path = store.write_table(asset, partition, rows)
    tokens = int(rows["n_tokens"].sum())
    issues = generation_issues(rows)
    issues_path = store.write_table(asset, partition, issues, ISSUES)
    fitted = prompts.filter(
        (pl.col("passages_dropped") > 0) | pl.col("last_passage_chars").is_not_null()
    )
    metadata = table_metadata(rows.drop("token_logprobs"), path)
    metadata.update(
        {
            "prompts": dg.MetadataValue.int(prompts.height),
            "distinct_prompts": dg.MetadataValue.int(prompts["prompt"].n_unique()),
            "tokens_generated": dg.MetadataValue.int(tokens),
            **draw_metadata,
            "samples_drawn": dg.MetadataValue.int(n_drawn),
            "sample_fraction": dg.MetadataValue.float(drawn_share(drawn, experiment.sampling.n)),
            **(
                {"adaptive_sampling": dg.MetadataValue.text(ADAPTIVE_BIAS_NOTE)}
                if experiment.sampling.adaptive
                else {}
            ),
            "samples_by_condition": dg.MetadataValue.md(markdown_table(drawn.to_dicts())),
            "samples_per_second": dg.MetadataValue.float(rows.height / seconds if seconds else 0.0),
            "empty_generations": dg.MetadataValue.int(int(issues["empty_samples"].sum())),
            "nonfinite_logprob_generations": dg.MetadataValue.int(
                int(issues["nonfinite_logprob_samples"].sum())
            ),
            "queries_with_generation_issues": dg.MetadataValue.int(issues["query_id"].n_unique()),
            "prompts_fitted_to_context": dg.MetadataValue.int(fitted.height),
            "prompts_reusing_closed_book_samples": dg.MetadataValue.int(
                prompts.height - drawn_prompts.height
            ),
            "passages_dropped_to_fit": dg.MetadataValue.int(int(prompts["passages_dropped"].sum())),
            "passages_cut_to_fit": dg.MetadataValue.int(
                prompts["last_passage_chars"].is_not_null().sum()
            ),
            "model_identity": dg.MetadataValue.text(generator.identity),
            **(
                {GENERATOR_DTYPE: dg.MetadataValue.text(str(dtype))}
                if (dtype := generator.settings.get("dtype"))
                else {}
            ),
            **{
                name: dg.MetadataValue.text(value)
                for name, value in runtime_metadata(generator).items()
            },
            "conditions": dg.MetadataValue.md(
                markdown_table(rows.group_by("condition").len().sort("condition").to_dicts())
            ),
            **side_table_metadata(PROMPTS, prompts, prompts_path),
            **side_table_metadata(ISSUES, issues, issues_path),
        }
    )
    if off_world := off_world_models([spec.model], experiment.dataset(dataset)):
        metadata["off_world_warning"] = dg.MetadataValue.text(
            off_world_warning(off_world, f"dataset {dataset!r}")
        )
        context.log.warning(metadata["off_world_warning"].value)
    if fitted.height:
        context.log.warning(
            f"{fitted.height} prompts exceeded the generator's context and were fitted (passages "
            f"dropped from the end, then the last cut), e.g. query {fitted['query_id'][0]!r}"
        )
    if issues.height:
        metadata["generation_issues"] = dg.MetadataValue.md(
            markdown_table(issues.head(20).to_dicts())
        )
        context.log.warning(
            f"{int(issues['empty_samples'].sum())} empty generations and "
            f"{int(issues['nonfinite_logprob_samples'].sum())} with non-finite log-probs in "
            f"{issues['query_id'].n_unique()} queries (table 'issues'; e.g. query "
            f"{issues['query_id'][0]!r}, condition {issues['condition'][0]!r})"
        )
    check = sample_count_check(prompts, rows, experiment.sampling)
    return rows, dg.MaterializeResult(metadata=metadata, check_results=[check])


def sample_count_check(
    prompts: pl.DataFrame, rows: pl.DataFrame, sampling: SamplingConfig
) -> dg.AssetCheckResult:
    """The check :data:`SAMPLE_COUNT_CHECK`: every group of ``prompts`` drew a count of samples the
    schedule allows (N, or with ``sampling.adaptive`` the end of one of its rounds) and one greedy
    answer per prompt with greedy labels, and ``rows`` hold no other group
    (:func:`~ragutil_dagster.evaluation.prompt_sampling.off_schedule_groups`)."""
    off_schedule = off_schedule_groups(prompts, rows, sampling)
    shown = {
        "off_schedule_groups": dg.MetadataValue.md(markdown_table(off_schedule.head(20).to_dicts()))
    }
    return check_result(
        SAMPLE_COUNT_CHECK,
        off_schedule.is_empty(),
        groups=prompts.select(GROUP_KEYS).unique().height,
        groups_off_schedule=off_schedule.height,
        sample_counts_allowed=sample_schedule(sampling),
        greedy_per_group=int(sampling.labels == "greedy"),
        **(shown if off_schedule.height else {}),
    )


def build(parts: Partitions) -> dg.AssetsDefinition:
    experiment = parts.experiment
    # A question a run file has no row for (missing_queries: empty) takes its rag samples from the closed book.
    empty_retrieval = any(r.missing_queries == "empty" for r in experiment.retrievers)
    deps = [
        *(
            dg.AssetDep(
                name, partition_mapping=dg.MultiToSingleDimensionPartitionMapping("setting")
            )
            for name in ("retrieval_run", "setting_queries", "retrieved_passages")
        ),
        *(
            [
                dg.AssetDep(
                    "closed_book_generations",
                    partition_mapping=parts.dataset_generator_to_setting_generator(),
                )
            ]
            if empty_retrieval
            else []
        ),
        *sampling_model_dependencies(parts),
    ]

    @dg.multi_asset(
        name="generations",
        partitions_def=parts.setting_generator,
        **MODEL_STEP,
        specs=step_tables(
            deps,
            {"pytorch", "parquet"},
            generations="N sampled answers per prompt for the rag, per_doc and oracle conditions; side table "
            "contexts: each query's rag context (compressed in a compressed setting) and its context tokens.",
            consens="ConSens per query: the generator's log-prob of its pseudo-answer with and without the context; "
            "with consens.leave_one_out, per passage ConSens with it left out and its attribution (side table "
            "leave_one_out, ConSens §3.3).",
        ),
        check_specs=[dg.AssetCheckSpec(SAMPLE_COUNT_CHECK, asset="generations")],
    )
    def generations(context: dg.AssetExecutionContext, store: ArtifactStore, models: ModelLoader):
        setting = parts.setting_of(context)
        spec = experiment.generator(dimension(context, "generator"))
        sampler = partition_sampler(context, models, experiment)
        queries = store.read_table("setting_queries", setting.key)
        qrels = store.read_table("setting_queries", setting.key, QRELS)
        passages = store.read_table("retrieved_passages", setting.key)
        run = store.read_table("retrieval_run", setting.key)
        contexts, context_metadata = setting_contexts(
            context, models, experiment, setting, queries, passages, run
        )
        compressed = contexts if setting.compressor else None
        empty = experiment.retriever(setting.retriever).missing_queries == "empty"
        prompts = chain.with_context(sampler, queries, passages, run, qrels, compressed, empty)
        if (
            experiment.validity is not None
        ):  # the validity passages, each alone (evaluation/validity.py)
            judged = store.read_table("setting_queries", setting.key, VALIDITY_PASSAGES)
            prompts = pl.concat(
                [
                    prompts,
                    validity_prompts(queries, passages, judged, sampler.templates, sampler.budget),
                ]
            )
        reused = None
        if empty and (without := queries_without_passages(queries, run)):
            closed_book = store.read_table(
                "closed_book_generations", parts.closed_book_partition(context.partition_key)
            )
            reused = empty_retrieval_samples(closed_book, without)
        samples, result = sample_and_store(
            context,
            store,
            models,
            experiment,
            sampler,
            prompts,
            queries,
            "generations",
            setting.dataset,
            reused,
        )
        contexts_path = store.write_table("generations", context.partition_key, contexts, CONTEXTS)
        metadata = {
            **result.metadata,
            **context_metadata,
            **side_table_metadata(CONTEXTS, contexts, contexts_path),
        }
        yield dg.MaterializeResult(
            asset_key="generations", metadata=metadata, check_results=result.check_results
        )
        start = time.perf_counter()
        all_prompts = pl.concat(
            [
                chain.closed_book(sampler, queries),
                prompts,
                consens_prompts(
                    queries,
                    prompts,
                    passages,
                    sampler.templates,
                    sampler.budget,
                    experiment.consens.leave_one_out,
                    compressed,
                ),
            ]
        )
        scores = consens_scores(all_prompts, samples, queries, models.scorer(spec))
        seconds = dg.MetadataValue.float(time.perf_counter() - start)
        path = store.write_table("consens", context.partition_key, scores.per_query)
        left_out = scores.leave_one_out
        left_out_path = store.write_table(
            "consens", context.partition_key, left_out, CONSENS_LEAVE_ONE_OUT
        )
        metadata = {
            **table_metadata(scores.per_query, path),
            "signals_seconds": seconds,
            "mean_consens": dg.MetadataValue.float(
                float(scores.per_query["consens"].drop_nulls().mean() or 0.0)
            ),
            "leave_one_out_prompts": dg.MetadataValue.int(
                int((all_prompts["condition"] == CONSENS_LEAVE_OUT).sum())
            ),
            **side_table_metadata(CONSENS_LEAVE_ONE_OUT, left_out, left_out_path),
        }
        yield dg.MaterializeResult(asset_key="consens", metadata=metadata)

    return generations
