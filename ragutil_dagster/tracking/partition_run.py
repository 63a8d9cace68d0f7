"""What a ``metric_scores`` partition logs to its MLflow run: model identities, metrics with
bootstrap 95% intervals, cost figures, the per-query / per-document tables and plots."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import dagster as dg
import polars as pl

from ragutil_dagster.config import ExperimentConfig, Setting
from ragutil_dagster.evaluation.validity import validity_metrics
from ragutil_dagster.evaluation.world_scope import off_world_models, off_world_warning
from ragutil_dagster.infra.failpoints import failpoint
from ragutil_dagster.metrics import catalog
from ragutil_dagster.metrics.stats import bootstrap_mean_ci
from ragutil_dagster.models.device import PLACEMENT_ENTRIES
from ragutil_dagster.tracking import plots
from ragutil_dagster.tracking.keys import OFF_WORLD_TAG, ModelIdentities
from ragutil_dagster.tracking.resource import TrackedRun

# A partition run's tables, under ``scores/`` in its artifacts: what comparisons read back.
PER_QUERY_ARTIFACT = "table.parquet"
DOCUMENTS_ARTIFACT = "documents.parquet"
SUMMARY_ARTIFACT = "summary.json"
CORRELATIONS_ARTIFACT = "retrieval_correlations.parquet"
VALIDITY_ARTIFACT = "validity.parquet"  # the validity step's table (evaluation/validity.py)
VALIDITY_PASSAGES_ARTIFACT = "validity_passages.parquet"
TRANSFER_ARTIFACT = (
    "utility_transfer.parquet"  # LLM-specific utility's Table 1 (evaluation/transfer.py)
)
OVERLAP_ARTIFACT = "utility_overlap.parquet"  # ... and the overlap of gold-utility sets

"""Per-query columns whose mean is logged with a bootstrap 95% interval."""

UPSTREAM_FIGURES = {
    "closed_book_generations": (
        "sampling_seconds",
        "tokens_generated",
        "samples_drawn",
        "sample_fraction",
    ),
    "generations": (
        "sampling_seconds",
        "tokens_generated",
        "compression_seconds",
        "samples_drawn",
        "sample_fraction",
    ),
    "consens": ("signals_seconds",),
    "utility_generations": ("sampling_seconds", "tokens_generated"),
    "entailment_clusters": (
        "nli_seconds",
        "nli_pairs",
        "nli_pairs_without_dedup",
        "nli_pairs_computed",
        "nli_pairs_content_rejected",
    ),
}
"""Cost figures the upstream assets report in their Dagster metadata, logged per run."""
GENERATOR_DTYPE = "generator_dtype"
"""The metadata entry where the generation steps record the dtype their generator ran in."""
NLI_DTYPE = "nli_dtype"
"""The metadata entry where the NLI step (``nli_probabilities``) records the dtype its model ran in."""
RUN_FILE_VERSION = "run_file_version"
"""The metadata entry where a run retriever's retrieval step records the version of the run file it read."""
QUERY_WRITER_IDENTITY = "query_writer_identity"
"""The metadata entry where a multi-step round's retrieval step records its query writer's identity."""
NLI_IDENTITY = "nli_identity"
"""The metadata entry where the NLI step (``nli_probabilities``) records the identity of the model it ran."""
EMBEDDER_IDENTITY = "embedder_identity"
"""The metadata entry where a dense retriever's retrieval step records the identity of the embedder
that encoded its queries (a hybrid's: none, as its fused retrievers are several)."""
RERANKER_IDENTITY = "reranker_identity"
"""The metadata entry where the retrieval step records the identity of the reranker it ran."""


