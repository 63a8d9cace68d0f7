"""ragutil's content check in front of the answer judge (``nli: {answer_check: content}``)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from ragutil_dagster.config import NliConfig
from ragutil_dagster.metrics.answers import answer_content, numerals, shares_answer_content
from ragutil_dagster.metrics.seper import nli_text, seper
from ragutil_dagster.models.entailment import ContentCheckedJudge, EntailmentStats
from ragutil_dagster.resources.models import ModelLoader

QUESTION = "Who was Tesla's doctor in New York?"


def q(text: str, question: str = QUESTION) -> str:
    return nli_text(text, question)


@pytest.mark.parametrize(
    ("gold", "sample", "shared"),
    [
        ("Dr. Kuhn", "It was Dr. Kuhn.", True),
        ("Dr. Kuhn", "kuhn", True),
        (
            "Dr. Kuhn",
            "A doctor",
            False,
        ),  # the right type, no value: "doctor" is the question's word
        ("Dr. Kuhn", "Tesla's doctor in New York was", False),  # the question restated, cut off
        ("Dr. Kuhn", "The text does not say.", False),  # a refusal
        ("Dr. Kuhn", "Dr. Smith of the New York hospital", False),  # titles and asked words aside
    ],
)
def test_answers_share_content_only_through_words_the_question_does_not_hold(
    gold, sample, shared
) -> None:
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
    assert answer_content("Tesla's lab", "") == {
        "word:tesla",
        "word:lab",
    }  # the clitic "s" is no content
    assert {"word:french", "country:france"} <= answer_content(
        "the French", ""
    )  # and France's territories
    assert answer_content("two hundred", "How many?") == {"number:200"}


def test_pairs_without_shared_content_are_neutral_and_never_reach_the_judge() -> None:
    asked = []

    def always_entails(premises, hypotheses):
        asked.extend(zip(premises, hypotheses))
        return np.tile([0.1, 0.2, 0.7], (len(premises), 1))

    judge = always_entails
    judge.identity, judge.dtype = "toy", "none"
    judge.stats = EntailmentStats()
    checked = ContentCheckedJudge(judge)
    probs = checked(
        [q("Dr. Kuhn"), q("Dr. Kuhn"), q("Kuhn")], [q("Kuhn"), q("A doctor"), q("Dr. Smith")]
    )
    np.testing.assert_allclose(probs, [[0.1, 0.2, 0.7], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    assert asked == [(q("Dr. Kuhn"), q("Kuhn"))]
    assert judge.stats.content_rejected == 2
    assert checked.identity == "toy|answer_check=content"
    assert checked([], []).shape == (0, 3)


SAMPLES = [
    "Dr. Kuhn",
    "Kuhn, his doctor",
    "A doctor",
    "Tesla's doctor in New York was",
    "Dr. Smith",
    "It was Kuhn.",
    "The text does not say.",
    "Smith",
    "kuhn",
    "Dr. Kuhn of New York",
]


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("kernel", ["soft", "hard"])
def test_skipping_the_judge_for_rejected_pairs_changes_no_score(kernel, strict) -> None:
    """Against the check applied after the judge (its entailment moved to neutral, the judge's
    contradiction kept): a judge with arbitrary, asymmetric labels gives the same SePer,
    clusters and credits either way."""

    def arbitrary(premises, hypotheses):
        rows = []
        for premise, hypothesis in zip(premises, hypotheses, strict=True):
            seed = int.from_bytes(
                hashlib.sha256(f"{premise}|{hypothesis}".encode()).digest()[:4], "little"
            )
            rows.append(np.random.default_rng(seed).dirichlet([1.0, 1.0, 1.0]))
        return np.array(rows).reshape(-1, 3)

    def checked_after(premises, hypotheses):
        probs = arbitrary(premises, hypotheses)
        for row, (premise, hypothesis) in enumerate(zip(premises, hypotheses, strict=True)):
            if not shares_answer_content(premise, hypothesis):
                probs[row] = [probs[row, 0], probs[row, 1] + probs[row, 2], 0.0]
        return probs

    arbitrary.identity, arbitrary.dtype, arbitrary.stats = "toy", "none", EntailmentStats()
    logprobs = [[-0.1 * (i + 1)] for i in range(len(SAMPLES))]
    for golds in (["Kuhn"], ["Dr. Kuhn", "Smith"]):
        reference = seper(
            SAMPLES, logprobs, golds, checked_after, QUESTION, kernel=kernel, strict=strict
        )
        skipped = seper(
            SAMPLES,
            logprobs,
            golds,
            ContentCheckedJudge(arbitrary),
            QUESTION,
            kernel=kernel,
            strict=strict,
        )
        assert skipped.score == pytest.approx(reference.score)
        np.testing.assert_array_equal(skipped.cluster_ids, reference.cluster_ids)
        np.testing.assert_allclose(skipped.credits, reference.credits)
        assert skipped.semantic_entropy == pytest.approx(reference.semantic_entropy)
    assert arbitrary.stats.content_rejected > 0


def test_through_seper_a_confident_wrong_answer_of_the_right_type_earns_nothing() -> None:
    def always_entails(premises, hypotheses):
        return np.tile([0.0, 0.05, 0.95], (len(premises), 1))

    always_entails.identity, always_entails.dtype, always_entails.stats = (
        "toy",
        "none",
        EntailmentStats(),
    )
    responses = ["Dr. Kuhn", "A doctor", "Tesla's doctor in New York was"]
    logprobs = [[-1.0], [-1.0], [-1.0]]
    unchecked = seper(responses, logprobs, ["Kuhn"], always_entails, question=QUESTION)
    checked = seper(
        responses, logprobs, ["Kuhn"], ContentCheckedJudge(always_entails), question=QUESTION
    )
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
