"""The partition summary's LLM-specific-utility metrics (§3.4) over the utility candidates."""

from __future__ import annotations

import polars as pl
import pytest

from ragutil_dagster.evaluation.summary import retriever_summary, summarize
from ragutil_dagster.evaluation.utility_scores import UtilityScores
from ragutil_dagster.metrics import catalog
from ragutil_dagster.retrieval.runs import mirage_retrieval
from ragutil_dagster.tables import (
    CANDIDATE_SCHEMA,
    QRELS_SCHEMA,
    RUN_SCHEMA,
    UTILITY_JUDGMENT_SCHEMA,
)

QUERIES = pl.DataFrame(
    {  # q2 is known: its judged closed-book answer holds a gold answer
        "query_id": ["q1", "q2"],
        "answer_has_closed": [False, True],
        "answer_loose_closed": [False, False],
        "answer_loose_oracle": [None, None],
        "answer_loose_rag": [False, False],
    },
    schema_overrides={"answer_loose_oracle": pl.Boolean},
)
# The RAG run's top k = 1 of each query (eRAG reads it; utility does not).
DOCUMENTS = pl.DataFrame(
    {"query_id": ["q1", "q2"], "doc_id": ["d1", "d3"], "rank": [1, 1], "erag_label": [0, 0]}
)
NO_JUDGMENTS = pl.DataFrame(schema=UTILITY_JUDGMENT_SCHEMA)
NO_RAG = pl.DataFrame(schema={"query_id": pl.String, "source": pl.String, "has_answer": pl.Boolean})


def candidates(
    rows: list[tuple], likelihood: list[float | None], attention: list[float | None]
) -> pl.DataFrame:
    """(query, doc, rank, gold) rows with their signals; likelihood selects above -2."""
    return pl.DataFrame(
        {
            "query_id": [r[0] for r in rows],
            "doc_id": [r[1] for r in rows],
            "rank": [r[2] for r in rows],
            "answer": ["a"] * len(rows),
            "answer_has": [r[3] for r in rows],
            "gold_utility": [r[3] for r in rows],
            "likelihood": likelihood,
            "likelihood_selected": [x is not None and x > -2 for x in likelihood],
            "attention": attention,
        },
        schema=CANDIDATE_SCHEMA,
    )


# q1's candidates d1, d2 (d2 is the gold utilitarian passage); q2's d3, d4 (no gold).
TWO = [
    ("q1", "d1", 1, False),
    ("q1", "d2", 2, True),
    ("q2", "d3", 1, False),
    ("q2", "d4", 2, False),
]


def summary_of(
    table: pl.DataFrame, judgments: pl.DataFrame = NO_JUDGMENTS, rag: pl.DataFrame = NO_RAG
) -> dict:
    return summarize(QUERIES, DOCUMENTS, k=1, utility=UtilityScores(table, judgments, rag))


def test_a_passage_without_a_signal_ranks_last_not_first() -> None:
    # d1 was dropped from the prompt (no signal): it must not outrank the scored gold passage d2.
    summary = summary_of(candidates(TWO, [None, -1.0, -3.0, -4.0], [None, 0.6, 0.5, 0.5]))
    assert summary["utility_likelihood_ndcg_2"] == pytest.approx(1.0)
    assert summary["utility_attention_ndcg_2"] == pytest.approx(1.0)


def test_queries_without_any_signal_are_left_out() -> None:
    # q2 has no pseudo-answer (no signal at all): only q1 counts, and it has gold.
    summary = summary_of(candidates(TWO, [-5.0, -1.0, None, None], [0.2, 0.8, None, None]))
    assert summary["utility_likelihood_precision"] == pytest.approx(1.0)  # d2 alone selected
    assert "utility_likelihood_accuracy_empty" not in summary  # q2 (empty gold) left out


def test_attention_only_ranks() -> None:
    # §3.3.2 uses attention to rank passages; a selection rule would be ours, so none is scored.
    summary = summary_of(candidates(TWO, [-5.0, -1.0, -3.0, -4.0], [0.2, 0.8, 0.5, 0.5]))
    assert "utility_attention_ndcg_2" in summary
    assert not any(
        name.startswith("utility_attention_")
        and not name.startswith(("utility_attention_ndcg", "utility_attention_recall_"))
        for name in summary
    )


