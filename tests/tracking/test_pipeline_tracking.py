"""MLflow tracking of the materialised graph, against the embedded SQLite store and a real
``mlflow server``: one run per setting × generator with its params, no duplicates on
re-materialisation, exactly the changed generator's runs added after a weight change, FAILED
runs on failure, links both ways, and the comparison run with its tables and plots."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import torch
from mlflow import MlflowClient

from ragutil_dagster.infra.objectstore import MANIFEST_SUFFIX
from ragutil_dagster.metrics.stats import bootstrap_paired_diff_ci, paired_permutation_test
from ragutil_dagster.models.device import default_nli_dtype
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.runner import materialize_all
from ragutil_dagster.testing.tiny import build_causal_lm
from ragutil_dagster.tracking import MlflowTracking
from ragutil_dagster.tracking.entities import MODEL_IDENTITY_TAG
from ragutil_dagster.tracking.keys import (
    DAGSTER_ASSET_TAG,
    DAGSTER_PARTITION_TAG,
    DAGSTER_RUN_TAG,
    KIND_TAG,
    RUN_KEY_TAG,
)
from ragutil_dagster.tracking.report import compare_runs

REQUIRED_PARAMS = {
    "dataset",
    "retriever",
    "k",
    "reranker",
    "generator_model",
    "generator_revision",
    "generator_identity",
    "nli_model",
    "nli_revision",
    "nli_identity",
    "nli_dtype",
    "nli_answer_check",
    "embedder",
    "n",
    "temperature",
    "max_new_tokens",
    "seed",
    "prompt_template_hash",
    "ragutil_version",
}
REQUIRED_METRICS = {
    "delta_seper_s",
    "delta_seper_s_ci_low",
    "delta_seper_s_ci_high",
    "delta_seper_h",
    "delta_seper_h_ci_low",
    "seper_s_closed",
    "seper_s_rag",
    "seper_h_closed",
    "seper_h_rag",
    "em_rag",
    "f1_rag",
    "has_answer_rag",
    "erag_map",
    "erag_P_2",
    "mirage_noise_vulnerability",
    "mirage_context_acceptability",
    "mirage_context_insensitivity",
    "mirage_context_misinterpretation",
    "consens",
    "utility_likelihood_accuracy_empty",
    "scoring_seconds",
    "tokens_generated",
    "nli_pairs",
    "generations.sampling_seconds",
    "entailment_clusters.nli_seconds",
}
SCORING = ["generations", "entailment_clusters", "metric_scores"]


def partition_runs(client: MlflowClient) -> list:
    experiment = client.get_experiment_by_name("ragutil/world")
    return client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{KIND_TAG}` = 'partition'"
    )


def artifact_paths(client: MlflowClient, run_id: str, directory: str) -> set[str]:
    return {Path(item.path).name for item in client.list_artifacts(run_id, directory)}


def rescore(experiment, tracking: MlflowTracking, partitions: list[str]) -> None:
    for partition in partitions:
        assert experiment.materialize(["metric_scores"], partition, tracking=tracking).success, (
            partition
        )


def change_generator(experiment, tracking: MlflowTracking, name: str, seed: int) -> None:
    """New weights for one generator, and its partitions re-sampled and re-scored."""
    build_causal_lm(experiment.generator_dirs[name], seed=seed)
    closed = str(dg.MultiPartitionKey({"dataset": "world", "generator": name}))
    assert experiment.materialize(["closed_book_generations"], closed, tracking=tracking).success
    for partition in experiment.partitions(name):
        assert experiment.materialize(SCORING, partition, tracking=tracking).success, partition


def check_partition_runs(client: MlflowClient, experiment) -> None:
    """Four FINISHED runs carrying the params, metrics, artifacts and Dagster tags, and the
    Dagster metadata linking back to them."""
    runs = partition_runs(client)
    assert sorted(run.data.tags[DAGSTER_PARTITION_TAG] for run in runs) == sorted(
        experiment.partitions()
    )
    for run in runs:
        partition = run.data.tags[DAGSTER_PARTITION_TAG]
        assert run.info.status == "FINISHED"
        assert REQUIRED_PARAMS <= set(run.data.params), REQUIRED_PARAMS - set(run.data.params)
        assert (
            run.data.params["k"] == "2"
            and run.data.params["n"] == "3"
            and run.data.params["max_new_tokens"] == "4"
        )
        assert run.data.params["generator"] == partition.split("|")[0]
        # the dtype the NLI ran in (the config says auto)
        assert run.data.params["nli_dtype"] == str(
            default_nli_dtype(torch.device("cpu"))
        ).removeprefix("torch.")
        assert run.data.params["embedder"] == (
            "none" if "bm25" in partition else experiment.config.retriever("dense").model
        )
        assert REQUIRED_METRICS <= set(run.data.metrics), REQUIRED_METRICS - set(run.data.metrics)
        summary = ArtifactStore(home=str(experiment.home)).read_json(
            "metric_scores", partition, "summary"
        )
        assert run.data.metrics["delta_seper_s"] == pytest.approx(summary["delta_seper_s"])
        low, mean, high = (
            run.data.metrics[m]
            for m in ("delta_seper_s_ci_low", "delta_seper_s", "delta_seper_s_ci_high")
        )
        assert low <= mean <= high
        assert {"table.parquet", "documents.parquet", "summary.json"} <= artifact_paths(
            client, run.info.run_id, "scores"
        )
        assert artifact_paths(client, run.info.run_id, "plots") == {
            "delta_seper_distribution.png",
            "delta_seper_by_rank.png",
            "mirage.png",
        }
        assert run.data.tags[DAGSTER_ASSET_TAG] == "metric_scores"
        event = experiment.instance.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=dg.AssetKey("metric_scores"), asset_partitions=[partition]
            ),
            limit=1,
        ).records[0]
        assert run.data.tags[DAGSTER_RUN_TAG] == event.run_id
        metadata = event.asset_materialization.metadata
        assert metadata["mlflow_run_id"].value == run.info.run_id
        assert metadata["mlflow_run_url"].value.endswith(
            f"/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
        )


def check_comparison(client: MlflowClient, experiment, tracking: MlflowTracking) -> None:
    """The comparison run holds the tables (CSV and Markdown) and plots; its paired tests are
    the ones computed directly from the per-query tables."""
    assert experiment.materialize(["reports"], None, tracking=tracking).success
    eid = client.get_experiment_by_name("ragutil/world").experiment_id
    runs = client.search_runs(
        [eid],
        filter_string=f"tags.`{KIND_TAG}` = 'comparison'",
        order_by=["attributes.start_time DESC"],
    )
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.metrics["runs_compared"] == 4
    tables = artifact_paths(client, run.info.run_id, "tables")
    for name in (
        "delta_seper_s",
        "delta_seper_h",
        "seper_s_rag",
        "mirage",
        "erag_utility",
        "paired_tests",
        "runs",
    ):
        assert {f"{name}.csv", f"{name}.md"} <= tables, name
    assert artifact_paths(client, run.info.run_id, "plots") == {
        "delta_seper_heatmap.png",
        "delta_seper_bars.png",
        "mirage_bars.png",
    }
    directory = Path(client.download_artifacts(run.info.run_id, "tables"))
    tests = pl.read_csv(directory / "paired_tests.csv")
    assert sorted(tests["generator"]) == ["lm0", "lm1"]
    store = ArtifactStore(home=str(experiment.home))
    for row in tests.iter_rows(named=True):
        a = store.read_table("metric_scores", f"{row['generator']}|world__{row['retriever_a']}__k2")
        b = store.read_table("metric_scores", f"{row['generator']}|world__{row['retriever_b']}__k2")
        joined = a.select("query_id", "delta_seper_s").join(
            b.select("query_id", "delta_seper_s"), on="query_id"
        )
        x, y = joined["delta_seper_s"].to_numpy(), joined["delta_seper_s_right"].to_numpy()
        assert row["difference"] == pytest.approx(bootstrap_paired_diff_ci(x, y).estimate)
        assert row["ci_low"] == pytest.approx(bootstrap_paired_diff_ci(x, y).low)
        assert row["p_value"] == pytest.approx(paired_permutation_test(x, y).pvalue)
    wide = pl.read_csv(directory / "delta_seper_s.csv")
    assert wide.columns == ["dataset", "retriever", "k=2 lm0", "k=2 lm1"] and wide.height == 2
    metadata = experiment.instance.get_latest_materialization_event(
        dg.AssetKey("reports")
    ).asset_materialization.metadata
    assert (
        run.info.run_id in metadata["comparison"].value
        and "ΔSePer_S" in metadata["comparison"].value
    )
    assert metadata["mlflow_comparison_run_id/world"].value == run.info.run_id


def logged_models(client: MlflowClient) -> list:
    world = client.get_experiment_by_name("ragutil/world")
    return client.search_logged_models([world.experiment_id])


def check_entities(client: MlflowClient, run) -> None:
    """A partition run lists its three datasets once each and its models (generator, NLI, and
    the embedder of a dense retriever); its metrics are linked to the generator's model."""
    run = client.get_run(run.info.run_id)  # search_runs leaves out the model inputs
    inputs = [d.dataset.name for d in run.inputs.dataset_inputs]
    setting = run.data.params["setting"]
    assert sorted(inputs) == sorted(
        ["world/test/queries", "world/corpus", f"{setting}/test/contexts"]
    )
    models = {client.get_logged_model(i.model_id) for i in run.inputs.model_inputs}
    roles = {m.model_type: m for m in models}
    assert set(roles) == (
        {"generator", "nli", "embedder"} if "dense" in setting else {"generator", "nli"}
    )
    generator = roles["generator"]
    assert generator.tags[MODEL_IDENTITY_TAG] == run.data.params["generator_identity"]
    linked = {m.key for m in generator.metrics if m.run_id == run.info.run_id}
    assert {"delta_seper_s", "delta_seper_s_ci_low", "scoring_seconds"} <= linked


