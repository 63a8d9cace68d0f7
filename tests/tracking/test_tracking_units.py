"""Run keys, run reuse and terminal statuses, and the comparison tables — without the pipeline."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl
import pytest
from mlflow import MlflowClient

from ragutil_dagster.config import AdaptiveSamplingConfig, ERAGConfig, Setting, parse_config
from ragutil_dagster.metrics import catalog
from ragutil_dagster.metrics.stats import (
    bootstrap_mean_ci,
    bootstrap_paired_diff_ci,
    paired_permutation_test,
)
from ragutil_dagster.tracking import MlflowTracking
from ragutil_dagster.tracking.compare import (
    PartitionScores,
    best_settings,
    build_comparison,
    long_table,
    paired_retriever_tests,
    prompt_table,
    wide_table,
)
from ragutil_dagster.tracking.keys import RUN_KEY_TAG, ModelIdentities, PartitionRun


@pytest.fixture(scope="module")
def config():
    return parse_config(
        {
            "name": "units",
            "datasets": [{"name": "world", "format": "synthetic", "path": "/nonexistent"}],
            "retrievers": [
                {"name": "bm25", "kind": "bm25"},
                {"name": "dense", "kind": "dense", "model": "some/embedder"},
            ],
            "k": [1, 5],
            "generators": [
                {"name": "lm0", "model": "some/lm"},
                {"name": "lm1", "model": "other/lm"},
            ],
            "nli": {"model": "some/nli"},
        }
    )


def test_run_key_changes_with_any_input_and_only_then(config) -> None:
    identities = ModelIdentities(generator="sha256:aa", nli="sha256:bb", embedder="sha256:cc")
    setting = Setting("world", "dense", 5)
    run = PartitionRun(config, setting, "lm0", identities)
    assert (
        run.key
        == PartitionRun(
            config, setting, "lm0", ModelIdentities("sha256:aa", "sha256:bb", "sha256:cc")
        ).key
    )
    changed = [
        PartitionRun(
            config, setting, "lm0", ModelIdentities("sha256:ab", "sha256:bb", "sha256:cc")
        ),
        PartitionRun(
            config, setting, "lm0", ModelIdentities("sha256:aa", "sha256:bx", "sha256:cc")
        ),
        PartitionRun(
            config, setting, "lm0", ModelIdentities("sha256:aa", "sha256:bb", "sha256:cx")
        ),
        PartitionRun(
            config,
            setting,
            "lm0",
            ModelIdentities("sha256:aa", "sha256:bb", "sha256:cc", run_file="sha256:dd"),
        ),
        PartitionRun(config, Setting("world", "dense", 1), "lm0", identities),
        PartitionRun(config, setting, "lm1", identities),
        PartitionRun(config.model_copy(update={"seed": 1}), setting, "lm0", identities),
        PartitionRun(
            config.model_copy(update={"erag": ERAGConfig(label="token_f1")}),
            setting,
            "lm0",
            identities,
        ),
        PartitionRun(config, setting, "lm0", identities, version="0.0.0-other"),
    ]
    assert len({run.key} | {other.key for other in changed}) == len(changed) + 1
    params = run.params()
    assert params["embedder"] == "some/embedder" and params["embedder_identity"] == "sha256:cc"
    assert params["run_file_version"] == "none"
    assert (
        params["generator_identity"] == "sha256:aa"
        and params["k"] == "5"
        and params["reranker"] == "none"
    )
    assert (
        params["n"] == "10" and params["max_new_tokens"] == "512" and params["temperature"] == "1.0"
    )
    assert (
        params["erag_label"] == "exact_match" and changed[-2].params()["erag_label"] == "token_f1"
    )
    assert (params["utility_candidates"], params["utility_methods"]) == (
        "20",
        "listwise_answer,ranking_answer",
    )
    no_methods = config.model_copy(
        update={"utility": config.utility.model_copy(update={"methods": ()})}
    )
    assert (
        PartitionRun(no_methods, setting, "lm0", identities).params()["utility_methods"] == "none"
    )
    adaptive = config.model_copy(
        update={
            "sampling": config.sampling.model_copy(update={"adaptive": AdaptiveSamplingConfig()})
        }
    )
    assert params["adaptive"] == "none"
    assert (
        PartitionRun(adaptive, setting, "lm0", identities).params()["adaptive"]
        == "first_round=4,round_size=2,target_se=0.24,closed_book_target_se=0.01"
    )


@pytest.fixture()
def tracking(tmp_path) -> MlflowTracking:
    return MlflowTracking(home=str(tmp_path))


@pytest.mark.slow
def test_failure_marks_failed_and_a_retry_or_an_orphan_is_reused(tracking: MlflowTracking) -> None:
    with (
        pytest.raises(RuntimeError, match="scoring broke"),
        tracking.run(
            "ragutil/units", "key-1", "first", "partition", {"dagster.run_id": "a"}
        ) as run,
    ):
        run.log_metrics({"x": 1.0})
        raise RuntimeError("scoring broke")
    client = MlflowClient(tracking.uri)
    assert client.get_run(run.run_id).info.status == "FAILED"
    with tracking.run(
        "ragutil/units", "key-1", "first", "partition", {"dagster.run_id": "b"}
    ) as retry:
        assert retry.reused and retry.run_id == run.run_id
        assert client.get_run(run.run_id).info.status == "RUNNING"
        retry.log_metrics({"x": 2.0})
    finished = client.get_run(run.run_id)
    assert finished.info.status == "FINISHED"
    assert finished.data.metrics["x"] == 2.0 and finished.data.tags["dagster.run_id"] == "b"
    # A process killed mid-run leaves its run RUNNING: the next attempt takes it over.
    experiment_id = tracking.experiment_id("ragutil/units")
    orphan = client.create_run(experiment_id, tags={RUN_KEY_TAG: "key-2"}).info.run_id
    with tracking.run("ragutil/units", "key-2", "second", "partition", {}) as resumed:
        assert resumed.reused and resumed.run_id == orphan
    assert client.get_run(orphan).info.status == "FINISHED"
    assert len(client.search_runs([experiment_id])) == 2
    assert resumed.url == f"http://127.0.0.1:5000/#/experiments/{experiment_id}/runs/{orphan}"


@pytest.mark.slow
def test_default_store_lives_under_home(tracking: MlflowTracking, tmp_path) -> None:
    assert tracking.uri == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    experiment = MlflowClient(tracking.uri).get_experiment(tracking.experiment_id("ragutil/world"))
    assert (
        experiment.artifact_location == (tmp_path.resolve() / "mlruns" / "ragutil_world").as_uri()
    )
    server = MlflowTracking(home=str(tmp_path), tracking_uri="http://127.0.0.1:5555/")
    assert server.run_url("3", "abc") == "http://127.0.0.1:5555/#/experiments/3/runs/abc"


def _partition(
    retriever: str, k: int, generator: str, values: list[float], summary: dict[str, float]
) -> PartitionScores:
    per_query = pl.DataFrame(
        {"query_id": [f"q{i}" for i in range(len(values))], "delta_seper_s": values}
    )
    return PartitionScores(Setting("world", retriever, k), generator, summary, per_query)


def test_comparison_tables_follow_the_papers_layouts_and_test_pairs() -> None:
    rng = np.random.default_rng(0)
    parts = []
    for retriever in ("bm25", "dense"):
        for k in (1, 5):
            for generator in ("a", "b"):
                values = rng.normal(0.1 if retriever == "dense" else 0.0, 0.05, 30).tolist()
                summary = {
                    "delta_seper_s": float(np.mean(values)),
                    f"erag_P_{k}": 0.5,
                    "erag_map": 0.4,
                    "mirage_noise_vulnerability": 0.1,
                    "mirage_context_acceptability": 0.2,
                    "mirage_context_insensitivity": 0.3,
                    "mirage_context_misinterpretation": 0.4,
                }
                parts.append(_partition(retriever, k, generator, values, summary))
    comparison = build_comparison(parts)
    wide = comparison.tables["delta_seper_s"]
    assert wide.columns == ["dataset", "retriever", "k=1 a", "k=1 b", "k=5 a", "k=5 b"]
    dense_k5_b = next(
        p
        for p in parts
        if p.setting.retriever == "dense" and p.setting.k == 5 and p.generator == "b"
    )
    assert wide.filter(pl.col("retriever") == "dense")["k=5 b"].item() == pytest.approx(
        dense_k5_b.summary["delta_seper_s"]
    )
    assert (
        "erag_P_at_k" in comparison.tables["erag_utility"].columns
    )  # erag_P_1 and erag_P_5 share a column
    mirage = comparison.tables["mirage"]
    assert mirage.columns == ["dataset", "k", "generator", "retriever", "NV", "CA", "CI", "CM"]
    assert mirage["CM"].to_list() == pytest.approx([40.0] * 8)
    tests = comparison.tables["paired_tests"]
    assert tests.height == 4  # one bm25-vs-dense test per k × generator
    for row in tests.iter_rows(named=True):
        a = next(
            p
            for p in parts
            if (p.setting.retriever, p.setting.k, p.generator)
            == ("bm25", row["k"], row["generator"])
        )
        b = next(
            p
            for p in parts
            if (p.setting.retriever, p.setting.k, p.generator)
            == ("dense", row["k"], row["generator"])
        )
        x, y = a.per_query["delta_seper_s"].to_numpy(), b.per_query["delta_seper_s"].to_numpy()
        interval = bootstrap_paired_diff_ci(x, y)
        assert (row["difference"], row["ci_low"], row["ci_high"]) == pytest.approx(
            (interval.estimate, interval.low, interval.high)
        )
        assert row["p_value"] == pytest.approx(paired_permutation_test(x, y).pvalue)
        assert row["ci_high"] < 0 and row["p_value"] < 0.01  # dense is 0.1 better on 30 queries
        assert row["better"] == "dense"  # ΔSePer_S: higher is better
    best = comparison.tables["best"]
    # Per generator, ΔSePer_S's best setting is the dense one with the highest mean; the MIRAGE
    # shares and eRAG MAP tie across settings, so they name none.
    assert best["metric"].to_list() == ["ΔSePer_S", "ΔSePer_S"] and set(best["better"]) == {
        "higher"
    }
    for row in best.iter_rows(named=True):
        mine = [p for p in parts if p.generator == row["generator"]]
        top = max(mine, key=lambda p: p.summary["delta_seper_s"])
        assert (row["retriever"], row["k"], row["value"]) == (
            "dense",
            top.setting.k,
            top.summary["delta_seper_s"],
        )
        assert row["settings"] == 4 and row["paper"].startswith("SePer")
    intervals = comparison.tables["delta_seper_ci"]
    first = intervals.row(0, named=True)
    source = next(
        p
        for p in parts
        if (p.setting.retriever, p.setting.k, p.generator)
        == (first["retriever"], first["k"], first["generator"])
    )
    assert first["low"] == pytest.approx(
        bootstrap_mean_ci(source.per_query["delta_seper_s"].to_numpy()).low
    )


def test_paired_tests_use_only_queries_both_retrievers_scored() -> None:
    a = _partition("bm25", 1, "g", [0.1, 0.2, 0.3, 0.4], {"delta_seper_s": 0.25})
    b = PartitionScores(
        Setting("world", "dense", 1),
        "g",
        {"delta_seper_s": 0.3},
        pl.DataFrame({"query_id": ["q1", "q2", "q3", "q9"], "delta_seper_s": [0.3, 0.1, 0.5, 0.9]}),
    )
    row = build_comparison([a, b]).tables["paired_tests"].row(0, named=True)
    assert row["queries"] == 3
    assert row["difference"] == pytest.approx(np.mean([0.2 - 0.3, 0.3 - 0.1, 0.4 - 0.5]))


def test_a_missing_metric_leaves_an_empty_cell_and_nothing_to_compare_is_an_error() -> None:
    long = long_table([_partition("bm25", 1, "g", [0.1, 0.2], {"delta_seper_s": 0.15})])
    assert wide_table(long, "seper_s_rag")["k=1 g"].to_list() == [None]
    with pytest.raises(ValueError, match="nothing to compare"):
        long_table([])


def test_paired_tests_and_the_best_setting_follow_the_metrics_direction() -> None:
    """Semantic entropy and MIRAGE's noise vulnerability: lower is better, so the retriever with
    the lower per-query entropy is ahead, and the best setting is the least vulnerable one."""
    low, high = [0.1, 0.2, 0.1, 0.2, 0.1, 0.2], [0.9, 1.0, 0.9, 1.0, 0.9, 1.0]
    parts = [
        PartitionScores(
            Setting("world", name, 1),
            "g",
            {"semantic_entropy_rag": float(np.mean(v)), "mirage_noise_vulnerability": nv},
            pl.DataFrame({"query_id": [f"q{i}" for i in range(len(v))], "semantic_entropy_rag": v}),
        )
        for name, v, nv in (("bm25", high, 0.3), ("dense", low, 0.1))
    ]
    assert not any(
        catalog.metric(m).higher_is_better
        for m in ("semantic_entropy_rag", "mirage_noise_vulnerability")
    )
    row = paired_retriever_tests(parts, column="semantic_entropy_rag").row(0, named=True)
    assert (row["retriever_a"], row["ci_low"] > 0, row["better"]) == ("bm25", True, "dense")
    best = best_settings(long_table(parts)).row(0, named=True)
    assert (best["metric"], best["better"], best["retriever"], best["value"]) == (
        "MIRAGE NV",
        "lower",
        "dense",
        0.1,
    )


def test_the_comparison_shows_each_generators_templates_from_its_runs() -> None:
    base = {
        "prompt_closed_book": "file:prompts/cb.txt",
        "prompt_with_context": "inline",
        "prompt_other_roles": "none",
        "prompt_template_hash": "abc",
    }
    chat = {
        **base,
        "prompt_closed_book": "seper_closed_book",
        "prompt_with_context": "seper_with_context",
        "prompt_template_hash": "def",
    }
    partitions = [
        replace(_partition("bm25", 1, "gemma", [0.1], {}), prompts=base),
        replace(_partition("dense", 1, "gemma", [0.2], {}), prompts=base),
        replace(_partition("bm25", 1, "smollm2", [0.3], {}), prompts=chat),
    ]
    table = prompt_table(partitions)
    assert table.rows() == [
        ("gemma", "file:prompts/cb.txt", "inline", "none", "abc"),
        ("smollm2", "seper_closed_book", "seper_with_context", "none", "def"),
    ]
    assert "prompts" in build_comparison(partitions).tables
    assert "prompts" not in build_comparison([_partition("bm25", 1, "reader", [0.1], {})]).tables


def test_a_partitions_identities_are_those_its_steps_recorded_never_resolved_again(config) -> None:
    """MLflow logs each model's identity as the step that ran it recorded it (the models named in
    the config do not exist here, so resolving one would fail); a step that recorded none is an
    error naming the step and the entry."""
    import dagster as dg

    from ragutil_dagster.tracking.partition_run import partition_identities

    setting = Setting("world", "dense", 5)
    partition = f"lm0|{setting.key}"
    samples = pl.DataFrame({"model_identity": ["sha256:aa", "sha256:aa"]})
    instance = dg.DagsterInstance.ephemeral()

    def record(asset: str, key: str, **entries: str) -> None:
        instance.report_runless_asset_event(
            dg.AssetMaterialization(asset, partition=key, metadata=entries)
        )

    record("nli_probabilities", partition, nli_identity="sha256:bb", nli_dtype="float32")
    record("retrieval_run", setting.key)  # an older ragutil's step: no embedder identity
    with pytest.raises(
        ValueError, match=r"retrieval_run\[world__dense__k5\] recorded no embedder_identity"
    ):
        partition_identities(config, setting, samples, instance, partition)
    record("retrieval_run", setting.key, embedder_identity="sha256:cc")
    identities = partition_identities(config, setting, samples, instance, partition)
    assert identities == ModelIdentities(
        generator="sha256:aa", nli="sha256:bb", embedder="sha256:cc", nli_dtype="float32"
    )
    bm25 = Setting("world", "bm25", 5)
    record("nli_probabilities", f"lm0|{bm25.key}", nli_identity="sha256:bd")
    assert partition_identities(
        config, bm25, samples, instance, f"lm0|{bm25.key}"
    ) == ModelIdentities(generator="sha256:aa", nli="sha256:bd")