def test_known_and_unknown_queries_are_scored_apart_each_with_its_n() -> None:
    # q1 (unknown) has the gold passage d2, selected by likelihood; q2 (known) has no gold
    # passage and none selected, which is right on an empty gold set (§3.4's accuracy_empty).
    summary = summary_of(candidates(TWO, [-5.0, -1.0, -3.0, -4.0], [0.2, 0.8, 0.5, 0.5]))
    assert summary["utility_likelihood_precision_unknown"] == pytest.approx(1.0)
    assert summary["n_utility_likelihood_precision_unknown"] == 1
    assert summary["utility_likelihood_accuracy_empty_known"] == pytest.approx(1.0)
    assert summary["n_utility_likelihood_accuracy_empty_known"] == 1
    # Over all queries: P / R / F1 average the one with a gold passage, accuracy the one without.
    assert (
        summary["n_utility_likelihood_f1"] == 1
        and summary["n_utility_likelihood_accuracy_empty"] == 1
    )
    assert summary["utility_likelihood_ndcg_unknown_2"] == pytest.approx(1.0)
    assert "utility_likelihood_ndcg_known_2" not in summary  # no known query has a gold passage
    assert summary["n_utility_likelihood_ndcg_unknown_at_k"] == 1
    assert summary["n_erag_P_at_k"] == 2


def test_the_authors_split_by_an_empty_gold_set_is_reported_beside_the_papers() -> None:
    # q3 is unknown (its closed-book answer is wrong) yet no candidate helps it: the paper's rule
    # counts it unknown, the authors' code (gold set empty) known.
    queries = pl.concat(
        [
            QUERIES,
            pl.DataFrame(
                {
                    "query_id": ["q3"],
                    "answer_has_closed": [False],
                    "answer_loose_closed": [False],
                    "answer_loose_oracle": [None],
                    "answer_loose_rag": [False],
                },
                schema=QUERIES.schema,
            ),
        ]
    )
    documents = pl.concat(
        [
            DOCUMENTS,
            pl.DataFrame(
                {"query_id": ["q3"], "doc_id": ["d5"], "rank": [1], "erag_label": [0]},
                schema=DOCUMENTS.schema,
            ),
        ]
    )
    table = candidates(
        [*TWO, ("q3", "d5", 1, False), ("q3", "d6", 2, False)],
        [-5.0, -1.0, -3.0, -4.0, -1.0, -3.0],
        [0.2, 0.8, 0.5, 0.5, 0.5, 0.5],
    )
    rag = pl.DataFrame(
        {
            "query_id": ["q1", "q2", "q3"],
            "source": ["candidates"] * 3,
            "has_answer": [True, True, False],
        }
    )
    summary = summarize(queries, documents, k=1, utility=UtilityScores(table, NO_JUDGMENTS, rag))
    # Empty gold: q2 selected nothing (right), q3 selected d5 by likelihood (wrong).
    assert summary["utility_likelihood_accuracy_empty_unknown"] == 0.0  # q3 alone
    assert summary["n_utility_likelihood_accuracy_empty_unknown"] == 1
    assert summary["utility_likelihood_accuracy_empty_empty_gold"] == pytest.approx(
        0.5
    )  # q2 and q3
    assert summary["n_utility_likelihood_accuracy_empty_empty_gold"] == 2
    assert summary["utility_candidates_rag_has_answer_unknown"] == pytest.approx(0.5)  # q1, q3
    assert summary["utility_candidates_rag_has_answer_nonempty_gold"] == 1.0  # q1
    assert summary["utility_candidates_rag_has_answer_empty_gold"] == pytest.approx(0.5)  # q2, q3
    assert summary["utility_candidates_rag_has_answer_known"] == 1.0  # q2
    assert summary["utility_likelihood_f1_nonempty_gold"] == summary["utility_likelihood_f1"]


def test_rankings_are_over_the_candidates_not_the_rag_top_k() -> None:
    # k = 1, six candidates: q1's gold passage is its 6th candidate and every signal ranks it
    # last. Over the candidates Recall@5 and NDCG@5 are 0; cut at k (the earlier rule) they were
    # NDCG@1 = Recall@1 = 1 whenever anything was ranked at all.
    rows = [("q1", f"d{i}", i, i == 6) for i in range(1, 7)]
    scores = [float(-i) for i in range(1, 7)]
    summary = summary_of(candidates(rows, scores, [1 / i for i in range(1, 7)]))
    for signal in ("likelihood", "attention"):
        assert summary[f"utility_{signal}_recall_5"] == 0.0
        assert summary[f"utility_{signal}_ndcg_5"] == 0.0
    # Selection is over the candidates too: likelihood selects d1 (above -2) and misses d6.
    assert (
        summary["utility_likelihood_precision"] == 0.0
        and summary["utility_likelihood_recall"] == 0.0
    )


