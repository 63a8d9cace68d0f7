"""LLM-specific utility judged by the generator (evaluation/verbalized.py): the prompts of each
method, greedy decoding with each kind's token budget, robust parsing with its failures counted,
answers with candidates alone only beyond the top k, RAG with each method's passages — then
judged against the gold answers (evaluation/utility_scores.utility_scores)."""

from __future__ import annotations

import polars as pl
import pytest

from ragutil_dagster.config import parse_config
from ragutil_dagster.evaluation.utility_scores import utility_scores
from ragutil_dagster.evaluation.verbalized import (
    judge_utility,
    judgment_max_new_tokens,
    parse_failures,
)
from ragutil_dagster.metrics.utility import VERBALIZED_METHODS
from ragutil_dagster.models.generation import Sample
from ragutil_dagster.sampling import SamplingParams
from ragutil_dagster.tables import CANDIDATE_SCHEMA, GENERATION_SCHEMA, UTILITY_JUDGMENT_SCHEMA

QUERIES = pl.DataFrame(
    {
        "query_id": ["q1", "q2"],
        "question": ["Who founded Acme?", "What does Acme sell?"],
        "answers": [["Ada Byron"], ["rope"]],
    }
)
PASSAGES = pl.DataFrame(
    {
        "id": ["d1", "d2", "d3"],
        "title": ["", "", ""],
        "text": ["Ada Byron founded Acme.", "Acme sells rope.", "Bob likes tea."],
    }
)
# Three candidates per query, d1 > d2 > d3; the RAG run's k is 1.
CANDIDATES = pl.DataFrame(
    {
        "query_id": ["q1"] * 3 + ["q2"] * 3,
        "rank": [1, 2, 3] * 2,
        "doc_id": ["d1", "d2", "d3"] * 2,
        "score": [3.0, 2.0, 1.0] * 2,
        "retriever": ["bm25"] * 6,
    },
    schema_overrides={"rank": pl.Int32},
)
EXPERIMENT = parse_config(
    {
        "name": "t",
        "datasets": [{"name": "w", "format": "synthetic"}],
        "retrievers": [{"name": "bm25", "kind": "bm25"}],
        "k": [1],
        "generators": [{"name": "g", "model": "m"}],
        "nli": {"model": "n"},
        "sampling": {"max_new_tokens": 8},
        "utility": {"candidates": 3, "methods": list(VERBALIZED_METHODS)},
    }
)


class ScriptedGenerator:
    """Follows the judgment formats by rule, with one kind of answer per method (some not in the
    requested format); answers questions from the passages it is shown."""

    identity = "scripted@1"
    context_length = None

    def __init__(self) -> None:
        self.calls: list[tuple[SamplingParams, list[str]]] = []

    def count_prompt_tokens(self, prompts: list[str]) -> list[int]:
        return [len(p.split()) for p in prompts]

    def sample(self, prompts: list[str], params: SamplingParams) -> list[list[Sample]]:
        self.calls.append((params, list(prompts)))
        return [[Sample(self._answer(p), (1,), (-0.5,), "stop", 3)] for p in prompts]

    @staticmethod
    def _answer(prompt: str) -> str:
        if "Utility judgment: Yes/No" in prompt:  # pointwise: yes for Acme passages
            if "The reference answer" in prompt and "Bob likes tea" in prompt:
                return "I cannot tell."  # unparseable
            return (
                "Utility judgment: Yes."
                if "Passage: Acme" in prompt or "Passage: Ada" in prompt
                else "Utility judgment: No."
            )
        if "My selection" in prompt:
            return (
                "My selection:[[2],[1]]"
                if "Reference answer" in prompt
                else "**My selection:** [[1]]"
            )
        if "[i]>[j]" in prompt:
            return "no idea" if "Reference answer" in prompt else "[3] > [1]"
        if "Who founded" in prompt:
            return "Ada Byron" if "Ada Byron founded" in prompt else "Bob"
        return "rope" if "sells rope" in prompt else "tea"


