"""``sampling.adaptive`` through the asset graph on the tiny fixtures: the shipped reader of the
CI world, BM25 at k = 1, N_max = 6 in rounds of 2. Every prompt stopped exactly where the stop
rule says, judged again from the stored samples and NLI probabilities, and the samples drawn
reach the Dagster metadata and the figures logged to MLflow."""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest

from ragutil_dagster.assets.generations import SAMPLE_COUNT_CHECK
from ragutil_dagster.config import AdaptiveSamplingConfig
from ragutil_dagster.evaluation.groups import seper_standard_errors, table_entail
from ragutil_dagster.evaluation.prompt_sampling import ADAPTIVE_BIAS_NOTE
from ragutil_dagster.tracking.partition_run import upstream_figures

N_MAX, FIRST, SIZE = 6, 2, 2
# the closed-book prompts stop early too (the default draws them in full)
ADAPTIVE = AdaptiveSamplingConfig(
    first_round=FIRST, round_size=SIZE, target_se=0.2, closed_book_target_se=0.1
)
SETTING = "world__bm25__k1"
KEY, CLOSED_KEY = f"reader|{SETTING}", "world|reader"


@pytest.fixture(scope="module")
def adaptive_run(run_shipped_reader):
    return run_shipped_reader(
        "adaptive-home",
        sampling={"n": N_MAX, "max_new_tokens": 6, "adaptive": ADAPTIVE.model_dump()},
        utility={"candidates": 1, "methods": []},
    )


def test_every_prompt_stopped_where_the_rule_says(adaptive_run) -> None:
    store, _ = adaptive_run
    samples = pl.concat(
        [
            store.read_table("closed_book_generations", CLOSED_KEY),
            store.read_table("generations", KEY),
        ]
    ).filter(pl.col("decoding") == "sample")
    queries = store.read_table("setting_queries", SETTING)
    entail = table_entail(store.read_table("nli_probabilities", KEY))
    drawn = samples.group_by("query_id", "condition", "doc_id").len()
    assert set(drawn["len"]) <= {2, 4, 6}
    assert drawn["len"].min() < N_MAX  # the rule stopped some prompt early on these fixtures
    final = seper_standard_errors(samples, queries, entail)
    for qid, condition, doc_id, n in drawn.iter_rows():
        group = (qid, condition, doc_id)
        target = ADAPTIVE.target_for(condition)  # 0.1 for the closed-book prompts
        if n < N_MAX:  # stopped: precise enough at n
            assert final[group] <= target, group
        if n > FIRST:  # went on: not precise enough one round before
            before = samples.filter(
                (pl.col("query_id") == qid)
                & (pl.col("condition") == condition)
                & pl.col("doc_id").eq_missing(doc_id)
                & (pl.col("sample_index") < n - SIZE)
            )
            assert seper_standard_errors(before, queries, entail)[group] > target, group
    assert store.read_table("metric_scores", KEY).height > 0


def test_samples_drawn_reach_the_metadata_and_mlflow_figures(adaptive_run) -> None:
    store, instance = adaptive_run
    for asset, key in (("closed_book_generations", CLOSED_KEY), ("generations", KEY)):
        rows = store.read_table(asset, key).filter(pl.col("decoding") == "sample")
        prompts = rows.select("query_id", "condition", "doc_id").unique().height
        metadata = instance.get_latest_materialization_event(
            dg.AssetKey(asset)
        ).asset_materialization.metadata
        assert metadata["samples_drawn"].value == rows.height
        assert metadata["sample_fraction"].value == pytest.approx(rows.height / (prompts * N_MAX))
        figures = upstream_figures(instance, {asset: key})
        assert figures[f"{asset}.samples_drawn"] == rows.height


def test_the_sample_count_check_passes_on_the_rounds_drawn(adaptive_run) -> None:
    _, instance = adaptive_run
    for asset in ("closed_book_generations", "generations"):
        key = dg.AssetCheckKey(dg.AssetKey(asset), SAMPLE_COUNT_CHECK)
        executions = instance.event_log_storage.get_asset_check_execution_history(key, limit=10)
        assert executions and all(e.evaluation.passed for e in executions), asset
        assert executions[0].evaluation.metadata["sample_counts_allowed"].value == "[2, 4, 6]"


def test_adaptive_numbers_carry_their_cost_everywhere(adaptive_run) -> None:
    """The share of samples drawn and the note on early stopping's bias reach the generations'
    metadata, the partition's summary, its MLflow run (metric and tag) and the reports."""
    from pathlib import Path

    from mlflow import MlflowClient

    store, instance = adaptive_run
    metadata = instance.get_latest_materialization_event(
        dg.AssetKey("generations")
    ).asset_materialization.metadata
    assert metadata["adaptive_sampling"].value == ADAPTIVE_BIAS_NOTE
    samples = pl.concat(
        [
            store.read_table("closed_book_generations", CLOSED_KEY),
            store.read_table("generations", KEY),
        ]
    ).filter(pl.col("decoding") == "sample")
    groups = samples.select("query_id", "condition", "doc_id").unique().height
    share = store.read_json("metric_scores", KEY, "summary")["sample_fraction"]
    assert share == pytest.approx(samples.height / (groups * N_MAX)) and share < 1
    logged = store.read_json("metric_scores", KEY, "mlflow")
    run = MlflowClient(logged["tracking_uri"]).get_run(logged["run_id"])
    assert run.data.metrics["sample_fraction"] == pytest.approx(share)
    assert run.data.tags["adaptive_sampling"] == ADAPTIVE_BIAS_NOTE
    (summary,) = [p for p in Path(store.home).rglob("summary.md") if "reports" in p.parts]
    text = summary.read_text()
    assert (
        "| sample_fraction |" in text
        and f"Note: {ADAPTIVE_BIAS_NOTE}; drawn here: {share:.0%}" in text
    )