def test_verbalized_methods_are_scored_with_their_parse_failures_and_rag_answers() -> None:
    table = candidates(TWO, [-5.0, -1.0, -3.0, -4.0], [0.2, 0.8, 0.5, 0.5])
    judgments = pl.DataFrame(
        [
            # listwise_answer picks the gold d2 for q1 and wrongly d3 for the known q2 (one answer
            # unparseable: it selected nothing and counts as a failure).
            ("q1", "listwise_answer", ["d1", "d2"], ["d2"], None, ["d2"], 1, 0),
            ("q2", "listwise_answer", ["d3", "d4"], ["d3"], None, ["d3"], 1, 0),
            ("q1", "pointwise", ["d1", "d2"], [], None, [], 2, 2),
            ("q2", "pointwise", ["d3", "d4"], [], None, [], 2, 1),
            ("q1", "ranking", ["d1", "d2"], None, ["d2", "d1"], ["d2"], 1, 0),
            ("q2", "ranking", ["d3", "d4"], None, ["d4", "d3"], ["d4"], 1, 1),
        ],
        schema=UTILITY_JUDGMENT_SCHEMA,
        orient="row",
    )
    rag = pl.DataFrame(
        {
            "query_id": ["q1", "q2", "q1", "q2"],
            "source": ["listwise_answer", "listwise_answer", "candidates", "candidates"],
            "has_answer": [True, False, False, True],
        }
    )
    summary = summary_of(table, judgments, rag)
    assert summary["utility_listwise_answer_f1"] == pytest.approx(1.0)  # q1: P = R = 1
    assert summary["utility_listwise_answer_accuracy_empty"] == 0.0  # q2 should select nothing
    assert summary["utility_pointwise_accuracy_empty_known"] == 1.0
    assert summary["utility_pointwise_recall"] == 0.0
    assert summary["utility_ranking_ndcg_2"] == pytest.approx(1.0)  # q1's gold d2 ranked first
    assert "utility_ranking_f1" not in summary and "utility_listwise_answer_ndcg_2" not in summary
    assert summary["utility_pointwise_parse_failure_rate"] == pytest.approx(3 / 4)
    assert summary["n_utility_pointwise_parse_failure_rate"] == 4  # over judgments, not queries
    assert summary["utility_ranking_parse_failure_rate"] == pytest.approx(1 / 2)
    assert summary["utility_listwise_answer_parse_failure_rate"] == 0.0
    assert summary["utility_listwise_answer_rag_has_answer"] == pytest.approx(0.5)
    assert summary["utility_listwise_answer_rag_has_answer_known"] == 0.0
    assert summary["utility_candidates_rag_has_answer_unknown"] == 0.0
    for name in summary:
        if name.startswith("utility_"):
            assert catalog.metric(name) is not None, name


def test_every_aggregate_carries_its_n() -> None:
    summary = summary_of(candidates(TWO, [-5.0, -1.0, -3.0, -4.0], [0.2, 0.8, 0.5, 0.5]))
    for name in summary:
        if name in ("queries", "documents") or name.startswith("n_"):
            continue
        assert f"n_{catalog.generic_name(name)}" in summary, name


def test_validity_follows_seper_table_2_judged_passages_of_questions_not_answered_closed_book() -> (
    None
):
    from scipy.stats import pearsonr

    queries = pl.DataFrame(
        {
            "query_id": ["q1", "q2", "q3"],
            "n_hops": [1, 1, 2],
            "answer_has_closed": [False, True, False],  # q2 is answered closed book: left out
            "answer_loose_closed": [False, True, False],
            "answer_loose_oracle": [None, None, None],
            "answer_loose_rag": [True, True, True],
        },
        schema_overrides={"answer_loose_oracle": pl.Boolean},
    )
    rows = [  # (query, doc, rank, ΔSePer, ground-truth utility or None when not judged)
        ("q1", "d1", 1, 0.8, 1.0),
        ("q1", "d2", 2, 0.1, 0.0),
        ("q1", "d5", 3, -0.9, None),
        ("q2", "d3", 1, 0.9, 0.0),
        ("q2", "d4", 2, -0.5, 1.0),
        ("q3", "d6", 1, 0.0, 0.0),
        ("q3", "d7", 2, 0.6, 1.0),
    ]
    documents = pl.DataFrame(
        {
            "query_id": [r[0] for r in rows],
            "doc_id": [r[1] for r in rows],
            "rank": [r[2] for r in rows],
            "delta_seper_s": [r[3] for r in rows],
            "delta_seper_h": [r[3] for r in rows],
            "true_utility": [r[4] for r in rows],
            "erag_label": [0] * len(rows),
            "gold_utility": [False] * len(rows),
        }
    )
    summary = summarize(queries, documents, k=3)
    expected = pearsonr([0.8, 0.1, 0.0, 0.6], [1.0, 0.0, 0.0, 1.0]).statistic
    assert summary["pearson_delta_seper_s_true_utility"] == pytest.approx(expected)
    assert summary["n_pearson_delta_seper_s_true_utility"] == 4
    # Two judged passages per question type: too few for a correlation, so none is reported.
    assert "pearson_delta_seper_s_true_utility_single_hop" not in summary


