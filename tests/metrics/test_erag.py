"""eRAG: per-document labels from the downstream metric, aggregation as the authors' code does."""

import typing

import pytest
import pytrec_eval
from hypothesis import given, settings
from hypothesis import strategies as st

from ragutil_dagster.metrics.answers import exact_match, f1
from ragutil_dagster.metrics.erag import (
    BINARY_DOWNSTREAM_METRICS,
    DOWNSTREAM_METRICS,
    DownstreamMetric,
    erag_labels,
    erag_measure_names,
    erag_scores,
)

RETRIEVED = {"q1": ["d1", "d2", "d3"], "q2": ["d4", "d5", "d6"], "q3": ["d7", "d8", "d9"]}


def test_labels_apply_the_downstream_metric_to_each_documents_own_output() -> None:
    outputs = {"q1": {"d1": "Paris", "d2": "the city of Paris", "d3": "Rome"}}
    assert erag_labels(outputs, {"q1": ["Paris"]}, exact_match) == {
        "q1": {"d1": 1.0, "d2": 0.0, "d3": 0.0}
    }
    labels = erag_labels(outputs, {"q1": ["Paris"]}, f1)
    assert labels["q1"]["d2"] == pytest.approx(0.5)


def test_every_downstream_metric_name_has_its_function() -> None:
    assert set(DOWNSTREAM_METRICS) == set(typing.get_args(DownstreamMetric))
    assert BINARY_DOWNSTREAM_METRICS < set(DOWNSTREAM_METRICS)


def test_token_f1_labels_are_graded_and_aggregate_by_p_and_hit_only() -> None:
    """eRAG allows a non-binary downstream metric (§3): token F1 labels; only P@k (mean) and
    Hit@k (max) are then defined, whatever values the labels happen to take."""
    outputs = {"q1": {"d1": "Paris France", "d2": "Rome"}}
    labels = erag_labels(outputs, {"q1": ["Paris"]}, DOWNSTREAM_METRICS["token_f1"])
    assert labels == {"q1": {"d1": pytest.approx(2 / 3), "d2": 0.0}}
    assert erag_measure_names("token_f1", 2) == ["P_2", "success_2"]
    assert erag_measure_names("exact_match", 2) == [
        "P_2",
        "success_2",
        "map",
        "recip_rank",
        "ndcg_cut_2",
    ]
    assert erag_measure_names("has_answer", 2) == erag_measure_names("exact_match", 2)
    scores = erag_scores({"q1": ["d1", "d2"]}, labels, erag_measure_names("token_f1", 2))
    assert scores.mean == {"P_2": pytest.approx(1 / 3), "success_2": pytest.approx(2 / 3)}


def test_labels_outside_unit_interval_are_rejected() -> None:
    with pytest.raises(ValueError, match="outside"):
        erag_labels({"q": {"d": "x"}}, {"q": "x"}, lambda out, gold: 2.0)


def test_binary_labels_use_trec_measures_and_zero_queries_count() -> None:
    labels = {
        "q1": {"d1": 0, "d2": 1, "d3": 0},
        "q2": {"d4": 1, "d5": 1, "d6": 0},
        "q3": {"d7": 0, "d8": 0, "d9": 0},
    }
    scores = erag_scores(
        RETRIEVED, labels, ["P_2", "recip_rank", "success_1", "map", "recall_1", "ndcg_cut_3"]
    )
    assert scores.binary
    assert scores.per_query["q1"]["recip_rank"] == pytest.approx(0.5)
    assert scores.per_query["q3"] == {
        "P_2": 0,
        "recip_rank": 0,
        "success_1": 0,
        "map": 0,
        "recall_1": 0,
        "ndcg_cut_3": 0,
    }
    assert scores.mean["P_2"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert scores.mean["success_1"] == pytest.approx(1 / 3)
    assert scores.mean["recall_1"] == pytest.approx((0 + 0.5 + 0) / 3)


def test_non_binary_labels_precision_is_mean_and_success_is_max() -> None:
    labels = {
        "q1": {"d1": 0.5, "d2": 1.0, "d3": 0.0},
        "q2": {"d4": 0.2, "d5": 0.0, "d6": 0.9},
        "q3": {},
    }
    scores = erag_scores(RETRIEVED, labels, ["P_2", "success_2", "success_3", "P"])
    assert not scores.binary
    assert scores.per_query["q1"]["P_2"] == pytest.approx(0.75)
    assert scores.per_query["q2"]["success_2"] == pytest.approx(0.2)
    assert scores.per_query["q2"]["success_3"] == pytest.approx(0.9)
    assert scores.per_query["q2"]["P"] == pytest.approx(1.1 / 3)  # no cut: the whole list
    assert scores.mean["P_2"] == pytest.approx((0.75 + 0.1 + 0.0) / 3)


@pytest.mark.parametrize("measure", ["map", "ndcg_cut_5", "recip_rank", "recall_2"])
def test_non_binary_labels_reject_other_measures(measure: str) -> None:
    with pytest.raises(ValueError, match="needs binary labels"):
        erag_scores({"q": ["a", "b"]}, {"q": {"a": 0.5, "b": 1.0}}, [measure])


def test_missing_labels_for_a_query_are_reported() -> None:
    with pytest.raises(KeyError, match="q2"):
        erag_scores({"q1": ["a"], "q2": ["b"]}, {"q1": {"a": 1}}, ["P_1"])


label_lists = st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=8), min_size=1, max_size=6)


@settings(max_examples=50, deadline=None)
@given(label_lists)
def test_binary_labels_equal_pytrec_eval(lists) -> None:
    retrieved = {f"q{i}": [f"q{i}d{j}" for j in range(len(ls))] for i, ls in enumerate(lists)}
    labels = {f"q{i}": {f"q{i}d{j}": v for j, v in enumerate(ls)} for i, ls in enumerate(lists)}
    measures = ["P_3", "recall_3", "map", "recip_rank", "ndcg_cut_3", "success_1"]
    scores = erag_scores(retrieved, labels, measures)
    run = {q: {d: float(len(ds) - r) for r, d in enumerate(ds)} for q, ds in retrieved.items()}
    reference = pytrec_eval.RelevanceEvaluator(
        labels, {"P.3", "recall.3", "map", "recip_rank", "ndcg_cut.3", "success.1"}
    ).evaluate(run)
    for q in retrieved:
        for m in measures:
            assert scores.per_query[q][m] == pytest.approx(reference.get(q, {}).get(m, 0.0))
