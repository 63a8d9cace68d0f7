"""The documents table and the summary compute each paper's formula through its reference function
(issue 28): eRAG labels through ``erag_labels`` with the configured downstream metric, ΔSePer
through ``delta_seper``; the polars gold utility equals ``metrics.utility.gold_utility``."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragutil_dagster.config import ERAGConfig, parse_config
from ragutil_dagster.errors import ConfigError
from ragutil_dagster.evaluation.paper_scores import (
    ERAG_LABEL_COLUMNS,
    document_scores,
    query_scores,
)
from ragutil_dagster.evaluation.summary import summarize
from ragutil_dagster.metrics import answers, catalog
from ragutil_dagster.metrics.erag import DOWNSTREAM_METRICS, erag_labels, erag_scores
from ragutil_dagster.metrics.seper import delta_seper
from ragutil_dagster.metrics.utility import gold_utility
from ragutil_dagster.tables import GROUP_SCORE_SCHEMA


def group_row(
    qid: str,
    condition: str,
    doc_id: str | None,
    seper_s: float,
    seper_h: float,
    answer: str,
    golds: list[str],
) -> tuple:
    """One group_scores row whose judged answer is also its only sample (SePer's entropy 0)."""
    return (
        qid,
        condition,
        doc_id,
        seper_s,
        seper_h,
        0.0,
        1,
        answers.exact_match(answer, golds),
        answers.f1(answer, golds),
        float(answers.has_answer(answer, golds)),
        1.0,
        0.0,
        answer,
        answers.exact_match(answer, golds) == 1.0,
        answers.has_answer(answer, golds),
        answers.loose_match(answer, golds),
    )


def tables(
    cases: dict[str, tuple[list[str], tuple[float, float, str], list[tuple[float, float, str]]]],
):
    """Groups, queries and run of ``cases``: per query its gold answers, its closed-book
    (SePer_S, SePer_H, answer) and, per retrieved document in rank order, the same with the
    document alone."""
    groups, run = [], []
    for qid, (golds, closed, docs) in cases.items():
        groups.append(group_row(qid, "closed_book", None, *closed, golds))
        for rank, doc in enumerate(docs, start=1):
            groups.append(group_row(qid, "per_doc", f"{qid}-d{rank}", *doc, golds))
            run.append((qid, f"{qid}-d{rank}", rank))
    queries = pl.DataFrame(
        {"query_id": list(cases), "answers": [golds for golds, _, _ in cases.values()]}
    )
    return (
        pl.DataFrame(groups, schema=GROUP_SCORE_SCHEMA, orient="row"),
        queries,
        pl.DataFrame(
            run, schema={"query_id": pl.String, "doc_id": pl.String, "rank": pl.Int32}, orient="row"
        ),
    )


CASES = {
    "q1": (
        ["Paris"],
        (0.2, 0.0, "Lyon"),
        [(0.9, 1.0, "Paris"), (0.5, 0.5, "Paris France"), (0.1, 0.0, "Rome")],
    ),
    "q2": (
        ["Rome", "Roma"],
        (0.8, 1.0, "Rome"),
        [(0.7, 1.0, "the city of Rome"), (0.8, 1.0, "Roma")],
    ),
}


def test_documents_carry_every_erag_label_and_delta_seper() -> None:
    groups, queries, run = tables(CASES)
    documents = document_scores(groups, queries, run)
    rows = {r["doc_id"]: r for r in documents.iter_rows(named=True)}
    # EM, has_answer and token F1 of each document's own answer (eRAG eq. 1).
    assert [rows[d]["erag_label"] for d in ("q1-d1", "q1-d2", "q1-d3", "q2-d1", "q2-d2")] == [
        1,
        0,
        0,
        0,
        1,
    ]
    assert [
        rows[d]["erag_label_has_answer"] for d in ("q1-d1", "q1-d2", "q1-d3", "q2-d1", "q2-d2")
    ] == [1, 1, 0, 1, 1]
    assert rows["q1-d2"]["erag_label_token_f1"] == pytest.approx(2 / 3)  # "paris france" vs "paris"
    assert rows["q2-d1"]["erag_label_token_f1"] == pytest.approx(0.5)  # "city of rome" vs "rome"
    assert (
        documents.schema["erag_label"] == pl.Int32
        and documents.schema["erag_label_token_f1"] == pl.Float64
    )
    # ΔSePer of a document = SePer with it alone − SePer closed book (eq. 11).
    assert rows["q1-d1"]["delta_seper_s"] == pytest.approx(0.7) and rows["q1-d1"][
        "delta_seper_h"
    ] == pytest.approx(1.0)
    assert rows["q2-d1"]["delta_seper_s"] == pytest.approx(-0.1)
    # q2 is answered closed book: no passage is gold-utilitarian for it.
    assert [rows[d]["gold_utility"] for d in ("q1-d1", "q1-d2", "q1-d3", "q2-d1", "q2-d2")] == [
        True,
        True,
        False,
        False,
        False,
    ]


def test_summary_aggregates_the_configured_erag_label() -> None:
    groups, queries, run = tables(CASES)
    documents = document_scores(groups, queries, run)
    per_query = query_scores(groups, queries).with_columns(
        pl.lit(None, pl.Boolean).alias("answer_loose_oracle"),
        pl.lit(False).alias("answer_loose_rag"),
    )
    by_em = summarize(per_query, documents, 3)
    assert by_em["erag_P_3"] == pytest.approx(
        (1 / 3 + 1 / 3) / 2
    )  # q2 has two documents of three slots
    assert by_em["erag_map"] == pytest.approx((1.0 + 0.5) / 2)
    by_f1 = summarize(per_query, documents, 3, erag_label="token_f1")
    f1_labels = erag_labels(
        {
            "q1": {"q1-d1": "Paris", "q1-d2": "Paris France", "q1-d3": "Rome"},
            "q2": {"q2-d1": "the city of Rome", "q2-d2": "Roma"},
        },
        {"q1": ["Paris"], "q2": ["Rome", "Roma"]},
        answers.f1,
    )
    expected = erag_scores(
        {"q1": ["q1-d1", "q1-d2", "q1-d3"], "q2": ["q2-d1", "q2-d2"]},
        f1_labels,
        ["P_3", "success_3"],
    )
    assert (
        by_f1["erag_P_3"]
        == pytest.approx(expected.mean["P_3"])
        == pytest.approx(((1 + 2 / 3) / 3 + (0.5 + 1) / 3) / 2)
    )
    assert by_f1["erag_success_3"] == pytest.approx(1.0)
    # Graded labels define P and Hit only (eRAG §3): no MAP, MRR or NDCG.
    assert not {"erag_map", "erag_recip_rank", "erag_ndcg_cut_3"} & set(by_f1)
    assert summarize(per_query, documents, 3, erag_label="has_answer")["erag_P_3"] == pytest.approx(
        (2 / 3 + 2 / 3) / 2
    )


def test_the_erag_label_is_a_config_choice() -> None:
    assert ERAGConfig().label == "exact_match"
    base = {
        "name": "x",
        "datasets": [{"name": "world", "format": "synthetic"}],
        "retrievers": [{"name": "bm25", "kind": "bm25"}],
        "k": [1],
        "generators": [{"name": "g", "model": "m"}],
        "nli": {"model": "n"},
    }
    assert parse_config({**base, "erag": {"label": "token_f1"}}).erag.label == "token_f1"
    with pytest.raises(ConfigError, match="erag.label"):
        parse_config({**base, "erag": {"label": "bleu"}})


VOCABULARY = ["Paris", "Paris France", "the city of Rome", "Rome", "New York City", "London"]
document_cases = st.tuples(
    st.lists(st.sampled_from(["Paris", "Rome", "New York"]), min_size=1, max_size=2, unique=True),
    st.tuples(st.floats(0, 1), st.floats(0, 1), st.sampled_from(VOCABULARY)),
    st.lists(
        st.tuples(st.floats(0, 1), st.floats(0, 1), st.sampled_from(VOCABULARY)),
        min_size=1,
        max_size=4,
    ),
)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["q1", "q2", "q3"]), document_cases, min_size=1))
def test_documents_table_equals_the_reference_functions(cases) -> None:
    groups, queries, run = tables(cases)
    documents = document_scores(groups, queries, run)
    golds = {qid: case[0] for qid, case in cases.items()}
    outputs = {
        qid: {f"{qid}-d{r}": doc[2] for r, doc in enumerate(case[2], start=1)}
        for qid, case in cases.items()
    }
    for metric, column in ERAG_LABEL_COLUMNS.items():
        labels = erag_labels(outputs, golds, DOWNSTREAM_METRICS[metric])
        assert {
            (q, d): v for q, d, v in documents.select("query_id", "doc_id", column).iter_rows()
        } == pytest.approx({(q, d): v for q, per_doc in labels.items() for d, v in per_doc.items()})
    for qid, (gold, closed, docs) in cases.items():
        rows = documents.filter(pl.col("query_id") == qid).sort("rank")
        expected_gold = gold_utility(
            answers.has_answer(closed[2], gold),
            {
                f"{qid}-d{r}": answers.has_answer(doc[2], gold)
                for r, doc in enumerate(docs, start=1)
            },
        )
        assert set(rows.filter(pl.col("gold_utility"))["doc_id"]) == expected_gold
        assert rows["delta_seper_s"].to_list() == pytest.approx(
            [delta_seper(doc[0], closed[0]) for doc in docs]
        )
        assert rows["delta_seper_h"].to_list() == pytest.approx(
            [delta_seper(doc[1], closed[1]) for doc in docs]
        )


def test_the_score_tables_keep_their_schemas() -> None:
    groups, queries, run = tables(CASES)
    documents = document_scores(groups, queries, run)
    per_query = query_scores(groups, queries)
    assert catalog.validate_scores("group_scores", groups) is groups
    assert catalog.validate_scores("document_scores", documents) is documents
    assert catalog.validate_scores("metric_scores", per_query) is per_query
    with pytest.raises(
        ValueError, match="document_scores breaks its schema.*undeclared column 'extra'"
    ):
        catalog.validate_scores("document_scores", documents.with_columns(extra=pl.lit(1)))
    with pytest.raises(
        ValueError, match="missing column 'delta_seper_h'.*'rank' is Int64, declared Int32"
    ):
        catalog.validate_scores(
            "document_scores",
            documents.drop("delta_seper_h").with_columns(pl.col("rank").cast(pl.Int64)),
        )