def check_idempotence(
    client: MlflowClient, experiment, tracking: MlflowTracking, new_seed: int
) -> None:
    before = {
        run.info.run_id: run.data.params["generator_identity"] for run in partition_runs(client)
    }
    models_before = {m.model_id for m in logged_models(client)}
    rescore(experiment, tracking, experiment.partitions())
    rescored = partition_runs(client)
    assert {run.info.run_id for run in rescored} == set(before)
    for run in rescored:
        check_entities(client, run)
    assert {m.model_id for m in logged_models(client)} == models_before
    change_generator(experiment, tracking, "lm1", new_seed)
    after = partition_runs(client)
    added = [run for run in after if run.info.run_id not in before]
    assert len(after) == 6 and len(added) == 2
    # New weights for lm1: exactly one new LoggedModel, shared by its two new runs.
    [new_model] = [m for m in logged_models(client) if m.model_id not in models_before]
    assert new_model.model_type == "generator" and all(
        new_model.model_id
        in {i.model_id for i in client.get_run(run.info.run_id).inputs.model_inputs}
        for run in added
    )
    assert sorted(run.data.tags[DAGSTER_PARTITION_TAG] for run in added) == experiment.partitions(
        "lm1"
    )
    assert all(run.data.params["generator_identity"] not in before.values() for run in added)


