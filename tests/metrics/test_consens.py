"""ConSens: the paper's Table 1 worked example and the content-word mask."""

import math

import numpy as np
import pytest

from ragutil_dagster.metrics.consens import (
    attribution_auc,
    consens,
    consens_from_perplexities,
    content_token_mask,
    leave_one_out_attribution,
    leave_one_out_auc,
    removal_lowest,
)

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
    assert [w for w, keep in zip(ANSWER_WORDS, mask) if keep] == [
        "biochemist",
        "computational",
        "biologist",
    ]


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
    assert consens(full_empty, full_ctx, keep) == pytest.approx(
        consens(logprobs(EMPTY), logprobs(CONTEXTS[next(iter(CONTEXTS))]))
    )


def test_subword_tokens_are_kept_or_dropped_by_word() -> None:
    tokens = ["<s>", "ĠDavid", "ĠBak", "er", "Ġis", "Ġa", "Ġbio", "chem", "ist", "."]
    word_ids = [None, 0, 1, 1, 2, 3, 4, 4, 4, 5]
    mask = content_token_mask(tokens, QUESTION, word_ids)
    np.testing.assert_array_equal(
        mask, [False, False, False, False, False, False, True, True, True, False]
    )


def test_sigmoid_form_matches_definition() -> None:
    r = math.log(7.0 / 2.0)
    assert consens_from_perplexities(7.0, 2.0) == pytest.approx(2 / (1 + math.exp(-r)) - 1)
    assert consens_from_perplexities(5.0, 5.0) == 0.0


def test_errors() -> None:
    with pytest.raises(ValueError, match="same answer tokens"):
        consens([-1.0, -2.0], [-1.0])
    with pytest.raises(ValueError, match="no token kept"):
        consens([-1.0], [-1.0], keep=[False])


# --- Experiment 3 (§3.3): leave one document out of a multi-document context -------------------
# Table 1's three contexts as the retrieved documents of one query, the first the relevant one.
# Left out in turn, the answer's word perplexities are taken as those of the document that
# dominates what is left: the scientist's while he is in the context, the footballer's without him.
SCIENTIST, COLORLESS, FOOTBALLER = CONTEXTS.values()


def test_leaving_out_the_relevant_document_drops_consens_the_most() -> None:
    full = consens(logprobs(EMPTY), logprobs(SCIENTIST))
    without = [
        consens(logprobs(EMPTY), logprobs(ppl)) for ppl in (FOOTBALLER, SCIENTIST, SCIENTIST)
    ]
    attribution = leave_one_out_attribution(full, without)
    # a_d = ConSens(C) − ConSens(C \ {d}): 0.91 − (−0.92) for the scientist, nothing for the others.
    assert attribution[0] == pytest.approx(full - without[0]) and round(attribution[0], 2) == 1.83
    np.testing.assert_array_equal(attribution[1:], [0.0, 0.0])
    assert removal_lowest(without, [True, False, False]) == 1.0
    assert removal_lowest(without, [False, True, False]) == 0.0
    # Ties for the lowest share the point: two of three tied documents are relevant.
    assert removal_lowest([0.2, 0.2, 0.2, 0.5], [True, True, False, False]) == pytest.approx(2 / 3)


def test_experiment_3_auc_pairs_the_minimum_kept_context_with_each_left_out_one() -> None:
    without = [
        [-0.92, 0.91, 0.85],  # the relevant first: kept contexts score ≥ 0.85, the left-out −0.92
        [0.30, 0.60, 0.75],  # the relevant second: its removal (0.60) is not the lowest
        [0.10, 0.40, 0.10, 0.70],  # two relevant (first and third): both left-out contexts 0.10
    ]
    relevant = [[True, False, False], [False, True, False], [True, False, True, False]]
    # Kept contexts (min over the others left out): 0.85, 0.30, 0.40; left out: −0.92, 0.60, 0.10, 0.10.
    # Pairs ordered right: 0.85 beats all 4, 0.30 beats 3, 0.40 beats 3 → 10 of 12.
    assert leave_one_out_auc(without, relevant) == pytest.approx(10 / 12)
    # Per document, the attribution a_d = ConSens(C) − ConSens(C \ {d}) with ConSens(C) = 0.9:
    full = [0.9, 0.9, 0.9]
    attributions = [leave_one_out_attribution(f, w) for f, w in zip(full, without)]
    # Relevant: 1.82, 0.30, 0.80, 0.80; others: −0.01, 0.05, 0.60, 0.15, 0.50, 0.20. Pairs ordered
    # right: 6 + 4 + 6 + 6 = 22 of 24 — across queries too (0.30 of query 2 below 0.50 of query 3).
    assert attribution_auc(attributions, relevant) == pytest.approx(22 / 24)


def test_leave_one_out_errors() -> None:
    with pytest.raises(ValueError, match="relevant document and another"):
        removal_lowest([0.1, 0.2], [False, False])
    with pytest.raises(ValueError, match="relevant document and another"):
        leave_one_out_auc([[0.1, 0.2]], [[True, True]])
    with pytest.raises(ValueError, match="one boolean relevance label per document"):
        removal_lowest([0.1, 0.2], [True])
    with pytest.raises(ValueError, match="within \\[-1, 1\\]"):
        leave_one_out_attribution(0.5, [1.5])
    with pytest.raises(ValueError, match="same positive number of queries"):
        attribution_auc([], [])
