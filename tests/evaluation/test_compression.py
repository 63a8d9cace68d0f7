"""The context compressors (SePer §5.4, RQ3) as pure functions: sentences, budgets, order kept,
determinism; the context-token count; ΔSePer per 100 context tokens."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from ragutil_dagster.config import CompressorConfig
from ragutil_dagster.errors import ServerResponseError, ServerUnavailableError
from ragutil_dagster.evaluation.compression import (
    ContextTokens,
    compress_contexts,
    context_sentences,
    context_token_count,
    extract,
    split_sentences,
    summary_prompt,
    truncate,
    whitespace_token_count,
)
from ragutil_dagster.metrics.seper import delta_seper_per_context_tokens

CONTEXT = [
    ("d1", "Paris is the capital of France. It lies on the Seine."),
    ("d2", "The Eiffel Tower was built in 1889! Who designed it? Gustave Eiffel did."),
    ("d3", "France borders Spain"),
]


def words(context) -> int:
    """Context tokens as whitespace words of the passages' texts."""
    return sum(len(text.split()) for _, text in context)


def test_sentences_split_after_end_marks_and_keep_their_text() -> None:
    assert split_sentences("A b. C d! E f? G") == ["A b.", "C d!", "E f?", "G"]
    assert split_sentences("No end mark") == ["No end mark"]
    assert split_sentences("  ") == []
    assert split_sentences("Dr.Who is 3.5 m tall. Yes.") == ["Dr.Who is 3.5 m tall.", "Yes."]
    assert [index for index, _ in context_sentences(CONTEXT)] == [0, 0, 1, 1, 1, 2]


@pytest.mark.parametrize("budget", [1, 4, 7, 12, 20, 25])
def test_truncate_keeps_the_longest_prefix_of_whole_words_within_the_budget(budget: int) -> None:
    kept = truncate(CONTEXT, budget, words)
    flat = " ".join(text for _, text in CONTEXT).split()
    assert words(kept) == min(budget, len(flat))
    assert " ".join(text for _, text in kept).split() == flat[:budget]
    assert [doc for doc, _ in kept] == [doc for doc, _ in CONTEXT][
        : len(kept)
    ]  # rank order, a prefix


def test_a_context_within_the_budget_is_left_as_it_is() -> None:
    assert truncate(CONTEXT, 100, words) == CONTEXT
    assert extract(CONTEXT, [0.0] * 6, 100, words) == CONTEXT


def test_extract_adds_the_most_similar_sentences_that_fit_and_keeps_their_order() -> None:
    # Sentences: 0 "Paris…France." (6 words), 1 "It lies…" (5), 2 "The Eiffel…1889!" (7),
    # 3 "Who designed it?" (3), 4 "Gustave Eiffel did." (3), 5 "France borders Spain" (3).
    similarity = [0.9, 0.1, 0.3, 0.2, 0.8, 0.5]
    kept = extract(CONTEXT, similarity, 12, words)
    # Best first: 0 (6), 4 (9), 5 (12); then nothing else fits.
    assert kept == [
        ("d1", "Paris is the capital of France."),
        ("d2", "Gustave Eiffel did."),
        ("d3", "France borders Spain"),
    ]
    assert words(kept) <= 12
    # A sentence too long for what is left is skipped, a shorter less similar one still added.
    assert extract(CONTEXT, similarity, 10, words) == [
        ("d1", "Paris is the capital of France."),
        ("d2", "Gustave Eiffel did."),
    ]
    # No whole sentence fits: the most similar one, truncated to the budget.
    assert extract(CONTEXT, similarity, 2, words) == [("d1", "Paris is")]
    # Ties go to the earlier sentence.
    assert extract(CONTEXT, [0.5] * 6, 6, words) == [("d1", "Paris is the capital of France.")]
    with pytest.raises(ValueError, match="6 sentences"):
        extract(CONTEXT, [0.1], 3, words)


def test_context_tokens_are_what_the_context_adds_to_the_rag_prompt() -> None:
    tokens = ContextTokens("Where is Paris?", "with_context", whitespace_token_count)
    # "Doc i:" adds two words per passage to the passage's own words.
    assert tokens(CONTEXT) == words(CONTEXT) + 2 * len(CONTEXT)
    assert tokens([]) == 0
    assert tokens([("x", "one two")]) == 4


def unit_vectors(texts) -> np.ndarray:
    """A deterministic toy embedder: texts naming 'Eiffel' point one way, the rest another."""
    return np.array([[1.0, 0.0] if "Eiffel" in text else [0.6, 0.8] for text in texts])


