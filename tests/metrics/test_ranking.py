"""IR measures via pytrec_eval and answer recall@k."""

import pytest

from ragutil_dagster.metrics.ranking import (
    answer_recall_at_k,
    dcg,
    graded_ndcg,
    ir_measures,
    ranks_to_run,
)


def test_ir_measures_counts_unretrieved_queries_as_zero() -> None:
    qrels = {"q1": {"a": 1, "b": 0}, "q2": {"c": 1}}
    run = ranks_to_run({"q1": ["b", "a"]})
    per_query, mean = ir_measures(run, qrels, ["recip_rank", "ndcg_cut.2", "P_1"])
    assert per_query["q1"]["recip_rank"] == pytest.approx(0.5)
    assert per_query["q2"] == {"recip_rank": 0.0, "ndcg_cut_2": 0.0, "P_1": 0.0}
    assert mean["recip_rank"] == pytest.approx(0.25)


def test_unknown_measure_is_named() -> None:
    with pytest.raises(ValueError, match="unknown IR measure 'ndgc_10'"):
        ir_measures({"q": {"a": 1.0}}, {"q": {"a": 1}}, ["ndgc_10"])


def test_ranked_lists_with_repeats_are_rejected() -> None:
    with pytest.raises(ValueError, match="repeats"):
        ranks_to_run({"q": ["a", "a"]})


def test_answer_recall_at_k() -> None:
    ranked = [["Rome is big", "Linda Davis sang"], ["nothing here", "nor here"]]
    golds = [["Linda Davis"], "Paris"]
    assert answer_recall_at_k(ranked, golds, 1) == 0.0
    assert answer_recall_at_k(ranked, golds, 2) == 0.5


def test_graded_ndcg_takes_its_ideal_from_the_lists_own_gains() -> None:
    # gains [0.2, 0, 0.8]: DCG@3 = 0.2 + 0.8 / 2; ideal = 0.8 + 0.2 / log2(3).
    assert dcg([0.2, 0.0, 0.8]) == pytest.approx(0.6)
    assert graded_ndcg([0.2, 0.0, 0.8], 3) == pytest.approx(0.6 / (0.8 + 0.2 / 1.5849625007))
    # At k = 1 the ideal is the best gain of the whole list.
    assert graded_ndcg([0.2, 0.0, 0.8], 1) == pytest.approx(0.25)
    assert graded_ndcg([0.0, 0.0], 2) == 0.0
    with pytest.raises(ValueError, match="non-negative"):
        graded_ndcg([0.5, -0.1], 2)
