"""Prompt templates: rendering, reference formatting, clear errors."""

from __future__ import annotations

import pytest

from ragutil_dagster import prompts


def test_with_context_numbers_documents_and_keeps_the_question_last() -> None:
    text = prompts.with_context("Where was A B born?", [("A B", "A B was born in X."),
                                                        ("C D", "C D lives in Y.")])
    assert text == ("Documents:\nDoc 1: A B was born in X.\nDoc 2: C D lives in Y.\n"
                    "Question: Where was A B born?\nAnswer:")


def test_seper_prompts_follow_app_d5() -> None:
    closed = prompts.closed_book("Q?", name="seper_closed_book")
    assert closed.startswith("Answer the question based on your own knowledge.")
    assert "Question: Q?" in closed
    rag = prompts.with_context("Q?", [("t", "passage")], name="seper_with_context")
    assert "The following are given documents.\nDoc 1: passage\n" in rag


def test_unknown_prompt_and_missing_field_say_which() -> None:
    with pytest.raises(KeyError, match="unknown prompt 'nope'"):
        prompts.render("nope", question="q")
    with pytest.raises(KeyError, match="needs the field 'reference'"):
        prompts.render("with_context", question="q")
