"""ConSens as §3 runs it: one evaluator template, the context left empty for P_E and given for
P_C; the generation prompts only as the named alternative (``prompts.consens: null``); and
Experiment 3's leave-one-document-out contexts (§3.3) under the same template."""

from __future__ import annotations

import math

import polars as pl
import pytest

from ragutil_dagster.config import PromptConfig
from ragutil_dagster.evaluation.conditions import (
    CONSENS_LEAVE_OUT,
    closed_book_prompts,
    consens_prompts,
    context_prompts,
    leave_out_prompts,
)
from ragutil_dagster.evaluation.paper_scores import leave_one_out_hits
from ragutil_dagster.evaluation.signals import consens_scores
from ragutil_dagster.evaluation.summary import summarize
from ragutil_dagster.metrics.consens import consens, leave_one_out_auc
from ragutil_dagster.models.token_scoring import ScoredContinuation
from ragutil_dagster.tables import GENERATION_SCHEMA, QRELS_SCHEMA, RUN_SCHEMA

QUERIES = pl.DataFrame(
    {"query_id": ["q1"], "question": ["Who founded Acme?"], "answers": [["Ada Byron"]]}
)
CORPUS = pl.DataFrame(
    {"id": ["d1", "d2"], "title": ["", ""], "text": ["Ada Byron founded Acme.", "Acme sells rope."]}
)
RUN = pl.DataFrame(
    {
        "query_id": ["q1", "q1"],
        "rank": [1, 2],
        "doc_id": ["d1", "d2"],
        "score": [2.0, 1.0],
        "retriever": ["r", "r"],
    },
    schema=RUN_SCHEMA,
)
ANSWER = "Ada Byron"