@pytest.fixture(scope="module")
def embedded(experiment):
    """The whole graph materialised with the embedded default store, ``<home>/mlflow.db``."""
    materialize_all(
        experiment.defs, experiment.config, experiment.parts, experiment.instance, progress=False
    )
    tracking = MlflowTracking(home=str(experiment.home))
    assert tracking.uri == f"sqlite:///{experiment.home.resolve() / 'mlflow.db'}"
    return tracking


def test_embedded_store_runs_params_idempotence_and_comparison(experiment, embedded) -> None:
    client = MlflowClient(embedded.uri)
    check_partition_runs(client, experiment)
    run = partition_runs(client)[0]
    assert run.info.artifact_uri.startswith((experiment.home.resolve() / "mlruns").as_uri())
    check_idempotence(client, experiment, embedded, new_seed=10)
    check_comparison(client, experiment, embedded)


def test_failed_materialisation_marks_its_run_failed_and_a_retry_reuses_it(
    experiment, embedded
) -> None:
    client = MlflowClient(embedded.uri)
    partition = experiment.partitions("lm0")[0]
    nli = (
        experiment.home
        / "artifacts"
        / "nli_probabilities"
        / partition.replace("|", "__gen__")
        / f"table.parquet{MANIFEST_SUFFIX}"  # unpublished: the table is missing to every reader
    )
    before = {run.info.run_id for run in partition_runs(client)}
    hidden = nli.rename(nli.with_suffix(".hidden"))
    try:
        assert not experiment.materialize(["metric_scores"], partition, tracking=embedded).success
    finally:
        hidden.rename(nli)
    runs = {run.info.run_id: run for run in partition_runs(client)}
    assert set(runs) == before
    failed = [
        run
        for run in runs.values()
        if run.data.tags[DAGSTER_PARTITION_TAG] == partition and run.info.status == "FAILED"
    ]
    assert len(failed) == 1
    rescore(experiment, embedded, [partition])
    assert client.get_run(failed[0].info.run_id).info.status == "FINISHED"
    assert {run.info.run_id for run in partition_runs(client)} == before


