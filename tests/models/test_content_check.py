"""ragutil's content check in front of the answer judge (``nli: {answer_check: content}``)."""

from __future__ import annotations

import numpy as np
import pytest

from ragutil_dagster.config import NliConfig
from ragutil_dagster.metrics.answers import answer_content, numerals, shares_answer_content
from ragutil_dagster.metrics.seper import nli_text, seper
from ragutil_dagster.models.entailment import ContentCheckedJudge
from ragutil_dagster.resources.models import ModelLoader

QUESTION = "Who was Tesla's doctor in New York?"


def q(text: str, question: str = QUESTION) -> str:
    return nli_text(text, question)


@pytest.mark.parametrize(
    ("gold", "sample", "shared"),
    [
        ("Dr. Kuhn", "It was Dr. Kuhn.", True),
        ("Dr. Kuhn", "kuhn", True),
        ("Dr. Kuhn", "A doctor", False),  # the right type, no value: "doctor" is the question's word
        ("Dr. Kuhn", "Tesla's doctor in New York was", False),  # the question restated, cut off
        ("Dr. Kuhn", "The text does not say.", False),  # a refusal
        ("Dr. Kuhn", "Dr. Smith of the New York hospital", False),  # titles and asked words aside
    ],
)
def test_answers_share_content_only_through_words_the_question_does_not_hold(gold, sample, shared) -> None:
    assert shares_answer_content(q(gold), q(sample)) is shared
    assert shares_answer_content(q(sample), q(gold)) is shared  # symmetric


def test_numbers_must_agree_whatever_else_the_answers_share() -> None:
    ask = "How many years did the war last?"
    assert shares_answer_content(q("twelve years", ask), q("It lasted 12 years.", ask))
    assert not shares_answer_content(q("12 years", ask), q("13 years", ask))
    assert not shares_answer_content(q("12", ask), q("The answer to this question is 13.", ask))
    assert numerals("twenty-one and Two") == "21 and 2"


def test_inflections_of_one_word_match_and_different_words_do_not() -> None:
    ask = "Which nation?"
    assert shares_answer_content(q("American", ask), q("America", ask))
    assert not shares_answer_content(q("Austria", ask), q("Australia", ask))


def test_answers_without_content_words_are_left_to_the_judge() -> None:
    assert answer_content("It was him.", "Who?") == frozenset()
    assert shares_answer_content(q("it", "Which?"), q("he", "Which?"))
    # yes / no answers are content: they must agree
    assert not shares_answer_content(q("yes", "Did it?"), q("No, it did not.", "Did it?"))
    assert shares_answer_content(q("not", "Did it?"), q("It did not.", "Did it?"))
    assert answer_content("Tesla's lab", "") == {"tesla", "lab"}  # the clitic "s" is no content


def test_the_check_moves_entailment_to_neutral_only_where_content_is_not_shared() -> None:
    def always_entails(premises, hypotheses):
        return np.tile([0.1, 0.2, 0.7], (len(premises), 1))

    judge = always_entails
    judge.identity, judge.dtype = "toy", "none"
    judge.stats = object()
    checked = ContentCheckedJudge(judge)
    probs = checked([q("Dr. Kuhn"), q("Dr. Kuhn")], [q("Kuhn"), q("A doctor")])
    np.testing.assert_allclose(probs, [[0.1, 0.2, 0.7], [0.1, 0.9, 0.0]])
    assert checked.identity == "toy|answer_check=content"


def test_through_seper_a_confident_wrong_answer_of_the_right_type_earns_nothing() -> None:
    def always_entails(premises, hypotheses):
        return np.tile([0.0, 0.05, 0.95], (len(premises), 1))

    always_entails.identity, always_entails.dtype, always_entails.stats = "toy", "none", object()
    responses = ["Dr. Kuhn", "A doctor", "Tesla's doctor in New York was"]
    logprobs = [[-1.0], [-1.0], [-1.0]]
    unchecked = seper(responses, logprobs, ["Kuhn"], always_entails, question=QUESTION)
    checked = seper(responses, logprobs, ["Kuhn"], ContentCheckedJudge(always_entails), question=QUESTION)
    assert unchecked.score == pytest.approx(0.95)
    assert checked.score == pytest.approx(0.95 / 3)


def test_the_loader_puts_the_check_in_front_of_the_configured_judge() -> None:
    loader = ModelLoader()
    plain = loader.entailment(NliConfig(model="lexical"))
    checked = loader.entailment(NliConfig(model="lexical", answer_check="content"))
    assert isinstance(checked, ContentCheckedJudge) and checked.judge is plain
    assert checked.stats is plain.stats
    # the lexical judge credits "13" for "13 years" containing it; both hold 13: the check agrees
    assert checked([q("13 years")], [q("13")]).argmax(1).tolist() == [2]