def test_every_summary_key_is_catalogued() -> None:
    """Every key a partition's summary carries — the per-query means, MIRAGE's shares and their
    counts, eRAG's aggregates, the utility and validity numbers, the retriever's MIRAGE Table 2,
    each with its n — is described by the metric catalogue."""
    queries = pl.DataFrame(
        {
            "query_id": ["q1", "q2", "q3"],
            "n_hops": [1, 1, 2],
            "answer_has_closed": [False, True, False],
            "answer_loose_closed": [False, True, False],
            "answer_loose_oracle": [True, True, None],
            "answer_loose_rag": [True, False, True],
            "delta_seper_s": [0.5, -0.1, 0.2],
            "em_rag": [1.0, 0.0, 1.0],
            "consens": [0.3, None, 0.1],
        }
    )
    rows = [
        ("q1", "d1", 1, 0.8, 1.0),
        ("q1", "d2", 2, 0.1, 0.0),
        ("q2", "d3", 1, 0.9, 0.0),
        ("q2", "d4", 2, -0.5, 1.0),
        ("q3", "d6", 1, 0.0, 0.0),
        ("q3", "d7", 2, 0.6, 1.0),
    ]
    documents = pl.DataFrame(
        {
            "query_id": [r[0] for r in rows],
            "doc_id": [r[1] for r in rows],
            "rank": [r[2] for r in rows],
            "delta_seper_s": [r[3] for r in rows],
            "delta_seper_h": [r[3] for r in rows],
            "true_utility": [r[4] for r in rows],
            "erag_label": [1, 0, 0, 1, 0, 1],
            "gold_utility": [False] * len(rows),
        }
    )
    judgments = pl.DataFrame(
        [
            ("q1", "listwise_answer", ["d1", "d2"], ["d2"], None, ["d2"], 1, 0),
            ("q1", "ranking", ["d1", "d2"], None, ["d2", "d1"], ["d2"], 1, 0),
        ],
        schema=UTILITY_JUDGMENT_SCHEMA,
        orient="row",
    )
    rag = pl.DataFrame({"query_id": ["q1"], "source": ["listwise_answer"], "has_answer": [True]})
    utility = UtilityScores(
        candidates(TWO, [-5.0, -1.0, -3.0, -4.0], [0.2, 0.8, 0.5, 0.5]), judgments, rag
    )
    run = pl.DataFrame(
        {
            "query_id": [r[0] for r in rows],
            "rank": [r[2] for r in rows],
            "doc_id": [r[1] for r in rows],
            "score": [1.0] * len(rows),
            "retriever": ["bm25"] * len(rows),
        },
        schema=RUN_SCHEMA,
    )
    qrels = pl.DataFrame(
        {"query_id": ["q1", "q2"], "doc_id": ["d1", "d4"], "relevance": [1, 1]}, schema=QRELS_SCHEMA
    )
    summary = {
        **summarize(queries, documents, k=2, utility=utility),
        **retriever_summary(mirage_retrieval(run, qrels, 2)),
    }
    for key in (
        "queries",
        "consens",
        "n_consens",
        "mirage_noise_vulnerability",
        "count_mirage_context_acceptability",
        "erag_P_2",
        "n_erag_P_at_k",
        "utility_ranking_ndcg_2",
        "n_utility_likelihood_ndcg_unknown_at_k",
        "pearson_delta_seper_s_true_utility",
        "mirage_retriever_ndcg_2",
        "n_mirage_retriever_f1_at_k",
    ):
        assert key in summary, key
    assert catalog.validate_summary(summary) is summary
    for key in summary:
        assert key in catalog.SUMMARY_COUNTS or catalog.summary_entry(key) is not None, key
    with pytest.raises(ValueError, match="no_such_metric"):
        catalog.validate_summary({**summary, "no_such_metric": 1.0, "n_no_such_metric": 3.0})


def test_erag_counts_a_query_the_retriever_returned_nothing_for_as_0() -> None:
    """trec_eval's -c convention: q2 (a run file's question without a row, ``missing_queries:
    empty``) has no document; eRAG's mean is over both questions, q2 scoring 0 on every measure."""
    documents = pl.DataFrame(
        {"query_id": ["q1", "q1"], "doc_id": ["d1", "d2"], "rank": [1, 2], "erag_label": [0, 1]}
    )
    summary = summarize(QUERIES, documents, k=2)
    alone = summarize(QUERIES.filter(pl.col("query_id") == "q1"), documents, k=2)
    for measure in ("P_2", "success_2", "map", "recip_rank", "ndcg_cut_2"):
        assert alone[f"erag_{measure}"] > 0 and summary[f"erag_{measure}"] == pytest.approx(
            alone[f"erag_{measure}"] / 2
        )
        assert summary[f"n_{catalog.generic_name(f'erag_{measure}')}"] == 2
