"""Re-evaluation when models change, and a weekly full re-evaluation.

The ``model_identity_sensor`` observes, every few minutes, the identity of every configured model
(hub commit, local-directory fingerprint; ``ragutil_dagster.models.identity``) and keeps the last
seen identities in its cursor. A changed generator requests only that generator's partitions —
its closed-book samples and, for every setting, its generations, NLI clusters and scores; a
changed NLI model requests every ``entailment_clusters`` and ``metric_scores`` partition; a
changed embedder or reranker requests the retrieval steps that use it and everything downstream
of them. The first evaluation records a baseline and requests nothing.

Runs that need both a generator's closed-book samples and its context samples check that both
come from the same model identity, so a scoring run never mixes an old and a new model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence

import dagster as dg

from ragutil_dagster.assets.common import model_asset_key
from ragutil_dagster.assets.model_identities import observed_identity
from ragutil_dagster.config import (
    KEY_SEPARATOR,
    ExperimentConfig,
    Setting,
    parse_embedding_partition_key,
    parse_index_partition_key,
)
from ragutil_dagster.resources.models import ModelRegistry


def model_inventory(experiment: ExperimentConfig) -> dict[str, tuple[str, str | None]]:
    """Every model the experiment uses, keyed by its role: ``generator:<name>``, ``nli``,
    ``retriever:<name>`` (dense only), ``reranker``."""
    models: dict[str, tuple[str, str | None]] = {
        f"generator:{g.name}": (g.model, g.revision) for g in experiment.generators
    }
    models["nli"] = (experiment.nli.model, experiment.nli.revision)
    for r in experiment.retrievers:
        if r.kind == "dense" and r.model:
            models[f"retriever:{r.name}"] = (r.model, r.revision)
    if experiment.reranker:
        models["reranker"] = (experiment.reranker.model, experiment.reranker.revision)
    return models


def _partition_matches(role: str, key: str | dg.MultiPartitionKey, experiment: ExperimentConfig) -> bool:
    """Whether an asset partition depends on the model of inventory key ``role``."""
    kind, _, name = role.partition(":")
    dims = key.keys_by_dimension if isinstance(key, dg.MultiPartitionKey) else _static_dimension(key)
    if kind == "generator":
        return dims.get("generator") == name
    if kind == "retriever":
        if "setting" in dims:  # a hybrid's settings search the indexes of the retrievers it fuses
            searched = experiment.searched_indexes(Setting.parse(dims["setting"]))
            return any(parse_index_partition_key(index)[1] == name for index in searched)
        if "index" in dims:
            return parse_index_partition_key(dims["index"])[1] == name
    return True  # the NLI model and the reranker serve every partition that reads them


def _static_dimension(key: str) -> dict[str, str]:
    """A single partition key by what it names: an embedding shard (by its index: both use the
    same embedder), a setting, an index or a dataset (names never contain the separator, so the
    number of parts tells the last three apart)."""
    if shard := parse_embedding_partition_key(key):
        return {"index": shard[0]}
    parts = key.count(KEY_SEPARATOR) + 1
    return {"setting": key} if parts >= 3 else {"index": key} if parts == 2 else {"dataset": key}


# Inventory role (``generator:<name>``, ``nli``, ``retriever:<name>``, ``reranker``) → the kind of
# model-identity source asset it is observed as.
_MODEL_KIND = {"generator": "generator", "nli": "nli", "retriever": "embedder", "reranker": "reranker"}


def affected_runs(
    changed: Iterable[str], assets: Sequence[dg.AssetsDefinition | dg.SourceAsset], experiment: ExperimentConfig
) -> list[dg.RunRequest]:
    """The runs a change of the models in ``changed`` (inventory keys) calls for, read off the
    asset graph: everything downstream of that model's identity source asset, in the partitions
    that depend on that model — one run per partition key for the assets sharing a
    partitioning. Unpartitioned assets (reports) are left to the next full run: they would race
    the partition runs they summarise."""
    by_key = {  # declaration order
        spec.key: asset for asset in assets if isinstance(asset, dg.AssetsDefinition) for spec in asset.specs
    }
    requests: dict[tuple[tuple[str, ...], str], set[str]] = {}
    for role in sorted(set(changed)):
        source = model_asset_key(_MODEL_KIND[role.partition(":")[0]])
        affected = dg.AssetSelection.assets(source).downstream().resolve(list(assets)) - {source}
        groups: dict[object, list[dg.AssetKey]] = {}
        for key in sorted(affected, key=lambda k: k.to_user_string()):
            partitions = by_key[key].partitions_def
            if partitions is not None:
                groups.setdefault(id(partitions), []).append(key)
        for keys in groups.values():
            names = tuple(k.to_user_string() for k in keys)
            for partition in by_key[keys[0]].partitions_def.get_partition_keys():
                if _partition_matches(role, partition, experiment):
                    requests.setdefault((names, str(partition)), set()).add(role)
    return [
        dg.RunRequest(
            asset_selection=[dg.AssetKey(name) for name in names], partition_key=partition,
            tags={"ragutil/reason": ",".join(sorted(roles))},
        )
        for (names, partition), roles in requests.items()
    ]


def build_model_sensor(
    experiment: ExperimentConfig,
    assets: Sequence[dg.AssetsDefinition | dg.SourceAsset],
    identity: Callable[[str, str | None], str] | None = None,
) -> dg.SensorDefinition:
    def current_identity(model: str, revision: str | None) -> str:
        if identity is not None:
            return identity(model, revision)
        return observed_identity(ModelRegistry(), model, revision)

    @dg.sensor(
        name="model_identity_sensor", minimum_interval_seconds=300,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Re-evaluates exactly the partitions that depend on a model whose identity changed.",
    )
    def model_identity_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        seen = json.loads(context.cursor) if context.cursor else None
        now = {role: current_identity(model, revision) for role, (model, revision) in model_inventory(experiment).items()}
        if seen is None:
            return dg.SensorResult(run_requests=[], cursor=json.dumps(now, sort_keys=True))
        changed = [role for role, value in now.items() if seen.get(role) != value and not value.startswith("unavailable")]
        for role in changed:
            context.log.info(f"{role}: identity {seen.get(role)} → {now[role]}")
        return dg.SensorResult(run_requests=affected_runs(changed, assets, experiment), cursor=json.dumps(now, sort_keys=True))

    return model_identity_sensor


WEEKLY_CRON = "0 3 * * 1"
WEEKLY = dg.AutomationCondition.on_cron(WEEKLY_CRON)
"""The weekly re-evaluation, declared on every asset: after each Monday-03:00 tick, an asset
partition runs once all its dependencies have updated since the tick, so the whole graph is
re-evaluated in order (roots first), across its different partitionings — which a single
scheduled job cannot span."""


def with_weekly_reevaluation(
    assets: list[dg.AssetsDefinition | dg.SourceAsset],
) -> list[dg.AssetsDefinition | dg.SourceAsset]:
    """Every materialisable asset with the weekly condition (source assets are observed only)."""
    return [
        a.map_asset_specs(lambda spec: spec.replace_attributes(automation_condition=WEEKLY))
        if isinstance(a, dg.AssetsDefinition) else a
        for a in assets
    ]


def build_automation(
    experiment: ExperimentConfig, assets: Sequence[dg.AssetsDefinition | dg.SourceAsset]
) -> list[dg.SensorDefinition]:
    """The model-identity sensor and the sensor evaluating the weekly automation conditions."""
    return [
        build_model_sensor(experiment, assets),
        dg.AutomationConditionSensorDefinition(
            "weekly_reevaluation", target=dg.AssetSelection.all(), default_status=dg.DefaultSensorStatus.STOPPED,
            description=f"Re-evaluates every asset partition weekly (cron {WEEKLY_CRON!r}), in dependency order.",
        ),
    ]
