"""LLM-specific utility: gold utilitarian passages, set and rank metrics, output parsers."""

import math

import pytest

from ragutil_dagster.errors import UnparseableOutputError
from ragutil_dagster.metrics.utility import (
    RANK_CUTOFF,
    complete_ranking,
    gold_overlap,
    gold_utility,
    is_known,
    parse_pointwise,
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
        ("My selection: [[]].", []),
        ("My selection: [[1],[1],[2]]", [1, 2]),
        ("My selection: [1, 3]", [1, 3]),
        ("**My selection:** `[[2], [5]]`", [2, 5]),
        ("'My selection:[[3]].'", [3]),
        ("My selection is: [[1]]\nPassage 1 names the founder.", [1]),
        ("[[4],[2]]", [4, 2]),  # the prefix left out: the list must open the answer
    ],
)
def test_parse_selection_tolerates_format_variants(text, expected) -> None:
    assert parse_selection(text, n_passages=5) == expected


@pytest.mark.parametrize(
    "text",
    [
        "I pick 1 and 3",
        "My selection: passage one",
        "My selection:[[1],[9]]",
        "",
        "Passages [1] and [3] are useful",  # no list where the judgment should be
        "My selection:[[1]]. Passage [3] also helps.",  # another passage after the list: ambiguous
        "My selection:[[i],[j],...].",  # the template echoed back
    ],
)
def test_parse_selection_reports_unparseable_output(text) -> None:
    with pytest.raises(UnparseableOutputError):
        parse_selection(text, n_passages=5)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[2] > [1] > [3]", [2, 1, 3]),
        ("[2]>[1]>[3].", [2, 1, 3]),
        (" [ 4 ] >  [1] ", [4, 1]),
        ("[1] > [2] > [1]", [1, 2]),
        ("Ranking: [3] > [1]", [3, 1]),
        ("`[2] > [3]`\nThe rest do not help.", [2, 3]),
        ("[3]", [3]),
    ],
)
def test_parse_ranking(text, expected) -> None:
    assert parse_ranking(text, n_passages=4) == expected


@pytest.mark.parametrize(
    "text", ["2 > 1 > 3", "[2] then [1]", "", "[0] > [1]", "[i]>[j]>...", "[1] > [2], [3]"]
)
def test_parse_ranking_reports_unparseable_output(text) -> None:
    with pytest.raises(UnparseableOutputError):
        parse_ranking(text, n_passages=3)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Utility judgment: Yes.", True),
        ("Utility judgment: No.", False),
        ("utility judgement:no", False),
        ("**Utility judgment:** YES", True),
        ("'Utility judgment: No.'", False),
        ("Yes", True),
        ("No, it only names the city.", False),
        ("The passage is new to me. Utility judgment: Yes.", True),
    ],
)
def test_parse_pointwise(text, expected) -> None:
    assert parse_pointwise(text) is expected


@pytest.mark.parametrize(
    "text", ["Utility judgment: Yes/No.", "", "Maybe", "The passage is useful.", "Yesterday"]
)
def test_parse_pointwise_reports_unparseable_output(text) -> None:
    with pytest.raises(UnparseableOutputError):
        parse_pointwise(text)


def test_a_partial_ranking_is_completed_in_retrieval_order() -> None:
    assert complete_ranking([3, 1], 5) == [3, 1, 2, 4, 5]
    assert complete_ranking([], 3) == [1, 2, 3]
    assert complete_ranking([2, 2, 1], 2) == [2, 1]


def test_the_papers_set_and_rank_metrics_on_a_hand_made_example() -> None:
    """§3.2.1 and §3.4 by hand, 20 candidates per query as in the paper.

    q1 (unknown: wrong closed book) answers correctly with d3 and d12 alone: G = {d3, d12}.
    q2 (unknown) answers correctly with d7 alone: G = {d7}. q3 is known (right closed book): G = ∅
    although it also answers with d1 (eq. 1 counts only an improvement).
    """
    docs = [f"d{i}" for i in range(1, 21)]
    right = {"q1": {"d3", "d12"}, "q2": {"d7"}, "q3": {"d1"}}
    closed = {"q1": False, "q2": False, "q3": True}
    gold = {q: gold_utility(closed[q], {d: d in right[q] for d in docs}) for q in right}
    assert gold == {"q1": {"d3", "d12"}, "q2": {"d7"}, "q3": set()}

    # Selection: q1 selects d3, d5, d9 (P 1/3, R 1/2); q2 selects d7 (P 1, R 1); q3 selects d1
    # (wrong: the right selection for a known query is nothing).
    selected = {"q1": ["d3", "d5", "d9"], "q2": ["d7"], "q3": ["d1"]}
    m = set_metrics(selected, gold)
    p, r = (1 / 3 + 1) / 2, (1 / 2 + 1) / 2
    assert (m.precision, m.recall) == (pytest.approx(p), pytest.approx(r))
    assert m.f1 == pytest.approx(2 * p * r / (p + r))  # F1 of the averaged P and R
    assert m.accuracy_empty == 0.0 and (m.n_nonempty, m.n_empty) == (2, 1)

    # Ranking: q1 puts d3 first and d12 seventh; q2 puts d7 second. NDCG@5 and Recall@5 over the
    # candidates: d12 beyond the cut-off counts as missed.
    ranked = {
        "q1": [
            "d3",
            "d1",
            "d2",
            "d4",
            "d5",
            "d6",
            "d12",
            *[d for d in docs if d not in {"d1", "d2", "d3", "d4", "d5", "d6", "d12"}],
        ],
        "q2": ["d1", "d7", *[d for d in docs if d not in {"d1", "d7"}]],
        "q3": docs,
    }
    ranks = rank_metrics(ranked, gold, k=RANK_CUTOFF)
    ndcg_q1 = 1.0 / (1.0 + 1 / math.log2(3))  # DCG 1 (d3 at rank 1); ideal: ranks 1 and 2
    ndcg_q2 = (1 / math.log2(3)) / 1.0  # d7 at rank 2; ideal: rank 1
    assert ranks.ndcg == pytest.approx((ndcg_q1 + ndcg_q2) / 2)
    assert ranks.recall == pytest.approx((1 / 2 + 1) / 2)
    assert ranks.n_queries == 2  # q3's empty gold set has no ranking metric


def test_gold_overlap_of_two_llms() -> None:
    a = {"q1": {"d1", "d2"}, "q2": set(), "q3": {"d5"}, "q4": set(), "only_a": {"d9"}}
    b = {"q1": {"d2", "d3"}, "q2": {"d4"}, "q3": {"d5"}, "q4": set()}
    overlap = gold_overlap(a, b)
    # q4 (both empty) and only_a (not judged by b) are left out: q1 1/3, q2 0/1, q3 1/1.
    assert overlap.n_queries == 3
    assert overlap.jaccard == pytest.approx((1 / 3 + 0 + 1) / 3)
    assert overlap.mean_shared == pytest.approx((1 + 0 + 1) / 3)
    # a's gold passages over the shared queries: d1, d2, d5; d1 is useless to b.
    assert overlap.n_passages_a == 3 and overlap.useful_only_to_a == pytest.approx(1 / 3)
    back = gold_overlap(b, a)
    assert back.jaccard == overlap.jaccard and back.useful_only_to_a == pytest.approx(2 / 4)


def test_gold_overlap_without_any_gold_passage_is_undefined() -> None:
    overlap = gold_overlap({"q1": set()}, {"q1": set()})
    assert (
        overlap.n_queries == 0
        and math.isnan(overlap.jaccard)
        and math.isnan(overlap.useful_only_to_a)
    )
