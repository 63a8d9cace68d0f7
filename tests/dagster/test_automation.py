"""Re-evaluation when a model changes: exactly the affected partitions are requested."""

from __future__ import annotations

import shutil

import dagster as dg
from safetensors.torch import load_file, save_file

from ragutil_dagster.assets import build_assets
from ragutil_dagster.automation import (
    WEEKLY_CRON,
    affected_runs,
    build_model_sensor,
    model_inventory,
)
from ragutil_dagster.config import parse_config
from ragutil_dagster.definitions import build_definitions


def perturb_weights(model_dir) -> None:
    path = next(model_dir.glob("*.safetensors"))
    tensors = load_file(path)
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 0.01
    save_file(tensors, path, metadata={"format": "pt"})


def requested(result: dg.SensorResult) -> set[tuple[tuple[str, ...], str]]:
    return {
        (tuple(sorted(k.to_user_string() for k in r.asset_selection)), r.partition_key)
        for r in result.run_requests or []
    }


def test_changing_one_generator_requests_only_its_partitions(
    tiny_world, make_tiny_config, tmp_path
) -> None:
    _, world, models = tiny_world
    second = tmp_path / "lm1"
    shutil.copytree(models.causal_lm, second)
    config = make_tiny_config(models, world, generators=2)
    config["generators"][1]["model"] = str(second)
    experiment = parse_config(config)
    _, assets = build_assets(experiment)
    sensor = build_model_sensor(experiment, assets)

    first = sensor(dg.build_sensor_context())
    assert not first.run_requests  # the first evaluation only records identities
    unchanged = sensor(dg.build_sensor_context(cursor=first.cursor))
    assert not unchanged.run_requests

    perturb_weights(second)
    changed = sensor(dg.build_sensor_context(cursor=first.cursor))
    scoring = (
        "candidate_scores",
        "consens",
        "document_scores",
        "entailment_clusters",
        "generations",
        "group_scores",
        "metric_scores",
        "nli_probabilities",
        "retrieval_correlations",
        "utility_generations",
        "utility_judgments",
        "utility_signals",
        "utility_transfer",
    )
    # lm0's transfer step answers with lm1's gold-utility passages, which may change with lm1.
    assert requested(changed) == {(("closed_book_generations",), "world|lm1")} | {
        (scoring, f"lm1|world__{r}__k{k}") for r in ("bm25", "dense") for k in (1, 2)
    } | {
        (("utility_transfer",), f"lm0|world__{r}__k{k}") for r in ("bm25", "dense") for k in (1, 2)
    }
    after = sensor(dg.build_sensor_context(cursor=changed.cursor))
    assert not after.run_requests


def test_moving_a_prompt_alias_requests_the_partitions_of_the_generators_using_it(
    tiny_world, make_tiny_config, tmp_path, monkeypatch
) -> None:
    from mlflow import MlflowClient

    _, world, models = tiny_world
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    registry = MlflowClient(tracking_uri=uri)
    registry.register_prompt("cb", "Question: {{ question }}\nAnswer:")
    registry.register_prompt("cb", "Q: {{ question }}\nA:")
    registry.set_prompt_alias("cb", "production", 1)
    config = make_tiny_config(models, world, generators=2)
    config["generators"][1]["prompts"] = {"closed_book": "prompts:/cb@production"}
    experiment = parse_config(config)
    _, assets = build_assets(experiment)
    sensor = build_model_sensor(experiment, assets, identity=lambda model, revision: "unchanged")
    first = sensor(dg.build_sensor_context())
    assert not sensor(dg.build_sensor_context(cursor=first.cursor)).run_requests
    registry.set_prompt_alias("cb", "production", 2)
    moved = sensor(dg.build_sensor_context(cursor=first.cursor))
    assert (("closed_book_generations",), "world|lm1") in requested(moved)
    # Of lm0, only the transfer step, which reads lm1's gold-utility passages.
    assert {names for names, key in requested(moved) if key.startswith("lm0")} == {
        ("utility_transfer",)
    }
    assert (("closed_book_generations",), "world|lm0") not in requested(moved)


