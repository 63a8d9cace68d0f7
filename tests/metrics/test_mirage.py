"""MIRAGE: RAG-adaptability metrics (eqs. 1–6) and retriever metrics."""

import math

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragutil_dagster.metrics.mirage import adaptability, oracle_passages, retriever_metrics


def test_each_metric_counts_its_two_groups() -> None:
    # One question per (b, o, m) group, in order 000, 001, ..., 111.
    triples = [(b, o, m) for b in (0, 1) for o in (0, 1) for m in (0, 1)]
    base, oracle, mixed = (list(column) for column in zip(*triples))
    result = adaptability(base, oracle, mixed)
    assert result.groups == {t: 1 for t in triples}
    assert result.noise_vulnerability == pytest.approx(2 / 8)  # G(0,1,0) + G(1,1,0)
    assert result.context_acceptability == pytest.approx(2 / 8)  # G(0,1,1) + G(1,1,1)
    assert result.context_insensitivity == pytest.approx(2 / 8)  # G(0,0,0) + G(0,0,1)
    assert result.context_misinterpretation == pytest.approx(2 / 8)  # G(1,0,0) + G(1,0,1)


def test_worked_example() -> None:
    # Oracle fixes two questions, noise breaks one of them, one question was known but the
    # oracle context confused the model.
    result = adaptability(
        base=[False, False, True, True, False],
        oracle=[True, True, True, False, False],
        mixed=[True, False, True, True, False],
    )
    assert result.noise_vulnerability == pytest.approx(1 / 5)
    assert result.context_acceptability == pytest.approx(2 / 5)
    assert result.context_insensitivity == pytest.approx(1 / 5)
    assert result.context_misinterpretation == pytest.approx(1 / 5)


@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), min_size=1, max_size=60))
def test_metrics_sum_to_one(rows) -> None:
    base, oracle, mixed = (list(c) for c in zip(*rows))
    result = adaptability(base, oracle, mixed)
    assert sum(result.as_dict().values()) == pytest.approx(1.0)
    assert sum(result.groups.values()) == len(rows)


def test_mismatched_lengths_are_rejected() -> None:
    with pytest.raises(ValueError, match="same questions"):
        adaptability([True], [True, False], [True])


def test_mirage_ndcg_takes_the_ideal_from_the_top_five_retrieved() -> None:
    ranked = ["n1", "p1", "n2", "n3", "p2"]  # relevance [0, 1, 0, 0, 1]
    mirage = retriever_metrics(ranked, {"p1", "p2"}, k=3, ndcg="mirage")
    assert mirage.ndcg == pytest.approx(0.3869, abs=5e-5)
    # With a third positive in the pool that was not retrieved, the standard ideal grows.
    standard = retriever_metrics(ranked, {"p1", "p2", "p3"}, k=3, ndcg="standard")
    assert standard.ndcg == pytest.approx((1 / 1.5849625) / (1 + 1 / 1.5849625 + 0.5), abs=1e-6)
    assert retriever_metrics(ranked, {"p1", "p2", "p3"}, k=3, ndcg="mirage").ndcg == pytest.approx(
        mirage.ndcg
    )


def discount(rank: int) -> float:
    return 1 / math.log2(rank + 1)


# Relevance [0, 1, 0, 0, 1, 0, 1, 1, 0, 0]: two positives in the top 5, four in the top 10.
TEN = ["n1", "p1", "n2", "n3", "p2", "n4", "p3", "p4", "n5", "n6"]


@pytest.mark.parametrize(
    ("k", "expected"),
    [
        (1, 0.0),
        # MIRAGE's code scores k = 1, 3, 5 within its top-5 list: the ideal holds its 2 positives.
        (3, discount(2) / (discount(1) + discount(2))),
        (5, (discount(2) + discount(5)) / (discount(1) + discount(2))),
        # k = 10 needs a top-10 list (top_k: 10), whose 4 positives make the ideal.
        (10, sum(map(discount, (2, 5, 7, 8))) / sum(map(discount, (1, 2, 3, 4)))),
    ],
)
def test_mirage_ndcg_at_every_k_as_mirage_code_scores_its_retrieved_list(
    k: int, expected: float
) -> None:
    # The deeper positives p3, p4 (ranks 7, 8) do not enter the ideal below k = 7.
    assert retriever_metrics(TEN, {"p1", "p2", "p3", "p4"}, k, ndcg="mirage").ndcg == pytest.approx(
        expected
    )
    assert retriever_metrics(
        TEN[: max(k, 5)], {"p1", "p2", "p3", "p4"}, k, ndcg="mirage"
    ).ndcg == pytest.approx(expected)


def test_mirage_ndcg_at_one_is_the_first_label() -> None:
    assert retriever_metrics(["p1", "n1"], {"p1"}, 1, ndcg="mirage").ndcg == 1.0
    assert retriever_metrics(["n1", "p1"], {"p1"}, 1, ndcg="mirage").ndcg == 0.0


def test_precision_over_k_recall_over_pool_positives() -> None:
    result = retriever_metrics(["a", "b", "c", "d"], {"a", "c", "z"}, k=2)
    assert result.precision == pytest.approx(0.5)
    assert result.recall == pytest.approx(1 / 3)
    assert result.f1 == pytest.approx(2 * 0.5 * (1 / 3) / (0.5 + 1 / 3))


def test_counts_are_the_numerators_of_eqs_2_to_5() -> None:
    result = adaptability(
        base=[False, False, True, True, False],
        oracle=[True, True, True, False, False],
        mixed=[True, False, True, True, False],
    )
    counts = result.counts()
    assert counts == {
        "noise_vulnerability": 1,
        "context_acceptability": 2,
        "context_insensitivity": 1,
        "context_misinterpretation": 1,
    }
    assert all(
        counts[name] / result.n == pytest.approx(rate) for name, rate in result.as_dict().items()
    )


def test_oracle_is_one_relevant_chunk_of_a_single_hop_question() -> None:
    queries = pl.DataFrame({"query_id": ["a", "b", "c", "d"], "n_hops": [1, 2, 1, 1]})
    qrels = pl.DataFrame(
        {
            "query_id": ["a", "a", "a", "b", "c"],
            "doc_id": ["z", "y", "x", "b1", "c1"],
            "relevance": [2, 2, 1, 1, 0],
        }
    )
    oracle = oracle_passages(qrels, queries)
    assert oracle.rows() == [
        ("a", "y", 2, 3, None),  # highest grade, then the smallest doc id
        ("b", None, None, 1, "multi_hop"),
        ("c", None, None, 0, "no_positive"),  # relevance 0 is not a positive
        ("d", None, None, 0, "no_positive"),
    ]
    # Without n_hops (every dataset but the synthetic world) each question is single-hop.
    assert oracle_passages(qrels, queries.drop("n_hops")).row(1) == ("b", "b1", 1, 1, None)
