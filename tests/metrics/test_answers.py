"""Answer matching: SQuAD EM / F1, DPR has_answer, MIRAGE loose match, gold validation."""

import pytest

from ragutil_dagster.errors import EmptyGoldAnswerError
from ragutil_dagster.metrics.answers import (
    dpr_tokens,
    exact_match,
    f1,
    has_answer,
    loose_match,
    normalize_answer,
)


def test_squad_normalisation() -> None:
    assert normalize_answer("The  Eiffel-Tower, in PARIS!") == "eiffeltower in paris"
    assert normalize_answer("an apple a day") == "apple day"


def test_exact_match_best_over_aliases() -> None:
    assert exact_match("the Linda Davis.", ["Reba", "linda davis"]) == 1.0
    assert exact_match("Linda", "Linda Davis") == 0.0


def test_f1_token_overlap_best_over_aliases() -> None:
    # "davis sang" vs "linda davis": overlap 1, P = 1/2, R = 1/2.
    assert f1("Davis sang", "Linda Davis") == pytest.approx(0.5)
    assert f1("Davis sang", ["Linda Davis", "Davis"]) == pytest.approx(2 / 3)
    assert f1("", "Linda Davis") == 0.0


def test_has_answer_needs_the_contiguous_token_sequence() -> None:
    assert has_answer("It was recorded by Reba McEntire and Linda Davis.", "linda davis")
    assert not has_answer("Davis, Linda", "Linda Davis")
    # Token boundaries, not substrings: "Lindaa" does not contain the token "linda".
    assert not has_answer("Lindaa Davis", "Linda Davis")
    # Unicode NFD on both sides: composed and decomposed accents match each other.
    assert has_answer("Born in Bogota\u0301 in 1901", "Bogotá")
    assert not has_answer("café", "cafe")


def test_dpr_tokeniser_splits_punctuation_into_single_tokens() -> None:
    assert dpr_tokens("U.S. (1990)") == ["u", ".", "s", ".", "(", "1990", ")"]


def test_loose_match_is_lowercased_substring() -> None:
    assert loose_match("The answer is PARIS, France", "paris")
    assert loose_match("Lindaa", "Linda")  # substring semantics, unlike has_answer
    assert not loose_match("Rome", ["Paris", "Lyon"])


@pytest.mark.parametrize("fn", [exact_match, f1, has_answer, loose_match])
@pytest.mark.parametrize("golds", ["", "   ", ["Paris", ""], []])
def test_empty_gold_answers_are_rejected(fn, golds) -> None:
    with pytest.raises(EmptyGoldAnswerError):
        fn("anything", golds)


def test_gold_that_normalises_to_nothing_is_rejected() -> None:
    with pytest.raises(EmptyGoldAnswerError, match="after SQuAD normalisation"):
        exact_match("the", "The")
    with pytest.raises(EmptyGoldAnswerError, match="no tokens"):
        has_answer("text", "\u200b")