class ScriptedScorer:
    """log P(answer | prompt): -1 when the prompt holds the answer, -5 otherwise; no attention."""

    supports_attention = False
    attention_unavailable = "scripted"

    def score(self, prompts: list[str], answers: list[str]) -> list:
        return [
            type("Scored", (), {"logprob": -1.0 if a in p else -5.0})()
            for p, a in zip(prompts, answers)
        ]


@pytest.fixture(scope="module")
def judged():
    generator = ScriptedGenerator()
    result = judge_utility(
        QUERIES, PASSAGES, CANDIDATES, 1, generator, "g", ScriptedScorer(), EXPERIMENT
    )
    return generator, result


def test_every_decoding_is_greedy_with_the_room_its_output_needs(judged) -> None:
    generator, result = judged
    assert all(params.temperature == 0 and params.n == 1 for params, _ in generator.calls)
    budgets = {}
    for params, prompts in generator.calls:
        kinds = {
            ("pointwise" if "Yes/No" in p else "listwise" if "[i]" in p else "answer")
            for p in prompts
        }
        assert len(kinds) == 1
        budgets.setdefault(kinds.pop(), set()).add(params.max_new_tokens)
    assert budgets == {
        "answer": {8},  # the answers' own max_new_tokens (sampling.max_new_tokens)
        "pointwise": {judgment_max_new_tokens("pointwise", 3)},
        "listwise": {judgment_max_new_tokens("listwise", 3)},
    }
    assert (
        judgment_max_new_tokens("listwise", 20)
        > judgment_max_new_tokens("listwise", 3)
        > judgment_max_new_tokens("pointwise", 20)
    )
    assert result.generations.schema == pl.Schema(GENERATION_SCHEMA)
    assert set(result.generations["decoding"]) == {"greedy"}


def test_candidates_are_answered_alone_only_beyond_the_top_k(judged) -> None:
    _, result = judged
    alone = result.generations.filter(pl.col("condition") == "per_candidate")
    assert sorted(alone.select("query_id", "doc_id").iter_rows()) == [
        ("q1", "d2"),
        ("q1", "d3"),
        ("q2", "d2"),
        ("q2", "d3"),
    ]
    pseudo = dict(
        result.generations.filter(pl.col("condition") == "candidates")
        .select("query_id", "text")
        .iter_rows()
    )
    assert pseudo == {"q1": "Ada Byron", "q2": "rope"}  # over all three candidates together


def test_judgments_are_parsed_with_failures_counted(judged) -> None:
    _, result = judged
    table = result.judgments
    assert table.schema == pl.Schema(UTILITY_JUDGMENT_SCHEMA)
    row = {(r["query_id"], r["method"]): r for r in table.iter_rows(named=True)}
    assert (
        row[("q1", "pointwise")]["selected"] == ["d1", "d2"]
        and row[("q1", "pointwise")]["unparseable"] == 0
    )
    # With the pseudo-answer, d3's judgment is unparseable: not selected, counted.
    assert row[("q2", "pointwise_answer")]["selected"] == ["d1", "d2"]
    assert (
        row[("q2", "pointwise_answer")]["judgments"],
        row[("q2", "pointwise_answer")]["unparseable"],
    ) == (3, 1)
    assert row[("q1", "listwise")]["selected"] == ["d1"]
    assert row[("q1", "listwise_answer")]["selected"] == ["d1", "d2"]  # rank order
    # A partial ranking is completed in rank order; the RAG prompt takes its top k = 1.
    assert row[("q1", "ranking")]["ranking"] == ["d3", "d1", "d2"] and row[("q1", "ranking")][
        "rag_doc_ids"
    ] == ["d3"]
    assert row[("q1", "ranking")]["selected"] is None
    # An unparseable ranking keeps the retrieval order.
    assert (
        row[("q1", "ranking_answer")]["ranking"] == ["d1", "d2", "d3"]
        and row[("q1", "ranking_answer")]["unparseable"] == 1
    )
    assert row[("q1", "listwise")]["shown"] == ["d1", "d2", "d3"]
    rates = dict(parse_failures(table).select("method", "parse_failure_rate").iter_rows())
    assert rates == {
        "pointwise": 0.0,
        "pointwise_answer": pytest.approx(2 / 6),
        "listwise": 0.0,
        "listwise_answer": 0.0,
        "ranking": 0.0,
        "ranking_answer": 1.0,
    }


