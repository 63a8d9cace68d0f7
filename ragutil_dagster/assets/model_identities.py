"""``model/<kind>``: the identities of the configured models as observable source assets.

Their data version is the model's identity (hub commit, directory fingerprint, ``gguf:<sha256>``,
registry version), per generator and per dense retriever's embedder; observing them (the UI's
"Observe sources", or the model-identity sensor's re-evaluation) marks exactly what a new model
made stale, through the assets' declared dependencies on them."""

from __future__ import annotations

import dagster as dg

from ragutil_dagster.assets.common import GROUP, model_asset_key
from ragutil_dagster.assets.partitions import Partitions
from ragutil_dagster.config import ExperimentConfig
from ragutil_dagster.errors import ModelUnavailableError


def observed_identity(models, model: str, revision: str | None) -> str:
    """A model's identity, or ``unavailable: <why>`` when it cannot be resolved here (a served
    model known by name only; a hub model offline) — observed, never a crash."""
    try:
        return models.identity(model, revision)
    except ModelUnavailableError as err:
        return f"unavailable: {err}"


def generator_identities(experiment: ExperimentConfig, models) -> dict[str, str]:
    return {g.name: observed_identity(models, g.model, g.revision) for g in experiment.generators}


def embedder_identities(experiment: ExperimentConfig, models) -> dict[str, str]:
    """Per dense retriever, its embedder's identity (empty without a dense retriever)."""
    return {
        r.name: observed_identity(models, r.model, r.revision)
        for r in experiment.retrievers
        if r.kind == "dense"
    }


def model_versions(
    experiment: ExperimentConfig, models
) -> dict[dg.AssetKey, dict[str | None, str]]:
    """What observing every model identity source asset reports: its data version per partition
    (``None``: an unpartitioned source)."""
    nli = experiment.nli
    versions = {
        model_asset_key("generator"): generator_identities(experiment, models),
        model_asset_key("nli"): {None: observed_identity(models, nli.model, nli.revision)},
    }
    if embedders := embedder_identities(experiment, models):
        versions[model_asset_key("embedder")] = embedders
    if (reranker := experiment.reranker) is not None:
        versions[model_asset_key("reranker")] = {
            None: observed_identity(models, reranker.model, reranker.revision)
        }
    return versions


def build(parts: Partitions) -> list[dg.SourceAsset]:
    experiment = parts.experiment
    sources: list[dg.SourceAsset] = []

    @dg.observable_source_asset(
        key=model_asset_key("generator"),
        partitions_def=parts.generator,
        group_name=GROUP,
        required_resource_keys={"models"},
        description="Identity of each configured generator (one partition per generator).",
    )
    def generator_identities_source(context) -> dg.DataVersionsByPartition:
        return dg.DataVersionsByPartition(
            generator_identities(experiment, context.resources.models)
        )

    @dg.observable_source_asset(
        key=model_asset_key("nli"),
        group_name=GROUP,
        required_resource_keys={"models"},
        description="Identity of the answer-equivalence NLI model.",
    )
    def nli_identity(context) -> dg.DataVersion:
        nli = experiment.nli
        return dg.DataVersion(observed_identity(context.resources.models, nli.model, nli.revision))

    sources += [generator_identities_source, nli_identity]
    dense = parts.dense_retrievers()
    if dense is not None:

        @dg.observable_source_asset(
            key=model_asset_key("embedder"),
            partitions_def=dense,
            group_name=GROUP,
            required_resource_keys={"models"},
            description="Identity of each dense retriever's embedder (one partition per retriever).",
        )
        def embedder_identities(context) -> dg.DataVersionsByPartition:
            return dg.DataVersionsByPartition(
                {
                    r.name: observed_identity(context.resources.models, r.model, r.revision)
                    for r in experiment.retrievers
                    if r.kind == "dense"
                }
            )

        sources.append(embedder_identities)
    if experiment.reranker is not None:

        @dg.observable_source_asset(
            key=model_asset_key("reranker"),
            group_name=GROUP,
            required_resource_keys={"models"},
            description="Identity of the reranker.",
        )
        def reranker_identity(context) -> dg.DataVersion:
            reranker = experiment.reranker
            return dg.DataVersion(
                observed_identity(context.resources.models, reranker.model, reranker.revision)
            )

        sources.append(reranker_identity)
    return sources