def test_compare_command_prints_the_tables_and_reuses_the_comparison_run(
    experiment, embedded, tmp_path, monkeypatch, capsys
) -> None:

    import yaml

    from ragutil_dagster.cli import build_parser

    config = tmp_path / "experiment.yaml"
    config.write_text(yaml.safe_dump(experiment.config.model_dump(mode="json")))
    monkeypatch.setenv("RAGUTIL_HOME", str(experiment.home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client = MlflowClient(embedded.uri)
    eid = client.get_experiment_by_name("ragutil/world").experiment_id
    comparisons = f"tags.`{KIND_TAG}` = 'comparison'"
    before = {run.info.run_id for run in client.search_runs([eid], filter_string=comparisons)}
    args = build_parser().parse_args(["compare", str(config)])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert (
        "ΔSePer_S by retriever × k × generator" in printed and "| world   | dense     |" in printed
    )
    assert "(reused)" in printed  # the reports asset already compared exactly these runs
    assert {
        run.info.run_id for run in client.search_runs([eid], filter_string=comparisons)
    } == before


def test_mlflow_server_runs_params_idempotence_and_comparison(
    experiment, embedded, mlflow_server, tmp_path
) -> None:
    tracking = MlflowTracking(home=str(experiment.home), tracking_uri=mlflow_server)
    client = MlflowClient(mlflow_server)
    rescore(experiment, tracking, experiment.partitions())
    check_partition_runs(client, experiment)
    run = partition_runs(client)[0]
    assert not run.info.artifact_uri.startswith(
        "file:"
    )  # served by the server, not the local store
    assert RUN_KEY_TAG in run.data.tags
    check_idempotence(client, experiment, tracking, new_seed=20)
    check_comparison(client, experiment, tracking)
    check_comparison_from_another_machine(client, experiment, mlflow_server, tmp_path)


def check_comparison_from_another_machine(
    client: MlflowClient, experiment, server: str, home: Path
) -> None:
    """A machine with none of the artifacts compares the runs the server holds: the same
    partitions, the same paired tests, hence the same comparison run (reused)."""
    tracking = MlflowTracking(home=str(home), tracking_uri=server)
    outcome = compare_runs(ArtifactStore(home=str(home)), tracking, experiment.config)
    run = outcome.runs["world"]
    assert run.reused
    runs = outcome.comparisons["world"].tables["runs"]
    latest = {
        experiment.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("metric_scores"), asset_partitions=[p]),
            limit=1,
        )
        .records[0]
        .asset_materialization.metadata["mlflow_run_id"]
        .value
        for p in experiment.partitions()
    }
    assert sorted(runs["mlflow_run_id"]) == sorted(latest)  # lm1's runs after its new weights
    logged = pl.read_csv(Path(client.download_artifacts(run.run_id, "tables")) / "paired_tests.csv")
    assert outcome.comparisons["world"].tables["paired_tests"][
        "p_value"
    ].to_list() == pytest.approx(logged["p_value"].to_list())
