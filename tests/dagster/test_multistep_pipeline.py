"""Multi-step RAG in the graph (SePer Fig. 1–2, App. C.2): each later round of a chained setting
materialises as a setting of its own (``…__step-<t>``) whose run gathers the passages of rounds
1..t, every metric scores it, the reports show ΔSePer per round with its gain over the round before,
and its MLflow run names the round and the query writer, whose identity is part of the run key."""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest

from ragutil_dagster.assets import build_assets
from ragutil_dagster.assets.reports import summary_table
from ragutil_dagster.config import parse_config
from ragutil_dagster.definitions import build_definitions
from ragutil_dagster.resources import ArtifactStore
from ragutil_dagster.runner import materialize_all
from ragutil_dagster.tables import MULTISTEP_QUERIES
from ragutil_dagster.tracking import MlflowTracking
from ragutil_dagster.tracking.report import report_artifact

K = 1
STEPS = 3
MAX_PASSAGES = 2
BASE = f"world__bm25__k{K}"


def multistep_config(tiny_world, make_tiny_config) -> dict:
    """The tiny experiment with BM25 at k = 1, no verbalized judgment, three rounds capped at two passages."""
    _, world, models = tiny_world
    config = make_tiny_config(models, world)
    return {
        **config,
        "retrievers": config["retrievers"][:1],
        "k": [K],
        "utility": {"candidates": K, "methods": []},
        "multistep": {"steps": STEPS, "max_passages": MAX_PASSAGES},
    }


@pytest.fixture(scope="module")
def multistep_run(tiny_world, make_tiny_config, tmp_path_factory):
    home = tmp_path_factory.mktemp("multistep") / "home"
    experiment = parse_config(multistep_config(tiny_world, make_tiny_config))
    defs = build_definitions(experiment, str(home))
    parts, _ = build_assets(experiment)
    instance = dg.DagsterInstance.ephemeral()
    materialize_all(defs, experiment, parts, instance, progress=False)
    return experiment, parts, instance, ArtifactStore(home=str(home))


def test_each_round_is_a_setting_whose_run_gathers_the_rounds_before(multistep_run) -> None:
    experiment, parts, instance, store = multistep_run
    assert parts.setting.get_partition_keys() == [BASE, f"{BASE}__step-2", f"{BASE}__step-3"]
    first = store.read_table("retrieval_run", BASE).sort("query_id", "rank")
    runs = {
        step: store.read_table("retrieval_run", f"{BASE}__step-{step}").sort("query_id", "rank")
        for step in (2, 3)
    }
    for step, run in runs.items():
        # Round 1's passage leads every later round's context, which never exceeds the cap.
        assert (
            run.filter(pl.col("rank") == 1)
            .select("query_id", "doc_id")
            .equals(first.select("query_id", "doc_id"))
        )
        assert run.group_by("query_id").len()["len"].max() <= MAX_PASSAGES
        assert run.group_by("query_id").agg(pl.col("doc_id").n_unique() == pl.len())["doc_id"].all()
        queries = store.read_table("retrieval_run", f"{BASE}__step-{step}", MULTISTEP_QUERIES)
        assert sorted(queries["round"].unique().to_list()) == list(range(1, step + 1))
        assert (
            queries.filter(pl.col("round") > 1)["query"].str.strip_chars().str.len_chars().min() > 0
        )
        added = queries.group_by("query_id").agg(pl.col("passages_added").sum()).sort("query_id")
        assert (
            added["passages_added"].to_list()
            == run.group_by("query_id").len().sort("query_id")["len"].to_list()
        )
    # Greedy and deterministic: round 3 starts from round 2's context.
    two = runs[2].group_by("query_id", maintain_order=True).agg("doc_id")
    three = runs[3].group_by("query_id", maintain_order=True).agg("doc_id")
    for (_, a), (_, b) in zip(two.iter_rows(), three.iter_rows()):
        assert b[: len(a)] == a
    record = (
        instance.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=dg.AssetKey("retrieval_run"), asset_partitions=[f"{BASE}__step-3"]
            ),
            limit=1,
        )
        .records[0]
        .asset_materialization
    )
    assert record.metadata["query_writer"].value == experiment.generators[0].name
    assert record.metadata["multistep_round"].value == 3


def test_reports_show_delta_seper_per_round_and_mlflow_names_round_and_writer(
    multistep_run,
) -> None:
    experiment, parts, _, store = multistep_run
    table = summary_table(store, parts)
    assert table.sort("multistep_round")["multistep_round"].to_list() == [1, 2, 3]
    per_round = {
        step: store.read_table("metric_scores", f"lm0|{key}")
        for step, key in ((1, BASE), (2, f"{BASE}__step-2"), (3, f"{BASE}__step-3"))
    }
    multistep = pl.read_csv(
        store.local_files(*report_artifact(experiment, "world")) / "multistep.csv"
    )
    rows = multistep.filter(pl.col("questions") == "all").sort("step")
    assert rows["step"].to_list() == [1, 2, 3]
    for step, scores in per_round.items():
        assert rows["delta_seper_s"][step - 1] == pytest.approx(scores["delta_seper_s"].mean())
        assert rows["context_tokens"][step - 1] == pytest.approx(
            scores["context_tokens_after"].mean()
        )
    assert rows["gain_s"][0] is None
    assert rows["gain_s"][2] == pytest.approx(
        per_round[3]["delta_seper_s"].mean() - per_round[2]["delta_seper_s"].mean()
    )
    assert (rows["gain_s_low"][1:] <= rows["gain_s"][1:]).all() and (
        rows["gain_s"][1:] <= rows["gain_s_high"][1:]
    ).all()
    client = MlflowTracking(home=store.home).client()
    params = {
        step: client.get_run(
            store.read_json("metric_scores", f"lm0|{key}", "mlflow")["run_id"]
        ).data.params
        for step, key in ((1, BASE), (3, f"{BASE}__step-3"))
    }
    assert (
        params[1]["multistep_round"],
        params[1]["query_writer"],
        params[1]["query_writer_identity"],
    ) == ("1", "none", "none")
    assert (params[3]["multistep_round"], params[3]["query_writer"]) == ("3", "lm0")
    assert params[3]["query_writer_identity"] == params[3]["generator_identity"]
