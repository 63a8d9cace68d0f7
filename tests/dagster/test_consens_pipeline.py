"""ConSens Experiment 3 (§3.3) through the asset graph: the shipped reader of the synthetic world
on the CI world, BM25 at k = 3 (the paper retrieves three documents) with ``consens.leave_one_out``
on. Every shown passage is left out once, its attribution is the drop of ConSens, and the
summary's Experiment 3 figures are the ones the stored tables imply — in the summary, the
Dagster metadata, the MLflow run and the cross-run report."""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest

from ragutil_dagster.assets import build_assets
from ragutil_dagster.config import parse_config
from ragutil_dagster.definitions import build_definitions
from ragutil_dagster.embedded import layout
from ragutil_dagster.embedded.shipped import SHIPPED_DIR
from ragutil_dagster.metrics.consens import attribution_auc, leave_one_out_auc, removal_lowest
from ragutil_dagster.resources import ArtifactStore
from ragutil_dagster.runner import materialize_all
from ragutil_dagster.tables import CONSENS_LEAVE_ONE_OUT, PROMPTS, QRELS
from ragutil_dagster.tracking import MlflowTracking
from ragutil_dagster.tracking.report import report_artifact

K, QUERIES = 3, 8
KEY = f"reader|world__bm25__k{K}"


@pytest.fixture(scope="module")
def leave_one_out_run(tiny_world, make_tiny_config, tmp_path_factory):
    _, world, models = tiny_world
    config = make_tiny_config(models, world)
    config["datasets"][0]["max_queries"] = QUERIES
    config.update(
        {
            "retrievers": [{"name": "bm25", "kind": "bm25"}],
            "k": [K],
            "generators": [{"name": "reader", "model": str(SHIPPED_DIR / layout.READER)}],
            "sampling": {"n": 2, "max_new_tokens": 6},
            "utility": {"candidates": K, "methods": []},
            "consens": {"leave_one_out": True},
        }
    )
    experiment = parse_config(config)
    home = tmp_path_factory.mktemp("consens-home")
    parts, _ = build_assets(experiment)
    instance = dg.DagsterInstance.ephemeral()
    materialize_all(
        build_definitions(experiment, str(home)), experiment, parts, instance, progress=False
    )
    return ArtifactStore(home=str(home)), instance, str(home), experiment


def test_every_shown_passage_is_left_out_once_and_attributed_the_drop(leave_one_out_run) -> None:
    store, instance, _, _ = leave_one_out_run
    per_query = store.read_table("consens", KEY)
    left_out = store.read_table("consens", KEY, CONSENS_LEAVE_ONE_OUT)
    rag = store.read_table("generations", KEY, PROMPTS).filter(pl.col("condition") == "rag")
    scored = set(per_query.filter(pl.col("consens").is_not_null())["query_id"])
    # The evaluator prompt shows the rag prompt's passages (the reader's context fits all three).
    shown = rag.filter(pl.col("query_id").is_in(list(scored))).select("query_id", "doc_ids")
    expected = {(qid, doc) for qid, docs in shown.iter_rows() for doc in docs}
    assert set(
        left_out.select("query_id", "doc_id").iter_rows()
    ) == expected and left_out.height == len(expected)
    assert len(expected) == K * len(scored) and len(scored) >= QUERIES // 2
    joined = left_out.join(per_query, on="query_id")
    assert (
        joined["attribution"] - (joined["consens"] - joined["consens_without"])
    ).abs().max() < 1e-12
    event = instance.get_latest_materialization_event(dg.AssetKey("consens")).asset_materialization
    assert event.metadata["leave_one_out_prompts"].value == K * rag.height
    assert event.metadata[f"{CONSENS_LEAVE_ONE_OUT}/row_count"].value == left_out.height
    documents = store.read_table("document_scores", KEY)
    attributions = dict(((q, d), a) for q, d, _, a in left_out.iter_rows())
    for qid, doc, value in documents.select(
        "query_id", "doc_id", "consens_attribution"
    ).iter_rows():
        assert value == attributions.get((qid, doc))


def test_experiment_3_figures_are_those_of_the_stored_tables(leave_one_out_run) -> None:
    store, instance, home, experiment = leave_one_out_run
    documents = store.read_table("document_scores", KEY)
    qrels = store.read_table("setting_queries", f"world__bm25__k{K}", QRELS)
    relevant = set(qrels.filter(pl.col("relevance") > 0).select("query_id", "doc_id").iter_rows())
    hits = []
    for (qid,), rows in (
        documents.filter(pl.col("consens_without").is_not_null()).sort("rank").group_by("query_id")
    ):
        labels = [(qid, doc) in relevant for doc in rows["doc_id"]]
        if any(labels) and not all(labels):
            hits.append(
                (
                    qid,
                    rows["consens_without"].to_list(),
                    rows["consens_attribution"].to_list(),
                    labels,
                )
            )
    assert len(hits) >= 3  # BM25 retrieves the positive of most of the world's questions
    summary = store.read_json("metric_scores", KEY, "summary")
    without, attributions, labels = ([h[i] for h in hits] for i in (1, 2, 3))
    assert summary["n_consens_loo_auc"] == summary["n_consens_loo_lowest"] == len(hits)
    assert summary["consens_loo_auc"] == pytest.approx(leave_one_out_auc(without, labels))
    assert summary["consens_loo_attribution_auc"] == pytest.approx(
        attribution_auc(attributions, labels)
    )
    lowest = [removal_lowest(v, r) for v, r in zip(without, labels)]
    assert summary["consens_loo_lowest"] == pytest.approx(sum(lowest) / len(lowest))
    scores = store.read_table("metric_scores", KEY)
    assert set(scores.filter(pl.col("consens_loo_lowest").is_not_null())["query_id"]) == {
        h[0] for h in hits
    }

    event = instance.get_latest_materialization_event(
        dg.AssetKey("metric_scores")
    ).asset_materialization
    assert event.metadata["consens_loo_auc"].value == summary["consens_loo_auc"]
    run = (
        MlflowTracking(home=home)
        .client()
        .get_run(store.read_json("metric_scores", KEY, "mlflow")["run_id"])
    )
    assert run.data.params["consens_leave_one_out"] == "True"
    assert run.data.metrics["consens_loo_auc"] == pytest.approx(summary["consens_loo_auc"])
    assert run.data.metrics["consens_loo_lowest"] == pytest.approx(summary["consens_loo_lowest"])
    across = pl.read_csv(store.local_files(*report_artifact(experiment, "world")) / "runs.csv")
    assert across["consens_loo_auc"].to_list() == [pytest.approx(summary["consens_loo_auc"])]
