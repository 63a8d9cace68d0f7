"""The validity experiments inside the asset graph, on the demo's world with the reader and world
NLI the package ships (the world's ground truth is the reader's): every asset materialises, the
negatives are what they claim to be, and the table's figures are the ones the world implies."""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest

from ragutil_dagster.assets import build_assets
from ragutil_dagster.config import parse_config
from ragutil_dagster.definitions import build_definitions
from ragutil_dagster.embedded import layout
from ragutil_dagster.embedded.shipped import SHIPPED_DIR, SHIPPED_SEED, SHIPPED_SIZE
from ragutil_dagster.embedded.world import make_world, write_world
from ragutil_dagster.evaluation.validity import HARD_NEGATIVE_DEPTH
from ragutil_dagster.metrics.answers import has_answer
from ragutil_dagster.resources import ArtifactStore
from ragutil_dagster.retrieval.bm25 import BM25Retriever
from ragutil_dagster.runner import materialize_all
from ragutil_dagster.tables import QRELS, VALIDITY_PASSAGES
from ragutil_dagster.tracking import MlflowTracking
from ragutil_dagster.tracking.report import report_artifact

QUERIES, N = 8, 3  # the world's first 8 questions: single-hop, 3 about facts the reader knows


def test_validity_runs_in_the_graph_and_ranks_the_worlds_passages_as_the_truth_does(
    tmp_path,
) -> None:
    world = write_world(make_world(SHIPPED_SEED, SHIPPED_SIZE), tmp_path / "world")
    experiment = parse_config(
        {
            "name": "validity",
            "seed": 0,
            "bootstrap_resamples": 200,
            "datasets": [
                {"name": "world", "format": "synthetic", "path": str(world), "max_queries": QUERIES}
            ],
            "retrievers": [{"name": "bm25", "kind": "bm25"}],
            "k": [1],
            "generators": [{"name": "reader", "model": str(SHIPPED_DIR / layout.READER)}],
            "nli": {"model": str(SHIPPED_DIR / layout.WORLD_NLI)},
            "sampling": {"n": N, "max_new_tokens": 6},
            "utility": {"candidates": 1, "methods": []},
            "validity": {},
        }
    )
    home = tmp_path / "home"
    defs = build_definitions(experiment, str(home))
    graph = defs.resolve_asset_graph()
    parents = {
        k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys}
        for k in graph.get_all_asset_keys()
    }
    assert parents["validity_passages"] == {"queries", "corpus", "index"}
    assert parents["validity"] == {
        "generations",
        "closed_book_generations",
        "group_scores",
        "metric_scores",
        "setting_queries",
        "retrieved_passages",
        "model/generator",
    }
    assert "validity_passages" in parents["setting_queries"] and "validity" in parents["reports"]
    parts, _ = build_assets(experiment)
    instance = dg.DagsterInstance.ephemeral()
    materialize_all(defs, experiment, parts, instance, progress=False)

    store = ArtifactStore(home=str(home))
    key = str(parts.setting_generator.get_partition_keys()[0])
    queries = store.read_table("queries", "world")
    qrels = store.read_table("queries", "world", QRELS)
    corpus = store.read_table("corpus", "world")
    judged = store.read_table("validity_passages", "world")
    assert store.read_table("setting_queries", "world__bm25__k1", VALIDITY_PASSAGES).equals(judged)

    # One positive, one hard and one random negative per (single-hop) question; no negative is
    # judged for its question or holds a gold answer; the hard one is the best-ranked such BM25 passage.
    assert judged.group_by("kind").len().sort("kind").rows() == [
        ("hard", QUERIES),
        ("positive", QUERIES),
        ("random", QUERIES),
    ]
    golds = dict(queries.select("query_id", "answers").iter_rows())
    texts = dict(corpus.select("id", "text").iter_rows())
    judgments = set(qrels.select("query_id", "doc_id").iter_rows())
    negatives = judged.filter(pl.col("label") == 0)
    for qid, doc in negatives.select("query_id", "doc_id").iter_rows():
        assert (qid, doc) not in judgments and not has_answer(texts[doc], golds[qid])
    index = BM25Retriever.load(store.local_files("index", "world__bm25", "index"))
    ranking = index.search(
        queries.select(pl.col("query_id").alias("id"), pl.col("question").alias("text")),
        k=HARD_NEGATIVE_DEPTH,
    )
    for qid, doc in (
        judged.filter(pl.col("kind") == "hard").select("query_id", "doc_id").iter_rows()
    ):
        ranked = ranking.filter(pl.col("query_id") == qid).sort("rank")["doc_id"].to_list()
        eligible = [
            d for d in ranked if (qid, d) not in judgments and not has_answer(texts[d], golds[qid])
        ]
        assert doc == eligible[0]

    # Each validity passage was sampled alone like a per_doc passage: N samples and the greedy answer.
    generations = store.read_table("generations", key)
    assert generations.filter(pl.col("condition") == "validity").height == judged.height * (N + 1)

    validity = store.read_table("validity", key)
    cell = {(r["measure"], r["subset"], r["negatives"]): r for r in validity.iter_rows(named=True)}
    passages = store.read_table("validity", key, "passages")
    answered = set(passages.filter(pl.col("answered_closed_book"))["query_id"])
    assert (
        set(queries.filter(pl.col("known"))["query_id"]) <= answered
    )  # the reader knows these facts
    for measure in (
        "delta_seper_s",
        "delta_em",
        "delta_rouge_l",
        "delta_bleu",
        "delta_bertscore",
        "delta_perplexity",
        "consens",
        "erag_label",
        "likelihood",
    ):
        split = [cell[(measure, subset, "all")]["n"] for subset in ("unanswered", "answered")]
        assert sum(split) == judged.height, measure
        assert cell[(measure, "unanswered", "all")]["n"] == 3 * (QUERIES - len(answered))
    # The world's truth judges the positives and hard negatives, not the random passages: on the
    # questions the reader cannot answer closed book it orders every pair as the label does, and
    # ΔSePer follows it; on the known facts the positives have no utility (SePer's Property 2).
    truth = cell[("true_utility", "unanswered", "all")]
    assert (truth["auc"], truth["r_pb"], truth["n_negative"]) == (
        1.0,
        pytest.approx(1.0),
        truth["n_positive"],
    )
    assert cell[("true_utility", "answered", "all")]["undefined"].startswith("constant measure")
    assert cell[("delta_seper_s", "unanswered", "all")]["auc"] > 0.8
    assert cell[("delta_seper_s", "unanswered", "hard")]["auc"] > 0.8
    # SePer Table 2's reference-based rows: the samples' ROUGE-L, BLEU and BERTScore against the gold
    # answers, with the passage − closed book (recomputed here from the stored samples).
    from ragutil_dagster.metrics.answers import rouge_l

    closed = store.read_table("closed_book_generations", parts.closed_book_partition(key))
    samples = pl.concat([closed, generations]).filter(pl.col("decoding") == "sample")
    positive = passages.filter(pl.col("label") == 1).row(0, named=True)
    mean_rouge = {
        condition: float(
            pl.Series([rouge_l(t, golds[positive["query_id"]]) for t in part["text"]]).mean()
        )
        for condition, part in (
            (
                "closed",
                samples.filter(
                    (pl.col("query_id") == positive["query_id"])
                    & (pl.col("condition") == "closed_book")
                ),
            ),
            (
                "alone",
                samples.filter(
                    (pl.col("doc_id") == positive["doc_id"])
                    & (pl.col("condition") == "validity")
                    & (pl.col("query_id") == positive["query_id"])
                ),
            ),
        )
    }
    assert positive["delta_rouge_l"] == pytest.approx(mean_rouge["alone"] - mean_rouge["closed"])
    assert cell[("delta_rouge_l", "unanswered", "all")]["label"] == "ΔROUGE-L"
    assert cell[("delta_f1", "unanswered", "all")]["label"] == "ΔF1 (ragutil's addition)"

    # The same figures in the Dagster metadata and the partition's MLflow run, and across runs in the reports.
    event = instance.get_latest_materialization_event(dg.AssetKey("validity")).asset_materialization
    assert (
        event.metadata["auc/true_utility"].value == 1.0
        and "ΔSePer_S" in event.metadata["table_2"].value
    )
    record = store.read_json("metric_scores", key, "mlflow")
    run = MlflowTracking(home=str(home)).client().get_run(record["run_id"])
    assert run.data.metrics["validity_auc_true_utility"] == 1.0
    assert (
        run.data.metrics["validity_auc_delta_seper_s"]
        == cell[("delta_seper_s", "unanswered", "all")]["auc"]
    )
    assert (
        run.data.metrics["validity_n_delta_seper_s_answered"]
        == cell[("delta_seper_s", "answered", "all")]["n"]
    )
    across = pl.read_csv(
        store.local_files(*report_artifact(experiment, "world")) / "validity_r.csv"
    )
    assert dict(across.iter_rows())["ground truth"] == pytest.approx(1.0)
