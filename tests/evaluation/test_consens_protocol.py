"""ConSens as §3 runs it: one evaluator template, the context left empty for P_E and given for
P_C; the generation prompts only as the named alternative (``prompts.consens: null``)."""

from __future__ import annotations

import math

import polars as pl
import pytest

from ragutil_dagster.config import PromptConfig
from ragutil_dagster.evaluation.conditions import context_prompts, consens_prompts, closed_book_prompts
from ragutil_dagster.evaluation.signals import consens_scores
from ragutil_dagster.metrics.consens import consens
from ragutil_dagster.models.scoring import ScoredContinuation
from ragutil_dagster.tables import GENERATION_SCHEMA, QRELS_SCHEMA, RUN_SCHEMA

QUERIES = pl.DataFrame({"query_id": ["q1"], "question": ["Who founded Acme?"], "answers": [["Ada Byron"]]})
CORPUS = pl.DataFrame({"id": ["d1", "d2"], "title": ["", ""], "text": ["Ada Byron founded Acme.", "Acme sells rope."]})
RUN = pl.DataFrame(
    {"query_id": ["q1", "q1"], "rank": [1, 2], "doc_id": ["d1", "d2"], "score": [2.0, 1.0], "retriever": ["r", "r"]},
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
            out.append(ScoredContinuation(
                tuple(range(len(words))), tuple(words), tuple(range(len(words))), (logprob,) * len(words), 5,
            ))
        return out


def generations() -> pl.DataFrame:
    row = {column: None for column in GENERATION_SCHEMA}
    row.update(query_id="q1", condition="rag", sample_index=0, decoding="greedy", text=ANSWER, token_logprobs=[-0.1])
    return pl.DataFrame([row], schema=GENERATION_SCHEMA)


def scored_prompts(config: PromptConfig) -> pl.DataFrame:
    with_context = context_prompts(QUERIES, CORPUS, RUN, pl.DataFrame(schema=QRELS_SCHEMA), config)
    return pl.concat([
        closed_book_prompts(QUERIES, config), with_context, consens_prompts(QUERIES, with_context, CORPUS, config),
    ])


def test_the_evaluator_template_is_scored_with_an_empty_and_with_the_rag_context() -> None:
    prompts = scored_prompts(PromptConfig())
    evaluator = prompts.filter(pl.col("condition").str.starts_with("consens_"))
    empty, given = (evaluator.filter(pl.col("condition") == c)["prompt"][0] for c in ("consens_empty", "consens_context"))
    assert empty.startswith("Consider the following context:\nContext:\n\nPlease answer")
    assert "Ada Byron founded Acme." in given and "Acme sells rope." in given
    scorer = PromptKeyedScorer()
    table = consens_scores(prompts, generations(), QUERIES, scorer)
    assert set(scorer.prompts) == {empty, given}  # the evaluator template only
    # "Ada" and "Byron" are content words absent from the question: both tokens count.
    expected = consens([-2.0, -2.0], [-0.1, -0.1], [True, True])
    assert table["consens"][0] == pytest.approx(expected) and expected > 0.5  # grounded in the context


def test_null_consens_template_scores_the_generation_prompts() -> None:
    prompts = scored_prompts(PromptConfig(consens=None))
    assert not prompts["condition"].str.starts_with("consens_").any()
    scorer = PromptKeyedScorer()
    table = consens_scores(prompts, generations(), QUERIES, scorer)
    rag = prompts.filter(pl.col("condition") == "rag")["prompt"][0]
    assert rag in scorer.prompts and not any(p.startswith("Consider") for p in scorer.prompts)
    assert math.isfinite(table["consens"][0])
