"""eRAG Table 1 / Figure 1: documents → per-query predictors → rank correlations with the rag
condition's downstream performance. Three queries, lists of depth 3, values checked by hand."""

from __future__ import annotations

import math

import polars as pl
import pytest

from ragutil_dagster.evaluation.predictors import (
    answer_containment,
    figure_one,
    predictor_table,
    retrieval_predictors_table,
    table_one,
)
from ragutil_dagster.tables import PREDICTOR_SCHEMA, RETRIEVAL_CORRELATION_SCHEMA

INV3 = 1 / math.log2(3)  # DCG discount of rank 2


@pytest.fixture()
def documents() -> pl.DataFrame:
    rows = [  # query, doc, rank, ΔSePer_S, eRAG label, gold utility
        ("q1", "d1", 1, 0.5, 1, True),
        ("q1", "d2", 2, -0.2, 0, False),
        ("q1", "d3", 3, 0.9, 1, False),
        ("q2", "e1", 1, 0.0, 0, False),
        ("q2", "e2", 2, 0.4, 1, True),
        ("q2", "e3", 3, 0.1, 0, False),
        ("q3", "f1", 1, -0.1, 0, False),
        ("q3", "f2", 2, -0.3, 0, False),
        ("q3", "f3", 3, 0.6, 1, True),
    ]
    schema = {
        "query_id": pl.String,
        "doc_id": pl.String,
        "rank": pl.Int32,
        "delta_seper_s": pl.Float64,
        "erag_label": pl.Int32,
        "gold_utility": pl.Boolean,
    }
    # has_answer credits d2 too (its output contains the answer without matching it exactly).
    return pl.DataFrame(rows, schema=schema, orient="row").with_columns(
        erag_label_has_answer=pl.col("erag_label") | (pl.col("doc_id") == "d2").cast(pl.Int32)
    )


@pytest.fixture()
def qrels() -> pl.DataFrame:
    # zz is relevant but never retrieved: judged on the top k only, it does not lower recall.
    return pl.DataFrame(
        {"query_id": ["q1", "q1", "q3"], "doc_id": ["d2", "zz", "f1"], "relevance": [1, 1, 2]}
    )


@pytest.fixture()
def containment(documents) -> pl.DataFrame:
    texts = {
        "d1": "Paris is the capital",
        "d2": "London",
        "d3": "in paris",
        "e1": "Rome",
        "e2": "Milan",
        "e3": "Turin",
        "f1": "Bergen",
        "f2": "Trondheim",
        "f3": "Oslo",
    }
    passages = pl.DataFrame({"id": list(texts), "text": list(texts.values())})
    queries = pl.DataFrame(
        {"query_id": ["q1", "q2", "q3"], "answers": [["Paris"], ["Rome"], ["Reykjavik"]]}
    )
    return answer_containment(documents, passages, queries)


@pytest.fixture()
def per_query() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "query_id": ["q1", "q2", "q3"],
            "em_rag": [1.0, 0.5, 0.0],
            "has_answer_rag": [1.0, 1.0, 1.0],  # constant: every correlation with it is undefined
            "delta_seper_s": [0.3, 0.1, -0.2],
            "answer_loose_oracle": [True, True, None],  # q3 has no oracle answer
            "answer_loose_rag": [True, False, False],
        }
    )


def _values(table: pl.DataFrame, approach: str, measure: str) -> list[float | None]:
    return (
        table.filter((pl.col("approach") == approach) & (pl.col("measure") == measure))
        .sort("query_id")["value"]
        .to_list()
    )


def test_answer_containment_labels_each_retrieved_passage(containment) -> None:
    contains = {doc: flag for _, doc, flag in containment.iter_rows()}
    assert {doc for doc, flag in contains.items() if flag} == {"d1", "d3", "e1"}


