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
from collections.abc import Callable, Iterable

import dagster as dg

from ragutil_dagster.assets.partitions import Partitions
from ragutil_dagster.config import ExperimentConfig

SCORING = ["entailment_clusters", "metric_scores"]
SETTING_GENERATOR_STEPS = ["generations", *SCORING]


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


def _requests(assets: list[str], keys: Iterable[str], reason: str) -> list[dg.RunRequest]:
    return [
        dg.RunRequest(asset_selection=[dg.AssetKey(a) for a in assets], partition_key=key, tags={"ragutil/reason": reason})
        for key in keys
    ]


def affected_runs(changed: Iterable[str], experiment: ExperimentConfig, parts: Partitions) -> list[dg.RunRequest]:
    """The runs a change of the models in ``changed`` (inventory keys) calls for, without repeats."""
    changed = set(changed)
    sg_keys = parts.setting_generator.get_partition_keys()
    requests: dict[tuple, dg.RunRequest] = {}

    def add(batch: list[dg.RunRequest]) -> None:
        for request in batch:
            requests.setdefault((tuple(k.to_user_string() for k in request.asset_selection), request.partition_key), request)

    retrieval_changed = {r.name for r in experiment.retrievers if f"retriever:{r.name}" in changed}
    if "reranker" in changed:
        retrieval_changed = {r.name for r in experiment.retrievers}
    for key in sorted(changed):
        if key.startswith("generator:"):
            name = key.removeprefix("generator:")
            add(_requests(["closed_book_generations"],
                          [str(k) for k in parts.dataset_generator.get_partition_keys() if k.keys_by_dimension["generator"] == name], key))
            add(_requests(SETTING_GENERATOR_STEPS,
                          [str(k) for k in sg_keys if k.keys_by_dimension["generator"] == name], key))
    if retrieval_changed:
        reason = ",".join(sorted(changed & ({f"retriever:{r}" for r in retrieval_changed} | {"reranker"})))
        if "reranker" not in changed:
            add(_requests(["index"], [f"{d.name}__{r}" for d in experiment.datasets for r in sorted(retrieval_changed)], reason))
        settings = [s.key for s in experiment.settings() if s.retriever in retrieval_changed]
        add(_requests(["retrieval_run"], settings, reason))
        add(_requests(SETTING_GENERATOR_STEPS, [str(k) for k in sg_keys if k.keys_by_dimension["setting"] in settings], reason))
    if "nli" in changed:
        add(_requests(SCORING, [str(k) for k in sg_keys], "nli"))
    return list(requests.values())


def build_model_sensor(
    experiment: ExperimentConfig, parts: Partitions, identity: Callable[[str, str | None], str] | None = None
) -> dg.SensorDefinition:
    def current_identity(model: str, revision: str | None) -> str:
        if identity is not None:
            return identity(model, revision)
        from ragutil_dagster.errors import ModelUnavailableError
        from ragutil_dagster.models.resolver import resolve

        try:
            return resolve(model, revision).identity
        except ModelUnavailableError as err:
            return f"unavailable: {err}"

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
        return dg.SensorResult(run_requests=affected_runs(changed, experiment, parts), cursor=json.dumps(now, sort_keys=True))

    return model_identity_sensor


WEEKLY_CRON = "0 3 * * 1"
WEEKLY = dg.AutomationCondition.on_cron(WEEKLY_CRON)
"""The weekly re-evaluation, declared on every asset: after each Monday-03:00 tick, an asset
partition runs once all its dependencies have updated since the tick, so the whole graph is
re-evaluated in order (roots first), across its different partitionings — which a single
scheduled job cannot span."""


def with_weekly_reevaluation(assets: list[dg.AssetsDefinition]) -> list[dg.AssetsDefinition]:
    return [a.map_asset_specs(lambda spec: spec.replace_attributes(automation_condition=WEEKLY)) for a in assets]


def build_automation(experiment: ExperimentConfig, parts: Partitions) -> list[dg.SensorDefinition]:
    """The model-identity sensor and the sensor evaluating the weekly automation conditions."""
    return [
        build_model_sensor(experiment, parts),
        dg.AutomationConditionSensorDefinition(
            "weekly_reevaluation", target=dg.AssetSelection.all(), default_status=dg.DefaultSensorStatus.STOPPED,
            description=f"Re-evaluates every asset partition weekly (cron {WEEKLY_CRON!r}), in dependency order.",
        ),
    ]
