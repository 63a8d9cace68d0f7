"""Prompt templates: rendering, reference formatting, clear errors."""

from __future__ import annotations

import pytest

from ragutil_dagster import prompts


def test_with_context_numbers_documents_and_keeps_the_question_last() -> None:
    text = prompts.with_context(
        "Where was A B born?", [("A B", "A B was born in X."), ("C D", "C D lives in Y.")]
    )
    assert text == (
        "Documents:\nDoc 1: A B was born in X.\nDoc 2: C D lives in Y.\n"
        "Question: Where was A B born?\nAnswer:"
    )


def test_seper_prompts_follow_app_d5() -> None:
    closed = prompts.closed_book("Q?", "seper_closed_book")
    assert closed.startswith("Answer the question based on your own knowledge.")
    assert "Question: Q?" in closed
    rag = prompts.with_context("Q?", [("t", "passage")], "seper_with_context")
    assert "The following are given documents.\nDoc 1: passage\n" in rag


def test_unknown_prompt_and_missing_field_say_which() -> None:
    with pytest.raises(KeyError, match="unknown prompt 'nope'"):
        prompts.render("nope", question="q")
    with pytest.raises(KeyError, match="needs the field 'reference'"):
        prompts.render("with_context", question="q")


@pytest.mark.parametrize(
    "method",
    ["pointwise", "pointwise_answer", "listwise", "listwise_answer", "ranking", "ranking_answer"],
)
def test_utility_judgment_prompts_follow_figures_5_and_6(method) -> None:
    passages = [("t1", "Ada founded Acme."), ("t2", "Acme sells rope.")]
    shown = passages[:1] if method.startswith("pointwise") else passages
    text = prompts.utility_judgment(method, "Who founded Acme?", shown, "Ada")
    # The utility definition every judgment states (both criteria), then the output format.
    assert "1. Usefulness: The passage should not only be relevant to the question" in text
    assert "2. Novelty: Is the useful information new to you?" in text
    assert ("reference answer" in text.lower()) is method.endswith("_answer")
    assert ("Ada\n" in text or "Ada Determine" in text) is method.endswith("_answer")
    if method.startswith("pointwise"):
        assert text.startswith("Question: Who founded Acme?\nPassage: Ada founded Acme.\n")
        assert text.endswith("The format of the output is: 'Utility judgment: Yes/No.'")
        assert "Acme sells rope" not in text
    else:
        assert text.startswith(
            "I will provide you with 2 passages, each indicated by number identifier []."
        )
        assert (
            "\n[1] Ada founded Acme.\n[2] Acme sells rope.\nQuestion: Who founded Acme?.\n" in text
        )
        assert "t1" not in text  # titles are left out, as in every ragutil prompt
        expected = (
            "'My selection:[[i],[j],...].'" if method.startswith("listwise") else "'[i]>[j]>...'"
        )
        assert expected in text and text.endswith("do not say any word or explain.")