def test_the_judgment_prompts_follow_the_papers_figures(judged) -> None:
    _, result = judged
    prompts = dict(
        result.prompts.filter(pl.col("query_id") == "q1")
        .select("condition", "prompt")
        .unique("condition")
        .iter_rows()
    )
    assert "I will also give you a reference answer." in prompts["judge_listwise_answer"]
    assert "Reference answer: Ada Byron\n" in prompts["judge_listwise_answer"]
    assert "reference answer" not in prompts["judge_listwise"].lower()
    assert (
        "[1] Ada Byron founded Acme.\n[2] Acme sells rope.\n[3] Bob likes tea."
        in prompts["judge_ranking"]
    )
    assert prompts["judge_ranking"].startswith("I will provide you with 3 passages")
    assert "The reference answer: Ada Byron" in prompts["judge_pointwise_answer"]


def test_rag_with_each_methods_passages_then_scored_against_gold(judged) -> None:
    _, result = judged
    rag = result.generations.filter(pl.col("condition").str.starts_with("rag_"))
    # Every method chose something for both queries, so every method has a RAG answer per query.
    assert rag.height == 2 * 6
    groups = pl.DataFrame(
        {  # the top-k (k = 1) answers alone and the closed-book answers
            "query_id": ["q1", "q2", "q1", "q2"],
            "condition": ["per_doc", "per_doc", "closed_book", "closed_book"],
            "doc_id": ["d1", "d1", None, None],
            "answer": ["Ada Byron", "tea", "Bob", "rope"],
            "answer_has": [True, False, False, True],
        }
    )
    scores = utility_scores(
        groups, QUERIES, CANDIDATES, result.generations, result.signals, result.judgments
    )
    table = scores.candidates
    assert table.schema == pl.Schema(CANDIDATE_SCHEMA)
    gold = {
        (q, d)
        for q, d in table.filter(pl.col("gold_utility")).select("query_id", "doc_id").iter_rows()
    }
    assert gold == {("q1", "d1")}  # q2 is known: nothing adds utility (eq. 1)
    # The top-1 answer comes from per_doc; d2 for q2 from the per_candidate greedy answer.
    assert dict(
        table.filter(pl.col("query_id") == "q2").select("doc_id", "answer_has").iter_rows()
    ) == {
        "d1": False,
        "d2": True,
        "d3": False,
    }
    has = {(q, s): h for q, s, h in scores.rag.iter_rows()}
    assert has[("q1", "ranking")] is False  # RAG with d3 alone answers "Bob"
    assert has[("q1", "listwise")] is True and has[("q1", "candidates")] is True
    # Likelihood over every candidate: the pseudo-answer "Ada Byron" is in d1 only.
    assert table.filter(pl.col("query_id") == "q1")["likelihood_selected"].to_list() == [
        True,
        False,
        False,
    ]


def test_without_methods_only_the_pseudo_answer_answers_and_signals_are_made() -> None:
    generator = ScriptedGenerator()
    experiment = EXPERIMENT.model_copy(
        update={"utility": EXPERIMENT.utility.model_copy(update={"methods": ()})}
    )
    result = judge_utility(
        QUERIES, PASSAGES, CANDIDATES, 1, generator, "g", ScriptedScorer(), experiment
    )
    assert set(result.generations["condition"]) == {"candidates", "per_candidate"}
    assert result.judgments.is_empty() and parse_failures(result.judgments).is_empty()
    assert result.signals.height == CANDIDATES.height
    assert len(generator.calls) == 1  # the pseudo-answers and the answers alone, in one decoding