def test_documents_map_to_per_query_predictors(per_query, documents, qrels, containment) -> None:
    table = predictor_table(per_query, documents, qrels, containment, k=2)
    assert dict(table.schema) == PREDICTOR_SCHEMA
    # eRAG labels at k = 2: q1 [1, 0], q2 [0, 1], q3 [0, 0] (its relevant d3 is at rank 3).
    assert _values(table, "erag", "P") == pytest.approx([0.5, 0.5, 0.0])
    assert (
        _values(table, "erag", "R")
        == _values(table, "erag", "Hit")
        == pytest.approx([1.0, 1.0, 0.0])
    )
    assert _values(table, "erag", "MAP") == pytest.approx([1.0, 0.5, 0.0])
    assert _values(table, "erag", "MRR") == pytest.approx([1.0, 0.5, 0.0])
    assert _values(table, "erag", "NDCG") == pytest.approx([1.0, INV3, 0.0])
    # Provenance: q1 [0, 1] (zz unretrieved, so R = 1), q2 no qrels, q3 [2, 0] graded.
    assert _values(table, "provenance", "R") == pytest.approx([1.0, 0.0, 1.0])
    assert _values(table, "provenance", "MRR") == pytest.approx([0.5, 0.0, 1.0])
    assert _values(table, "provenance", "NDCG") == pytest.approx([INV3, 0.0, 1.0])
    assert _values(table, "answers", "MRR") == pytest.approx([1.0, 1.0, 0.0])
    assert _values(table, "gold_utility", "MRR") == pytest.approx([1.0, 0.5, 0.0])
    # ΔSePer_S per document: q1 [0.5, -0.2], q2 [0.0, 0.4], q3 [-0.1, -0.3].
    assert _values(table, "delta_seper_s_per_doc", "P") == pytest.approx([0.15, 0.2, -0.2])
    assert _values(table, "delta_seper_s_per_doc", "Hit") == pytest.approx([0.5, 0.4, -0.1])
    assert _values(table, "delta_seper_s_per_doc", "NDCG") == pytest.approx([1.0, INV3, 0.0])
    assert _values(table, "delta_seper_s", "query") == pytest.approx([0.3, 0.1, -0.2])
    assert _values(table, "mirage_context_acceptability", "CA") == [1.0, 0.0, None]


def test_deeper_cut_off_reads_further_down_the_same_documents(
    per_query, documents, qrels, containment
) -> None:
    table = predictor_table(per_query, documents, qrels, containment, k=3)
    assert _values(table, "erag", "MRR") == pytest.approx([1.0, 0.5, 1 / 3])
    assert _values(table, "delta_seper_s_per_doc", "Hit") == pytest.approx([0.9, 0.4, 0.6])
    with pytest.raises(ValueError, match="exceeds the depth"):
        predictor_table(per_query, documents, qrels, containment, k=4)


def test_table_1_correlations(per_query, documents, qrels, containment) -> None:
    table = retrieval_predictors_table(
        per_query, documents, qrels, containment, k=2, n_resamples=200
    )
    assert dict(table.schema) == RETRIEVAL_CORRELATION_SCHEMA
    cell = table.filter(
        (pl.col("approach") == "erag") & (pl.col("measure") == "Hit") & (pl.col("target") == "em")
    ).row(0, named=True)
    # Hit [1, 1, 0] against EM [1, 0.5, 0]: 2 concordant pairs, 1 tied in x only → 2 / sqrt(2 · 3).
    assert cell["kendall_tau"] == pytest.approx(2 / math.sqrt(6))
    assert cell["n_queries"] == 3 and cell["undefined"] is None
    assert cell["tau_ci_low"] <= cell["kendall_tau"] <= cell["tau_ci_high"]
    query = table.filter((pl.col("approach") == "delta_seper_s") & (pl.col("target") == "em")).row(
        0, named=True
    )
    assert query["kendall_tau"] == pytest.approx(1.0) and query["spearman_rho"] == pytest.approx(
        1.0
    )
    constant = table.filter(pl.col("target") == "has_answer")
    assert constant["kendall_tau"].null_count() == constant.height
    assert (
        constant.filter(pl.col("approach") == "erag")["undefined"]
        .str.contains("constant target")
        .all()
    )
    ca = table.filter(
        (pl.col("approach") == "mirage_context_acceptability") & (pl.col("target") == "em")
    ).row(0, named=True)
    assert ca["n_queries"] == 2 and "at least 3" in ca["undefined"]
    expected_cells = (
        5 * 6 + 3 + 1 + 1
    ) * 2  # list approaches × measures, ΔSePer per doc, query-level
    assert table.height == expected_cells


def test_table_1_layout_and_figure_1_across_k(per_query, documents, qrels, containment) -> None:
    at_2 = retrieval_predictors_table(per_query, documents, qrels, containment, k=2, n_resamples=50)
    deeper = per_query.with_columns(
        pl.Series("em_rag", [0.0, 0.5, 1.0])
    )  # a k = 3 setting answers differently
    at_3 = retrieval_predictors_table(deeper, documents, qrels, containment, k=3, n_resamples=50)
    layout = table_one(at_2)
    query = layout.filter(pl.col("approach") == "delta_seper_s").row(0, named=True)
    assert query["Kendall τ [95% CI]"].startswith("1.0 [") and query["n"] == 3
    ca = layout.filter(pl.col("approach") == "mirage_context_acceptability").row(0, named=True)
    assert ca["Kendall τ [95% CI]"] == "—" and "at least 3" in ca["undefined"]
    labelled = pl.concat([at_2, at_3]).with_columns(
        dataset=pl.lit("d"), retriever=pl.lit("r"), generator=pl.lit("g")
    )
    figure = figure_one(labelled)
    row = figure.filter(pl.col("approach") == "delta_seper_s").row(0, named=True)
    assert (row["τ k=2"], row["τ k=3"]) == pytest.approx((1.0, -1.0))