def partition_identities(
    experiment: ExperimentConfig,
    setting: Setting,
    samples: pl.DataFrame,
    instance: dg.DagsterInstance,
    partition: str,
) -> ModelIdentities:
    """The identity of every model behind a setting × generator ``partition``, each as the step
    that ran it recorded it — never resolved again here: the generator's from its sample rows and
    its dtype from the generations step, the NLI model's and its dtype from the NLI step, the
    embedder's, the reranker's, a run retriever's run file and a multi-step round's query writer
    from the retrieval step. A step that ran one of these models and recorded no identity (a
    materialisation of an older ragutil) is an error naming it."""
    generator = samples["model_identity"].unique().to_list()
    if len(generator) != 1:
        raise ValueError(
            f"{setting.key}: samples come from {len(generator)} model versions: {generator}"
        )
    retriever = experiment.retriever(setting.retriever)
    # One read of each step's latest materialisation, every entry taken from it.
    recorded = {
        asset: recorded_texts(instance, asset, key)
        for asset, key in (
            ("generations", partition),
            ("nli_probabilities", partition),
            ("retrieval_run", setting.key),
        )
    }

    def required(asset: str, name: str) -> str:
        value = recorded[asset].get(name)
        if value is None:
            key = setting.key if asset == "retrieval_run" else partition
            raise ValueError(
                f"{asset}[{key}] recorded no {name} (materialised by an older ragutil?): "
                f"materialise it again before {partition}'s metric_scores"
            )
        return value

    retrieval = recorded["retrieval_run"]
    return ModelIdentities(
        generator=generator[0],
        nli=required("nli_probabilities", NLI_IDENTITY),
        embedder=required("retrieval_run", EMBEDDER_IDENTITY)
        if retriever.kind == "dense"
        else None,
        reranker=required("retrieval_run", RERANKER_IDENTITY) if setting.reranker else None,
        generator_dtype=recorded["generations"].get(GENERATOR_DTYPE),
        nli_dtype=recorded["nli_probabilities"].get(NLI_DTYPE),
        run_file=retrieval.get(RUN_FILE_VERSION) if retriever.kind == "run" else None,
        query_writer=retrieval.get(QUERY_WRITER_IDENTITY) if setting.step is not None else None,
    )


def recorded_texts(instance: dg.DagsterInstance, asset: str, partition: str) -> dict[str, str]:
    """The text metadata entries of the latest materialisation of ``asset``'s ``partition`` (empty
    when it has none)."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]),
        limit=1,
    ).records
    metadata = records[0].asset_materialization.metadata if records else {}
    return {
        name: entry.value
        for name, entry in metadata.items()
        if isinstance(entry, dg.TextMetadataValue)
    }


def recorded_text(
    instance: dg.DagsterInstance, asset: str, partition: str, name: str
) -> str | None:
    """The text metadata entry ``name`` of the latest materialisation of ``asset``'s ``partition``."""
    return recorded_texts(instance, asset, partition).get(name)


def engine_placement_tags(
    instance: dg.DagsterInstance, generations_partition: str
) -> dict[str, str]:
    """How the generations step's vLLM CPU engine was placed (threads, reserved cores, KV cache;
    models/device.PLACEMENT_ENTRIES) as the step recorded it, as run tags ``ragutil.<entry>``:
    tags, not params, since a retry on another machine may place it differently."""
    recorded = recorded_texts(instance, "generations", generations_partition)
    return {f"ragutil.{name}": recorded[name] for name in PLACEMENT_ENTRIES if name in recorded}


def off_world_tags(
    experiment: ExperimentConfig, setting: Setting, generator: str
) -> dict[str, str]:
    """The tag warning that the partition's generator or NLI learnt only the synthetic world and
    its dataset is not that world (no tag otherwise)."""
    models = [experiment.generator(generator).model, experiment.nli.model]
    off = off_world_models(models, experiment.dataset(setting.dataset))
    return {OFF_WORLD_TAG: off_world_warning(off, f"dataset {setting.dataset!r}")} if off else {}


def interval_metrics(per_query: pl.DataFrame, seed: int = 0) -> dict[str, float]:
    """``<column>_ci_low`` / ``<column>_ci_high``: bootstrap 95% interval of each mean in
    ``catalog.with_ci()`` over queries (``metrics.stats.bootstrap_mean_ci``)."""
    out: dict[str, float] = {}
    for column in catalog.with_ci():
        if column not in per_query.columns:
            continue
        values = per_query[column].drop_nulls().to_numpy()
        if values.size < 2:
            continue
        interval = bootstrap_mean_ci(values, seed=seed)
        out[f"{column}_ci_low"] = interval.low
        out[f"{column}_ci_high"] = interval.high
    return out


