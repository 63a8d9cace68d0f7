"""Re-evaluation when models change, and a weekly full re-evaluation.

The ``model_identity_sensor`` observes, every few minutes, the identity of every configured model
(hub commit, local-directory fingerprint; ``ragutil_dagster.models.identity``) and keeps the last
seen identities in its cursor. A changed generator requests only that generator's partitions —
its closed-book samples and, for every setting, its generations, NLI clusters and scores; a
changed NLI model requests every ``entailment_clusters`` and ``metric_scores`` partition; a
changed embedder or reranker requests the retrieval steps that use it and everything downstream
of them. It watches the run files of ``kind: run`` retrievers the same way, by their SHA-256: a
replaced file requests the settings reading it and what follows them. A prompt template named by
a registry alias (``prompts:/<name>@<alias>``) is watched with its generator: moving the alias to
another version requests that generator's partitions, as a new model would (an alias of the
experiment's ``prompts`` is every generator's). The first evaluation records a baseline and
requests nothing.

Runs that need both a generator's closed-book samples and its context samples check that both
come from the same model identity, so a scoring run never mixes an old and a new model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence

import dagster as dg
from dagster._core.definitions.assets.graph.asset_graph import AssetGraph

from ragutil_dagster.assets.common import model_asset_key
from ragutil_dagster.assets.model_identities import observed_identity
from ragutil_dagster.assets.run_files import RUN_FILE, run_file_versions
from ragutil_dagster.config import ExperimentConfig
from ragutil_dagster.infra.prompt_registry import registered_template
from ragutil_dagster.prompts import ROLES
from ragutil_dagster.resources.models import ModelLoader


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


def prompt_alias_versions(experiment: ExperimentConfig, generator: str) -> str:
    """The registry versions the aliases among ``generator``'s templates point to now, asked of the
    registry anew (``role=prompts:/name@alias→version``, comma-joined); empty without an alias."""
    prompts = experiment.prompts_for(generator)
    aliased = {
        role: template.source
        for role in ROLES
        if (template := getattr(prompts, role, None)) is not None
        and template.version is not None
        and "@" in template.source
    }
    return ",".join(
        f"{role}={source}→{registered_template(source).version}"
        for role, source in sorted(aliased.items())
    )


# Inventory role (``generator:<name>``, ``nli``, ``retriever:<name>``, ``reranker``,
# ``run_file:<dataset__retriever>``) → the source asset it is observed as.
_SOURCE_ASSET = {
    "generator": model_asset_key("generator"),
    "nli": model_asset_key("nli"),
    "retriever": model_asset_key("embedder"),
    "reranker": model_asset_key("reranker"),
    "run_file": RUN_FILE,
}


def _downstream_partitions(graph: AssetGraph, role: str) -> dict[dg.AssetKey, set[str]]:
    """The partitions of every partitioned asset of ``graph`` that reads, directly or through its
    parents, the model or run file of inventory key ``role``: from its partition of its source
    asset (a generator's, a dense retriever's, a run file's; the NLI model and the reranker serve
    all), through each dependency's declared partition mapping."""
    kind, _, name = role.partition(":")
    frontier: list[tuple[dg.AssetKey, str | None]] = [(_SOURCE_ASSET[kind], name or None)]
    seen: set[tuple[dg.AssetKey, str | None]] = set()
    while frontier:
        for child in graph.get_children_partitions(*frontier.pop()):
            node = (
                child.asset_key,
                None if child.partition_key is None else str(child.partition_key),
            )
            if node not in seen:
                seen.add(node)
                frontier.append(node)
    reached: dict[dg.AssetKey, set[str]] = {}
    for key, partition in seen:
        if partition is not None:
            reached.setdefault(key, set()).add(partition)
    return reached


def affected_runs(
    changed: Iterable[str], assets: Sequence[dg.AssetsDefinition | dg.SourceAsset]
) -> list[dg.RunRequest]:
    """The runs a change of the models in ``changed`` (inventory keys) calls for, read off the
    asset graph: the partitions downstream of that model's partition of its identity source
    asset — one run per partition key for the assets sharing a partitioning. Unpartitioned
    assets (reports) are left to the next full run: they would race the partition runs they
    summarise."""
    by_key = {  # declaration order
        spec.key: asset
        for asset in assets
        if isinstance(asset, dg.AssetsDefinition)
        for spec in asset.specs
    }
    # The graph AssetSelection.resolve builds; Definitions.resolve_asset_graph would also ask for
    # the resources, which the graph's partition mappings do not need.
    graph = AssetGraph.from_assets(list(assets))
    requests: dict[tuple[tuple[str, ...], str], set[str]] = {}
    for role in sorted(set(changed)):
        affected = _downstream_partitions(graph, role)
        groups: dict[object, list[dg.AssetKey]] = {}
        for key in sorted(affected, key=lambda k: k.to_user_string()):
            groups.setdefault(id(by_key[key].partitions_def), []).append(key)
        for keys in groups.values():
            for partition in map(str, by_key[keys[0]].partitions_def.get_partition_keys()):
                if names := tuple(k.to_user_string() for k in keys if partition in affected[k]):
                    requests.setdefault((names, partition), set()).add(role)
    return [
        dg.RunRequest(
            asset_selection=[dg.AssetKey(name) for name in names],
            partition_key=partition,
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
        return observed_identity(ModelLoader(), model, revision)

    @dg.sensor(
        name="model_identity_sensor",
        minimum_interval_seconds=300,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Re-evaluates exactly the partitions that depend on a model whose identity changed, "
        "or on a run file whose content changed.",
    )
    def model_identity_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        seen = json.loads(context.cursor) if context.cursor else None
        now = {
            role: current_identity(model, revision)
            for role, (model, revision) in model_inventory(experiment).items()
        }
        for generator in experiment.generators:
            if versions := prompt_alias_versions(experiment, generator.name):
                now[f"generator:{generator.name}"] += f" prompts[{versions}]"
        now.update(
            {f"run_file:{key}": version for key, version in run_file_versions(experiment).items()}
        )
        if seen is None:
            return dg.SensorResult(run_requests=[], cursor=json.dumps(now, sort_keys=True))
        changed = [
            role
            for role, value in now.items()
            if seen.get(role) != value and not value.startswith("unavailable")
        ]
        for role in changed:
            context.log.info(f"{role}: identity {seen.get(role)} → {now[role]}")
        return dg.SensorResult(
            run_requests=affected_runs(changed, assets), cursor=json.dumps(now, sort_keys=True)
        )

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
        if isinstance(a, dg.AssetsDefinition)
        else a
        for a in assets
    ]


def build_automation(
    experiment: ExperimentConfig, assets: Sequence[dg.AssetsDefinition | dg.SourceAsset]
) -> list[dg.SensorDefinition]:
    """The model-identity sensor and the sensor evaluating the weekly automation conditions."""
    return [
        build_model_sensor(experiment, assets),
        dg.AutomationConditionSensorDefinition(
            "weekly_reevaluation",
            target=dg.AssetSelection.all(),
            default_status=dg.DefaultSensorStatus.STOPPED,
            description=f"Re-evaluates every asset partition weekly (cron {WEEKLY_CRON!r}), in dependency order.",
        ),
    ]
