"""LLM-specific utility: gold utilitarian passages, set and rank metrics, output parsers."""

import pytest

from ragutil_dagster.errors import UnparseableOutputError
from ragutil_dagster.metrics.utility import (
    gold_utility,
    is_known,
    parse_ranking,
    parse_selection,
    rank_metrics,
    set_metrics,
)


def test_gold_utility_is_improvement_over_closed_book() -> None:
    with_each = {"d1": True, "d2": False, "d3": True}
    assert gold_utility(False, with_each) == {"d1", "d3"}
    assert gold_utility(True, with_each) == set()  # a known query: nothing adds utility
    assert is_known(True) and not is_known(False)


def test_set_metrics_average_precision_recall_then_f1() -> None:
    gold = {"q1": {"a", "b"}, "q2": {"c"}, "q3": set(), "q4": set()}
    selected = {"q1": ["a", "x"], "q2": ["c"], "q3": [], "q4": ["z"]}
    m = set_metrics(selected, gold)
    assert m.precision == pytest.approx((0.5 + 1.0) / 2)
    assert m.recall == pytest.approx((0.5 + 1.0) / 2)
    assert m.f1 == pytest.approx(0.75)
    assert m.mean_f1 == pytest.approx((0.5 + 1.0) / 2)
    assert m.accuracy_empty == pytest.approx(0.5)
    assert (m.n_nonempty, m.n_empty) == (2, 2)


def test_f1_of_averages_differs_from_mean_f1() -> None:
    gold = {"q1": {"a"}, "q2": {"b", "c", "d", "e"}}
    selected = {"q1": ["a"], "q2": ["b", "x", "y", "z"]}
    m = set_metrics(selected, gold)
    # q1: P=1, R=1, F1=1; q2: P=1/4, R=1/4, F1=1/4.
    assert m.precision == pytest.approx(0.625) and m.recall == pytest.approx(0.625)
    assert m.f1 == pytest.approx(0.625)
    assert m.mean_f1 == pytest.approx(0.625)
    gold2 = {"q1": {"a"}, "q2": {"b", "c", "d", "e"}}
    m2 = set_metrics({"q1": ["a", "x", "y", "z"], "q2": ["b", "c", "d", "e"]}, gold2)
    assert m2.f1 == pytest.approx(2 * 0.625 * 1.0 / 1.625)
    assert m2.mean_f1 == pytest.approx((0.4 + 1.0) / 2)


def test_rank_metrics_skip_empty_gold_queries() -> None:
    ranked = {"q1": ["b", "a", "c"], "q2": ["x", "y"], "q3": ["a"]}
    gold = {"q1": {"a"}, "q2": set(), "q3": {"a", "b"}}
    m = rank_metrics(ranked, gold, k=2)
    assert m.n_queries == 2
    assert m.recall == pytest.approx((1.0 + 0.5) / 2)
    assert m.per_query["q1"]["ndcg_cut_2"] == pytest.approx(1 / 1.5849625007211563)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("My selection:[[1],[3]]", [1, 3]),
        ("My selection: [ [2] , [ 4 ] ].", [2, 4]),
        ("my selection:[1],[3]", [1, 3]),
        ("My selection:[]", []),
        ("My selection: [[1],[1],[2]]", [1, 2]),
    ],
)
def test_parse_selection_tolerates_spacing(text, expected) -> None:
    assert parse_selection(text) == expected


@pytest.mark.parametrize("text", ["I pick 1 and 3", "My selection: passage one", "My selection:[[1],[9]]"])
def test_parse_selection_reports_unparseable_output(text) -> None:
    with pytest.raises(UnparseableOutputError):
        parse_selection(text, n_passages=5)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("[2] > [1] > [3]", [2, 1, 3]), ("[2]>[1]>[3].", [2, 1, 3]), (" [ 4 ] >  [1] ", [4, 1]), ("[1] > [2] > [1]", [1, 2])],
)
def test_parse_ranking(text, expected) -> None:
    assert parse_ranking(text) == expected


@pytest.mark.parametrize("text", ["2 > 1 > 3", "[2] then [1]", "", "[0] > [1]"])
def test_parse_ranking_reports_unparseable_output(text) -> None:
    with pytest.raises(UnparseableOutputError):
        parse_ranking(text, n_passages=3)