def upstream_figures(
    instance: dg.DagsterInstance, partitions: Mapping[str, str]
) -> dict[str, float]:
    """Wall time, tokens and NLI pairs from the latest materialisation of each upstream asset
    (``partitions``: asset name → its partition key), named ``<asset>.<figure>``."""
    figures: dict[str, float] = {}
    for asset, names in UPSTREAM_FIGURES.items():
        if asset not in partitions:
            continue
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=dg.AssetKey(asset), asset_partitions=[partitions[asset]]
            ),
            limit=1,
        ).records
        if not records:
            continue
        metadata = records[0].asset_materialization.metadata
        for name in names:
            if name in metadata and isinstance(metadata[name].value, (int, float)):
                figures[f"{asset}.{name}"] = float(metadata[name].value)
    seconds = [v for k, v in figures.items() if k.endswith("_seconds")]
    if seconds:
        figures["upstream_seconds"] = sum(seconds)
    return figures


def cost_metrics(
    instance: dg.DagsterInstance,
    upstream: Mapping[str, str],
    samples: pl.DataFrame,
    nli: pl.DataFrame,
    scoring_seconds: float,
) -> dict[str, float]:
    """What a partition cost: scoring wall time, tokens generated (closed-book and context
    samples), distinct NLI pairs, and the upstream assets' own figures (:func:`upstream_figures`)."""
    return {
        "scoring_seconds": scoring_seconds,
        "tokens_generated": float(samples["n_tokens"].sum()),
        "nli_pairs": float(nli.height),
        **upstream_figures(instance, upstream),
    }


def partition_plots(
    summary: Mapping[str, float], per_query: pl.DataFrame, documents: pl.DataFrame, directory: Path
) -> list[Path]:
    """The partition's three plots: ΔSePer distribution, per-document ΔSePer by rank, MIRAGE bar."""
    return [
        plots.delta_seper_distribution(per_query, directory / "delta_seper_distribution.png"),
        plots.delta_seper_by_rank(documents, directory / "delta_seper_by_rank.png"),
        plots.mirage_bar(summary, directory / "mirage.png"),
    ]


def log_partition(
    run: TrackedRun,
    params: Mapping[str, str],
    summary: Mapping[str, float],
    per_query: pl.DataFrame,
    extra_metrics: Mapping[str, float],
    tables: Mapping[str, Path],
    plot_directory: Path,
    documents: pl.DataFrame,
    seed: int = 0,
) -> dict[str, float]:
    """Log params, metrics (summary means, their 95% intervals, ``extra_metrics``), the tables
    (``tables``: artifact file name → stored file; under ``scores/``) and the plots (under
    ``plots/``); return the metrics."""
    metrics = {**summary, **interval_metrics(per_query, seed), **extra_metrics}
    run.log_params(params)
    failpoint("mlflow")
    run.log_metrics(metrics)
    with tempfile.TemporaryDirectory() as staging:  # MLflow names an artifact after its file
        for name, path in tables.items():
            staged = Path(staging) / name
            shutil.copyfile(path, staged)
            run.log_artifact(staged, "scores")
    for path in partition_plots(summary, per_query, documents, plot_directory):
        run.log_artifact(path, "plots")
    return metrics


def log_step_tables(
    run: TrackedRun, metrics: dict[str, float], tables: Mapping[str, pl.DataFrame]
) -> dict[str, float]:
    """Log a step's figures after ``metric_scores`` to the partition's run, and its tables (artifact
    file name → table) under ``scores/``; return the metrics."""
    run.log_metrics(metrics)
    with tempfile.TemporaryDirectory() as staging:
        for name, table in tables.items():
            table.write_parquet(Path(staging) / name)
            run.log_artifact(Path(staging) / name, "scores")
    return metrics


def log_validity(
    run: TrackedRun, validity: pl.DataFrame, passages: pl.DataFrame
) -> dict[str, float]:
    """Log the validity step's figures (``validity_metrics``), table and per-passage scores."""
    return log_step_tables(
        run,
        validity_metrics(validity),
        {VALIDITY_ARTIFACT: validity, VALIDITY_PASSAGES_ARTIFACT: passages},
    )