@pytest.mark.parametrize("method", ["truncate", "extractive", "abstractive"])
def test_compress_contexts_respects_the_budget_and_is_deterministic(method: str) -> None:
    questions = {"q1": "Who designed the Eiffel Tower?", "q2": "What is the capital of France?"}
    contexts = {"q1": CONTEXT, "q2": CONTEXT[:1]}
    summaries = []

    def generate(prompts, params):
        summaries.append((list(prompts), params))
        return [
            [SimpleNamespace(text=" Gustave Eiffel designed the tower, built in 1889 in Paris.")]
            for _ in prompts
        ]

    compressor = CompressorConfig(method=method, budget=10)
    run = [
        compress_contexts(
            questions,
            contexts,
            compressor,
            whitespace_token_count,
            "with_context",
            unit_vectors,
            generate,
            seed=3,
        )
        for _ in range(2)
    ]
    table = run[0]
    assert run[0].equals(run[1])
    assert table["query_id"].to_list() == ["q1", "q2"]
    assert (table["context_tokens_after"] <= 10).all()
    assert table["context_tokens_before"].to_list() == [words(CONTEXT) + 6, words(CONTEXT[:1]) + 2]
    if method == "abstractive":
        prompts, params = summaries[0]
        assert prompts == [
            summary_prompt(questions["q1"], CONTEXT),
            summary_prompt(questions["q2"], CONTEXT[:1]),
        ]
        assert (params.n, params.temperature, params.max_new_tokens, params.stop, params.seed) == (
            1,
            0.0,
            10,
            (),
            3,
        )
        assert table["doc_ids"].to_list() == [
            ["d1", "d2", "d3"],
            ["d1"],
        ]  # a summary draws on every passage
        assert table["passages"].to_list()[0] == [
            "Gustave Eiffel designed the tower, built in 1889"
        ]
    if method == "extractive":  # the most similar sentence first: "Doc 1:" + 7 words; no other fits
        assert table["passages"].to_list()[0] == ["The Eiffel Tower was built in 1889!"]
        assert table["doc_ids"].to_list()[0] == ["d2"]
    if method == "truncate":
        assert table["passages"].to_list()[0] == ["Paris is the capital of France. It lies"]


def test_without_a_compressor_the_context_is_shown_as_retrieved() -> None:
    table = compress_contexts(
        {"q": "Where?"}, {"q": CONTEXT}, None, whitespace_token_count, "with_context"
    )
    assert table.row(0, named=True) == {
        "query_id": "q",
        "doc_ids": ["d1", "d2", "d3"],
        "passages": [text for _, text in CONTEXT],
        "context_tokens_before": words(CONTEXT) + 6,
        "context_tokens_after": words(CONTEXT) + 6,
    }


def test_delta_seper_per_100_context_tokens_is_a_ratio_of_means() -> None:
    assert delta_seper_per_context_tokens([0.2, 0.4], [100, 300]) == pytest.approx(100 * 0.3 / 200)
    assert delta_seper_per_context_tokens([-0.1], [50]) == pytest.approx(-0.2)
    assert math.isnan(delta_seper_per_context_tokens([0.3], [0]))
    assert math.isnan(delta_seper_per_context_tokens([], []))
    with pytest.raises(ValueError):
        delta_seper_per_context_tokens([0.1, 0.2], [10])


class Counting:
    def count_prompt_tokens(self, prompts):
        return [7 for _ in prompts]


class Refusing:
    """A generator served without a local tokenizer whose count fails with ``failure``."""

    def __init__(self, failure: Exception) -> None:
        self.failure = failure

    def count_prompt_tokens(self, prompts):
        raise self.failure


def test_context_tokens_are_the_generators_own_when_it_counts() -> None:
    count, unit = context_token_count(Counting())
    assert (count(["a b c"]), unit) == ([7], "generator tokens")


@pytest.mark.parametrize("status", [404, 405, 501])
def test_context_tokens_fall_back_to_words_where_the_server_has_no_tokenize(status: int) -> None:
    refusal = ServerResponseError(
        f"counting: http://127.0.0.1:1/tokenize refused the request with HTTP {status}",
        status=status,
    )
    count, unit = context_token_count(Refusing(refusal))
    assert (count(["a b c"]), unit) == ([3], "whitespace words")


@pytest.mark.parametrize(
    "failure",
    [
        ServerResponseError(
            "http://127.0.0.1:1/tokenize refused the request with HTTP 401: bad key", status=401
        ),
        ServerResponseError(
            "http://127.0.0.1:1/tokenize refused the request with HTTP 400: no prompt", status=400
        ),
        ServerResponseError("http://127.0.0.1:1/tokenize gave no token `count`"),
        ServerUnavailableError(
            "counting: no answer from the server after 3 attempts (HTTP 503 overloaded)"
        ),
    ],
    ids=["unauthorised", "bad-request", "no-count", "server-down"],
)
def test_any_other_failure_to_count_context_tokens_is_raised(failure: Exception) -> None:
    with pytest.raises(type(failure)) as err:
        context_token_count(Refusing(failure))
    assert err.value is failure
