"""Answer correctness: SQuAD exact match and token F1, DPR/KILT ``has_answer``, MIRAGE's loose match.

Every function takes one prediction and one gold answer or several aliases, and returns the best
score over the aliases. Empty gold answers are rejected: the DPR reference ``has_answer`` treats an
empty gold as matching every prediction, which silently inflates scores.
"""

from __future__ import annotations

import collections
import os
import re
import string
import unicodedata
from collections.abc import Sequence

import numpy as np
import regex

from ragutil_dagster.errors import EmptyGoldAnswerError

Golds = str | Sequence[str]


def gold_aliases(golds: Golds) -> tuple[str, ...]:
    """Return the gold aliases as a tuple, rejecting an empty list and empty or blank aliases."""
    aliases = (golds,) if isinstance(golds, str) else tuple(golds)
    if not aliases:
        raise EmptyGoldAnswerError("no gold answer given: the list of gold aliases is empty")
    for position, alias in enumerate(aliases):
        if not isinstance(alias, str):
            raise TypeError(f"gold answer #{position} is {type(alias).__name__}, expected str")
        if not alias.strip():
            raise EmptyGoldAnswerError(f"gold answer #{position} is empty ({alias!r})")
    return aliases


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 answer normalisation: lowercase, drop punctuation and articles, squeeze spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _normalized_golds(golds: Golds) -> list[str]:
    normalized = []
    for position, alias in enumerate(gold_aliases(golds)):
        norm = normalize_answer(alias)
        if not norm:
            raise EmptyGoldAnswerError(
                f"gold answer #{position} ({alias!r}) is empty after SQuAD normalisation"
            )
        normalized.append(norm)
    return normalized


def exact_match(prediction: str, golds: Golds) -> float:
    """SQuAD exact match (1.0 / 0.0) of the normalised prediction, best over gold aliases."""
    pred = normalize_answer(prediction)
    return float(any(pred == gold for gold in _normalized_golds(golds)))


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str, golds: Golds) -> float:
    """SQuAD token-level F1 between the normalised prediction and gold, best over gold aliases."""
    pred_tokens = normalize_answer(prediction).split()
    return max(_token_f1(pred_tokens, gold.split()) for gold in _normalized_golds(golds))


# DPR's SimpleTokenizer: runs of letters / digits / combining marks, or any single other
# non-space, non-control character.
_DPR_TOKEN = regex.compile(r"[\p{L}\p{N}\p{M}]+|[^\p{Z}\p{C}]", regex.UNICODE)


def dpr_tokens(text: str) -> list[str]:
    """Tokenise as DPR / KILT's ``has_answer`` does: Unicode NFD, DPR SimpleTokenizer, lowercase."""
    return [tok.lower() for tok in _DPR_TOKEN.findall(unicodedata.normalize("NFD", text))]


def _contains_run(haystack: Sequence[str], needle: Sequence[str]) -> bool:
    width = len(needle)
    return any(
        haystack[start : start + width] == needle for start in range(len(haystack) - width + 1)
    )


def has_answer(text: str, golds: Golds) -> bool:
    """DPR / KILT ``has_answer``: a gold alias's token sequence occurs contiguously in ``text``.

    This is the binary evaluation of the LLM-specific-utility paper (§3.2.1, eq. 1) and of DPR's
    answer recall@k. Both sides are tokenised with :func:`dpr_tokens`.
    """
    text_tokens = dpr_tokens(text)
    for position, alias in enumerate(gold_aliases(golds)):
        gold_tokens = dpr_tokens(alias)
        if not gold_tokens:
            raise EmptyGoldAnswerError(f"gold answer #{position} ({alias!r}) has no tokens")
        if _contains_run(text_tokens, gold_tokens):
            return True
    return False


def _answer_parts(premise: str, hypothesis: str) -> tuple[str, str]:
    """The two answers without the question both carry in SePer's ``"{q}? {answer}"`` form:
    the longest common prefix ending in "? " is dropped from both."""
    shared = len(os.path.commonprefix([premise, hypothesis]))
    cut = premise.rfind("? ", 0, shared) + 2 if "? " in premise[:shared] else 0
    return premise[cut:], hypothesis[cut:]


def lexical_entailment(premises: Sequence[str], hypotheses: Sequence[str]) -> np.ndarray:
    """The lexical answer judge as an NLI: P(entailment) = 1 when the hypothesis answer's tokens
    occur contiguously in the premise answer (``has_answer`` with the hypothesis as the gold),
    else P(neutral) = 1; rows [contradiction, neutral, entailment] as ``metrics.seper`` reads
    them. Texts in SePer's ``"{q}? {answer}"`` form are compared without their shared question.

    Through SePer's kernels: a sample counts for a gold answer when either contains the other,
    and two samples share a cluster when they are the same tokens."""
    out = np.zeros((len(premises), 3))
    for row, (premise, hypothesis) in enumerate(zip(premises, hypotheses, strict=True)):
        premise_answer, hypothesis_answer = _answer_parts(premise, hypothesis)
        needle = dpr_tokens(hypothesis_answer)
        entailed = bool(needle) and _contains_run(dpr_tokens(premise_answer), needle)
        out[row, 2 if entailed else 1] = 1.0
    return out


def loose_match(prediction: str, golds: Golds) -> bool:
    """MIRAGE's answer check (§4.1, "exact match" in the paper's wording): the lowercased gold
    string is a substring of the lowercased prediction, for any gold alias."""
    pred = prediction.lower()
    return any(alias.lower() in pred for alias in gold_aliases(golds))
