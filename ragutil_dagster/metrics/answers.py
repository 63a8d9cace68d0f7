"""Answer correctness: SQuAD exact match and token F1, DPR/KILT ``has_answer``, MIRAGE's loose match,
and SePer Table 2's ROUGE-L and BLEU baselines.

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


ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
        "eighteen", "nineteen")
TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_NUMBER_WORDS = {word: value for value, word in enumerate(ONES)}
_NUMBER_WORDS.update({word: 10 * value for value, word in enumerate(TENS) if word})
_NUMBER_WORD = re.compile(
    r"\b(?:(" + "|".join(TENS[2:]) + r")-(" + "|".join(ONES[1:10]) + r")|(" + "|".join(_NUMBER_WORDS) + r"))\b",
    re.IGNORECASE,
)


def numerals(text: str) -> str:
    """``text`` with number words written as numerals ("two" → "2", "twenty-one" → "21")."""
    def value(match: re.Match) -> str:
        return str(sum(_NUMBER_WORDS[word.lower()] for word in match.groups() if word))
    return _NUMBER_WORD.sub(value, text)


# Words that carry no answer: articles, pronouns, prepositions, conjunctions, auxiliaries, question
# words, titles and the filler of answer sentences ("yes", "no" and "not" are answers). Written
# out rather than taken from scikit-learn's English list, which also drops words that are answers
# ("fire", "bill", "system", "one").
_FUNCTION_WORDS = frozenset("""
a an the this that these those there here it its it's they them their theirs he him his she her
hers we us our ours you your yours i me my mine who whom whose which what when where why how
whatever whoever of in on at by for from to into onto upon with without within about above below
over under between among through during before after since until till than as via per
and or nor but so yet if then also too very just only
is are was were be been being am do does did done have has had having will would shall should
can could may might must s t d ll re ve m mr mrs ms dr prof
answer answers question text passage document context says said say according called named known
""".split())


_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _content_words(text: str, asked: frozenset[str] = frozenset()) -> list[str]:
    """The content words of ``text`` in order: DPR tokens, number words as numerals and "85,196"
    as one number, without punctuation, function words and the words in ``asked``."""
    return [
        token for token in dpr_tokens(numerals(_THOUSANDS.sub("", text)))
        if token not in asked and token not in _FUNCTION_WORDS and any(ch.isalnum() for ch in token)
    ]


def answer_content(text: str, question: str = "") -> frozenset[str]:
    """The words of an answer that can carry its value (:func:`_content_words`), without the words
    of ``question``: an answer that only restates its question carries none."""
    return frozenset(_content_words(text, frozenset(dpr_tokens(numerals(question)))))


def _same_word(a: str, b: str) -> bool:
    """One word, allowing inflection: equal, or (both alphabetic) sharing their first five letters
    and more than the shorter one's length minus two ("american" / "america", "germany" / "german";
    not "austria" / "australia")."""
    if a == b:
        return True
    if not (a.isalpha() and b.isalpha()):
        return False
    shared = len(os.path.commonprefix([a, b]))
    return shared >= 5 and shared > min(len(a), len(b)) - 2


def _acronym_of(words: Sequence[str], expansion: Sequence[str]) -> bool:
    """Whether a word of ``words`` is the initials of consecutive words of ``expansion``
    ("awb" / "American Water Bank", "sspx" / "Society of St Pius X")."""
    initials = "".join(word[0] for word in expansion if word.isalpha())
    return any(2 <= len(word) <= 6 and word.isalpha() and word in initials for word in words)


def shares_answer_content(premise: str, hypothesis: str) -> bool:
    """Whether two answers can be the same answer on their words: ragutil's content check, which
    ``nli: {answer_check: content}`` puts in front of the NLI (docs/metrics.md).

    Texts in SePer's ``"{q}? {answer}"`` form are compared without their shared question. The two
    answers' content words (:func:`answer_content`) must share a word (inflections and acronyms
    count) — the question's own words left out unless one answer has no other (a gold answer
    the question names: "high-voltage" for "Were they high-voltage or low-voltage?"); where both
    hold numbers, they must share a number; two answers without content words ("it", "he") pass,
    left to the NLI. So a wrong value of the right type ("a doctor" for "Dr. Kuhn", "13" for
    "12"), a restated question and a refusal are never equivalent to an answer, whatever the NLI
    says."""
    premise_answer, hypothesis_answer = _answer_parts(premise, hypothesis)
    asked = set(dpr_tokens(numerals(premise[: len(premise) - len(premise_answer)])))
    # Each answer is tokenised once: its content words in order (for acronyms), then as sets.
    premise_words, hypothesis_words = _content_words(premise_answer), _content_words(hypothesis_answer)
    first, second = set(premise_words) - asked, set(hypothesis_words) - asked
    if not first or not second:
        first, second = set(premise_words), set(hypothesis_words)
        if not first and not second:
            return True
    first_numbers = {t for t in first if t.isdigit()}
    second_numbers = {t for t in second if t.isdigit()}
    if first_numbers and second_numbers and not first_numbers & second_numbers:
        return False
    return (
        any(_same_word(a, b) for a in first for b in second)
        or _acronym_of(first, hypothesis_words)
        or _acronym_of(second, premise_words)
    )


def loose_match(prediction: str, golds: Golds) -> bool:
    """MIRAGE's answer check (§4.1, "exact match" in the paper's wording): the lowercased gold
    string is a substring of the lowercased prediction, for any gold alias."""
    pred = prediction.lower()
    return any(alias.lower() in pred for alias in gold_aliases(golds))


# --- SePer Table 2's reference-based baselines (§4.1.2: "EM, ROUGE, and BLEU … through matching
# text spans"), from the libraries everyone cites them by: rouge-score (Google's reimplementation
# of Lin 2004) and sacrebleu (Post 2018). Imported on first use: neither loads torch, but
# rouge-score pulls in nltk, which most metric callers never need.
_scorers: dict[str, object] = {}


def _scorer(name: str):
    if name not in _scorers:
        if name == "rouge_l":
            from rouge_score.rouge_scorer import RougeScorer

            _scorers[name] = RougeScorer(["rougeL"], use_stemmer=False)
        else:
            from sacrebleu.metrics import BLEU

            _scorers[name] = BLEU(effective_order=True, lowercase=True)
    return _scorers[name]


def rouge_l(prediction: str, golds: Golds) -> float:
    """ROUGE-L F-measure (Lin 2004, longest common subsequence) of the prediction, best over the
    gold aliases: rouge-score's ``RougeScorer(["rougeL"])`` with its default tokenizer (lowercase,
    non-alphanumerics dropped) and no stemming."""
    aliases = gold_aliases(golds)
    return float(max(_scorer("rouge_l").score(alias, prediction)["rougeL"].fmeasure for alias in aliases))


def bleu(prediction: str, golds: Golds) -> float:
    """Sentence BLEU (Papineni et al. 2002) of the prediction against every gold alias as a
    reference (BLEU's own multi-reference definition), on a 0–1 scale: sacrebleu's
    ``BLEU(effective_order=True, lowercase=True).sentence_score`` (13a tokenizer, exponential
    smoothing). Effective order: a short answer with no 4-gram match is scored over the n-gram
    orders it has, not zeroed — sacrebleu's setting for sentence-level BLEU."""
    return _scorer("bleu").sentence_score(prediction, list(gold_aliases(golds))).score / 100.0
