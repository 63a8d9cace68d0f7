"""ConSens: the paper's Table 1 worked example and the content-word mask."""

import math

import numpy as np
import pytest

from ragutil_dagster.metrics.consens import consens, consens_from_perplexities, content_token_mask

QUESTION = "What is David Baker known for?"
ANSWER_WORDS = ["David", "Baker", "is", "a", "biochemist", "and", "computational", "biologist", "."]
# Table 1 word perplexities of "biochemist", "computational", "biologist".
EMPTY = [4814.38, 7117.1, 1.61]
CONTEXTS = {
    "David Baker is an American scientist who has pioneered methods ...": [263.73, 293.92, 1.72],
    "Colorless green ideas sleep furiously.": [3098.83, 14517.0, 2.01],
    "David Baker is an English professional footballer.": [234191.27, 61734.0, 1.63],
}


def logprobs(perplexities):
    return [-math.log(p) for p in perplexities]


def test_table1_content_words_are_the_three_underlined() -> None:
    mask = content_token_mask(ANSWER_WORDS, QUESTION)
    assert [w for w, keep in zip(ANSWER_WORDS, mask) if keep] == ["biochemist", "computational", "biologist"]


def test_table1_scores() -> None:
    """Context 1 gives the printed 0.91. Contexts 2 and 3 give −0.19 and −0.92 where the paper
    prints −0.10 and −0.94: the paper averaged sub-word token perplexities, while its table lists
    whole-word perplexities, so the printed values cannot be reproduced from the table itself."""
    scores = [consens(logprobs(EMPTY), logprobs(ppl)) for ppl in CONTEXTS.values()]
    assert round(scores[0], 2) == 0.91
    assert round(scores[1], 2) == -0.19
    assert round(scores[2], 2) == -0.92


def test_mask_selects_tokens_before_averaging() -> None:
    full_empty = logprobs([1.0] * 4 + EMPTY[:1] + [1.0] + EMPTY[1:] + [1.0])
    full_ctx = logprobs([1.0] * 4 + [263.73, 1.0, 293.92, 1.72, 1.0])
    keep = content_token_mask(ANSWER_WORDS, QUESTION)
    assert consens(full_empty, full_ctx, keep) == pytest.approx(consens(logprobs(EMPTY), logprobs(CONTEXTS[next(iter(CONTEXTS))])))


def test_subword_tokens_are_kept_or_dropped_by_word() -> None:
    tokens = ["<s>", "ĠDavid", "ĠBak", "er", "Ġis", "Ġa", "Ġbio", "chem", "ist", "."]
    word_ids = [None, 0, 1, 1, 2, 3, 4, 4, 4, 5]
    mask = content_token_mask(tokens, QUESTION, word_ids)
    np.testing.assert_array_equal(mask, [False, False, False, False, False, False, True, True, True, False])


def test_sigmoid_form_matches_definition() -> None:
    r = math.log(7.0 / 2.0)
    assert consens_from_perplexities(7.0, 2.0) == pytest.approx(2 / (1 + math.exp(-r)) - 1)
    assert consens_from_perplexities(5.0, 5.0) == 0.0


def test_errors() -> None:
    with pytest.raises(ValueError, match="same answer tokens"):
        consens([-1.0, -2.0], [-1.0])
    with pytest.raises(ValueError, match="no token kept"):
        consens([-1.0], [-1.0], keep=[False])