def test_changed_nli_or_embedder_requests_their_downstream(tiny_experiment) -> None:
    parts, assets = build_assets(tiny_experiment)
    nli = {
        (tuple(sorted(k.to_user_string() for k in r.asset_selection)), r.partition_key)
        for r in affected_runs(["nli"], assets)
    }
    nli_steps = (
        "candidate_scores",
        "document_scores",
        "entailment_clusters",
        "group_scores",
        "metric_scores",
        "nli_probabilities",
        "retrieval_correlations",
        "utility_transfer",
    )
    assert nli == {(nli_steps, str(k)) for k in parts.setting_generator.get_partition_keys()}
    dense = {
        (tuple(k.to_user_string() for k in r.asset_selection), r.partition_key)
        for r in affected_runs(["retriever:dense"], assets)
    }
    assert (("index",), "world__dense") in dense
    assert (("passage_embeddings",), "world__dense__shard-1-of-1") in dense
    retrieval = tuple(
        sorted(("retrieval_run", "setting_queries", "retrieved_passages", "utility_candidates"))
    )
    assert {key for (assets, key) in dense if tuple(sorted(assets)) == retrieval} == {
        "world__dense__k1",
        "world__dense__k2",
    }
    assert not any("bm25" in key for _, key in dense)
    assert set(model_inventory(tiny_experiment)) == {"generator:lm0", "nli", "retriever:dense"}


def test_a_changed_embedder_requests_the_hybrids_fusing_its_retriever(
    tiny_world, make_tiny_config
) -> None:
    _, world, models = tiny_world
    config = make_tiny_config(models, world)
    config["retrievers"].append({"name": "hybrid", "kind": "hybrid", "fuse": ["bm25", "dense"]})
    experiment = parse_config(config)
    _, assets = build_assets(experiment)
    retrieval = {
        key
        for r in affected_runs(["retriever:dense"], assets)
        if "retrieval_run" in {k.to_user_string() for k in r.asset_selection}
        for key in [r.partition_key]
    }
    assert retrieval == {f"world__{r}__k{k}" for r in ("dense", "hybrid") for k in (1, 2)}


def test_every_asset_carries_the_weekly_condition(tiny_experiment, tmp_path) -> None:
    defs = build_definitions(tiny_experiment, str(tmp_path))
    graph = defs.resolve_asset_graph()
    observed = {key for key in graph.get_all_asset_keys() if not graph.get(key).is_materializable}
    assert observed == {dg.AssetKey(["model", kind]) for kind in ("generator", "nli", "embedder")}
    for key in graph.get_all_asset_keys() - observed:
        condition = graph.get(key).automation_condition
        assert condition is not None and WEEKLY_CRON in str(condition.get_label() or condition), key
    names = {s.name for s in defs.sensors}
    assert names == {"model_identity_sensor", "weekly_reevaluation"}


def test_model_identities_are_observed_as_data_versions(tiny_experiment) -> None:
    from ragutil_dagster.models.resolver import resolve
    from ragutil_dagster.resources.models import ModelLoader

    _, assets = build_assets(tiny_experiment)
    sources = {a.key.to_user_string(): a for a in assets if isinstance(a, dg.SourceAsset)}
    context = dg.build_op_context(resources={"models": ModelLoader()})
    generators = sources["model/generator"].observe_fn(context)
    assert generators.data_versions_by_partition == {
        g.name: dg.DataVersion(resolve(g.model).identity) for g in tiny_experiment.generators
    }
    nli = sources["model/nli"].observe_fn(context)
    assert nli == dg.DataVersion(resolve(tiny_experiment.nli.model).identity)
    embedders = sources["model/embedder"].observe_fn(context)
    assert set(embedders.data_versions_by_partition) == {"dense"}