class PromptKeyedScorer:
    """Log-probs depend on the prompt: -0.1 per token when it holds "Ada Byron founded", else -2."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def score(self, prompts: list[str], continuations: list[str]) -> list[ScoredContinuation]:
        self.prompts.extend(prompts)
        out = []
        for prompt, text in zip(prompts, continuations):
            words = text.split()
            logprob = -0.1 if "Ada Byron founded" in prompt else -2.0
            out.append(
                ScoredContinuation(
                    tuple(range(len(words))),
                    tuple(words),
                    tuple(range(len(words))),
                    (logprob,) * len(words),
                    5,
                )
            )
        return out


def generations() -> pl.DataFrame:
    row = {column: None for column in GENERATION_SCHEMA}
    row.update(
        query_id="q1",
        condition="rag",
        sample_index=0,
        decoding="greedy",
        text=ANSWER,
        token_logprobs=[-0.1],
    )
    return pl.DataFrame([row], schema=GENERATION_SCHEMA)


def scored_prompts(config: PromptConfig, leave_one_out: bool = False) -> pl.DataFrame:
    with_context = context_prompts(QUERIES, CORPUS, RUN, pl.DataFrame(schema=QRELS_SCHEMA), config)
    return pl.concat(
        [
            closed_book_prompts(QUERIES, config),
            with_context,
            consens_prompts(QUERIES, with_context, CORPUS, config, leave_one_out=leave_one_out),
        ]
    )


def test_the_evaluator_template_is_scored_with_an_empty_and_with_the_rag_context() -> None:
    prompts = scored_prompts(PromptConfig())
    evaluator = prompts.filter(pl.col("condition").str.starts_with("consens_"))
    empty, given = (
        evaluator.filter(pl.col("condition") == c)["prompt"][0]
        for c in ("consens_empty", "consens_context")
    )
    assert empty.startswith("Consider the following context:\nContext:\n\nPlease answer")
    assert "Ada Byron founded Acme." in given and "Acme sells rope." in given
    scorer = PromptKeyedScorer()
    scores = consens_scores(prompts, generations(), QUERIES, scorer)
    table = scores.per_query
    assert set(scorer.prompts) == {empty, given}  # the evaluator template only
    assert scores.leave_one_out.is_empty()  # consens.leave_one_out is off by default
    # "Ada" and "Byron" are content words absent from the question: both tokens count.
    expected = consens([-2.0, -2.0], [-0.1, -0.1], [True, True])
    assert (
        table["consens"][0] == pytest.approx(expected) and expected > 0.5
    )  # grounded in the context


def test_null_consens_template_scores_the_generation_prompts() -> None:
    prompts = scored_prompts(PromptConfig(consens=None))
    assert not prompts["condition"].str.starts_with("consens_").any()
    scorer = PromptKeyedScorer()
    table = consens_scores(prompts, generations(), QUERIES, scorer).per_query
    rag = prompts.filter(pl.col("condition") == "rag")["prompt"][0]
    assert rag in scorer.prompts and not any(p.startswith("Consider") for p in scorer.prompts)
    assert math.isfinite(table["consens"][0])


@pytest.mark.parametrize("template", ["consens_evaluator", None])
def test_each_passage_is_left_out_in_turn_and_attributed_the_drop_of_consens(template) -> None:
    """Experiment 3 (§3.3): leaving out d1 (the one that says who founded Acme) leaves the
    answer as ungrounded as the empty context; leaving out d2 changes nothing."""
    prompts = scored_prompts(PromptConfig(consens=template), leave_one_out=True)
    left_out = prompts.filter(pl.col("condition") == CONSENS_LEAVE_OUT).sort("doc_id")
    assert left_out["doc_id"].to_list() == ["d1", "d2"] and left_out["doc_ids"].to_list() == [
        ["d2"],
        ["d1"],
    ]
    opening = "Consider the following context:" if template else "Documents:"
    assert all(p.startswith(opening) for p in left_out["prompt"])
    assert (
        "Ada Byron founded" not in left_out["prompt"][0]
        and "Acme sells rope." not in left_out["prompt"][1]
    )
    scorer = PromptKeyedScorer()
    scores = consens_scores(prompts, generations(), QUERIES, scorer)
    assert set(left_out["prompt"]) <= set(scorer.prompts)
    full = scores.per_query["consens"][0]
    attribution = dict(scores.leave_one_out.select("doc_id", "attribution").iter_rows())
    without = dict(scores.leave_one_out.select("doc_id", "consens_without").iter_rows())
    assert without == {"d1": pytest.approx(0.0), "d2": pytest.approx(full)}
    assert attribution == {"d1": pytest.approx(full), "d2": pytest.approx(0.0)} and full > 0.5


def test_a_single_passage_has_no_leave_out_context_and_a_cut_passage_keeps_its_cut() -> None:
    shown = pl.DataFrame(
        {
            "query_id": ["q1", "q1"],
            "doc_ids": [["d1"], ["d1", "d2"]],
            "last_passage_chars": [None, 4],
        }
    )
    prompts = leave_out_prompts(QUERIES, shown, CORPUS, "consens_evaluator")
    # Only the two-passage context has leave-out prompts; without d1 it shows d2 cut to "Acme".
    assert prompts["doc_id"].to_list() == ["d1", "d2"]
    assert "Acme\n" in prompts["prompt"][0] and "Acme sells" not in prompts["prompt"][0]
    assert "Ada Byron founded Acme." in prompts["prompt"][1]


def test_experiment_3_counts_the_retrieval_hits_only() -> None:
    """Per query, the documents scored with the leave-one-out contexts: q1 a hit (its relevant d1
    left out gives the lowest ConSens), q2 a hit where the relevant d5 is not the lowest, q3 no
    relevant document, q4 only relevant ones (no contrast), q5's relevant d9 dropped from the
    prompt (not scored) — so q3, q4 and q5 are left out, as the paper keeps the hits only."""
    rows = [  # query, doc, rank, ConSens without it, relevant
        ("q1", "d1", 1, -0.5, True),
        ("q1", "d2", 2, 0.8, False),
        ("q1", "d3", 3, 0.7, False),
        ("q2", "d4", 1, 0.2, False),
        ("q2", "d5", 2, 0.6, True),
        ("q3", "d6", 1, 0.1, False),
        ("q3", "d7", 2, 0.3, False),
        ("q4", "d8", 1, 0.1, True),
        ("q4", "d1", 2, 0.3, True),
        ("q5", "d2", 1, 0.4, False),
        ("q5", "d9", 2, None, True),
    ]
    full = 0.9
    documents = pl.DataFrame(
        {
            "query_id": [r[0] for r in rows],
            "doc_id": [r[1] for r in rows],
            "rank": [r[2] for r in rows],
            "consens_without": [r[3] for r in rows],
            "consens_attribution": [None if r[3] is None else full - r[3] for r in rows],
        }
    )
    qrels = pl.DataFrame(
        [(r[0], r[1], 1) for r in rows if r[4]] + [("q3", "d0", 1)],
        schema=QRELS_SCHEMA,
        orient="row",
    )
    hits = leave_one_out_hits(documents, qrels)
    assert hits["query_id"].to_list() == ["q1", "q2"]
    assert hits["consens_loo_lowest"].to_list() == [1.0, 0.0]
    assert hits["relevant"].to_list() == [[True, False, False], [False, True]]
    per_query = pl.DataFrame({"query_id": ["q1", "q2", "q3"]}).join(
        hits.select("query_id", "consens_loo_lowest"), on="query_id", how="left"
    )
    per_query = per_query.with_columns(answer_loose_oracle=pl.lit(None, pl.Boolean))
    summary = summarize(
        per_query, documents.with_columns(erag_label=pl.lit(0)), 3, leave_one_out=hits
    )
    assert summary["consens_loo_lowest"] == 0.5 and summary["n_consens_loo_lowest"] == 2
    # Kept contexts (min over the others left out): 0.7 (q1), 0.2 (q2); left out: −0.5 (q1), 0.6 (q2).
    # 0.7 beats both, 0.2 beats −0.5 only: 3 of 4 pairs.
    paper = leave_one_out_auc(hits["consens_without"].to_list(), hits["relevant"].to_list())
    assert summary["consens_loo_auc"] == pytest.approx(paper)
    assert summary["consens_loo_auc"] == pytest.approx(3 / 4) and summary["n_consens_loo_auc"] == 2
    # Attributions 1.4, 0.1, 0.2 (q1) and 0.7, 0.3 (q2): relevant 1.4 (beats 3) and 0.3 (beats 0.1, 0.2)
    # against 0.1, 0.2, 0.7 → 5 of 6 pairs.
    assert summary["consens_loo_attribution_auc"] == pytest.approx(5 / 6)
