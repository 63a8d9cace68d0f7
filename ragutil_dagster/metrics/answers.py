"""Answer correctness: SQuAD exact match and token F1, DPR/KILT ``has_answer``, MIRAGE's loose match,
and SePer Table 2's ROUGE-L and BLEU baselines.

Every function takes one prediction and one gold answer or several aliases, and returns the best
score over the aliases. Empty gold answers are rejected: the DPR reference ``has_answer`` treats an
empty gold as matching every prediction, which silently inflates scores.
"""

from __future__ import annotations

import collections
import functools
import os
import re
import string
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

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


# --- ragutil's content check ----------------------------------------------------------------------
# Whether two answers can be the same answer on their words (docs/metrics.md, "Deviations"). The
# libraries it rests on: number-parser (number words of any size and ordinals: "two hundred",
# "one million five hundred thousand", "twenty-first"), Snowball's English stemmer (PyStemmer:
# "richards" → "richard", not "richardson") and countryinfo's country table (names, other
# spellings, ISO codes and demonyms: "France" / "French", "the US" / "the United States"). They
# are imported on first use: the metric modules import none of them.

# Words that carry no answer in any form they take: articles, pronouns, prepositions,
# conjunctions, auxiliaries, question words and the filler of answer sentences. An answer made of
# them alone ("after", "he") is compared by all its words (:func:`content_match`). Written out
# rather than taken from a stop-word list, which also drops words that are answers ("fire",
# "bill", "system", "one", "May", "US").
_FUNCTION_WORDS = frozenset(
    """
a an the this that these those there here its they them their theirs he him his she her hers we
our ours you your yours me my mine whom whose which what when where why how whatever whoever
of in on at by for from to into onto upon with without within about above below over under
between among through during before after since until till than as via per
and or nor but so yet if then also too very just only
is are was were be been being do does did done have has had having would shall should could
answer answers question text passage document context says said say according called named
""".split()
)
# Function words only in the form written here, answers in any other: lowercase "it" / "us" /
# "who" against "IT", "US", "WHO"; lowercase modals against the month "May", the name "Will" or
# "Can"; the pronoun "I" (a Roman numeral after a name is a number by then: "World War I" → 1).
_ANSWER_WHEN_CAPITALS = frozenset({"it", "us", "who"})
_ANSWER_WHEN_CAPITALISED = frozenset({"may", "will", "can", "might", "must"})
_PRONOUN_I = "i"
# "am" is a verb except after a number ("10 am"); a title is no content before a name ("Dr.
# Kuhn"), and is one alone ("a doctor" is not "Dr.").
_AM = "am"
_TITLES = frozenset({"mr", "mrs", "ms", "dr", "prof"})

_SCALES = {
    "hundred": 100,
    "thousand": 1_000,
    "million": 1_000_000,
    "billion": 1_000_000_000,
    "trillion": 1_000_000_000_000,
}
_THOUSANDS = regex.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_DIGITS_AND_SCALE = regex.compile(
    r"(?<![\d.])(\d+(?:\.\d+)?)\s*(" + "|".join(_SCALES) + r")\b", regex.IGNORECASE
)
_DIGIT_ORDINAL = regex.compile(r"\b(\d+)(?:st|nd|rd|th)\b", regex.IGNORECASE)
_DECADE = regex.compile(r"\b(\d*0)['’]?s\b", regex.IGNORECASE)
_DOTTED = regex.compile(r"(?<![\p{L}.])((?:\p{L}\.){2,})")
_CANNOT = regex.compile(r"\b(can|won|shan)['’]t\b", regex.IGNORECASE)
_NOT = regex.compile(r"(?<=\p{L})n['’]t\b", regex.IGNORECASE)
_CLITIC = regex.compile(r"(?<=\p{L})['’](?:s|d|ll|re|ve|m)\b|(?<=s)['’](?!\p{L})", regex.IGNORECASE)
_ROMAN = regex.compile(r"(?<=\b\p{Lu}\p{Ll}+ )(?=[IVX])(X{0,3}(?:IX|IV|V?I{0,3}))(?![\p{L}\d])")
_TOKEN = regex.compile(r"\d+(?:\.\d+)?|\p{L}+")
_MARK = regex.compile(r"\p{M}")


def _roman(match: regex.Match) -> str:
    """A Roman numeral after a capitalised word as digits ("Henry VIII" → "Henry 8"); a lone "I"
    only at the end of a clause ("World War I."), not the pronoun ("Then I went")."""
    numeral = match.group(1)
    if not numeral:
        return numeral
    rest = match.string[match.end() :]
    if numeral == "I" and rest.strip() and rest.lstrip()[0] not in ",.;:!?)":
        return numeral
    values = {"I": 1, "V": 5, "X": 10}
    total = sum(
        -values[a] if values[a] < values[b] else values[a] for a, b in zip(numeral, numeral[1:])
    )
    return str(total + values[numeral[-1]])


def _scaled(match: regex.Match) -> str:
    value = float(match.group(1)) * _SCALES[match.group(2).lower()]
    return str(int(value)) if value == int(value) else str(value)


@functools.lru_cache(maxsize=65536)
def numerals(text: str) -> str:
    """``text`` with numbers written as numerals, each one token: number words of any size and
    ordinals through number-parser ("two hundred" → "200", "twenty-first" → "21", "second" →
    "2"), digits with a scale ("1.5 million" → "1500000"), thousands separators dropped
    ("1,500,000" → "1500000"), digit ordinals ("2nd" → "2"), decades ("1990s" → "1990") and Roman
    numerals after a name ("Henry VIII" → "Henry 8")."""
    from number_parser import parse

    text = _ROMAN.sub(_roman, text)
    text = _THOUSANDS.sub("", text)
    text = _DIGITS_AND_SCALE.sub(_scaled, text)
    text = parse(text, language="en")
    text = _DIGITS_AND_SCALE.sub(_scaled, text)  # "a million" came back as "a 1000000"
    text = _DIGIT_ORDINAL.sub(r"\1", text)
    return _DECADE.sub(r"\1", text)


@functools.cache
def _stem():
    import Stemmer

    return Stemmer.Stemmer("english").stemWord


def _fold(text: str) -> str:
    return _MARK.sub("", unicodedata.normalize("NFD", text))


@dataclass(frozen=True)
class _Countries:
    phrases: dict[tuple[str, ...], frozenset[str]]  # lowercased words of a name → countries
    stems: dict[str, frozenset[str]]  # one-word names' stems ("americans") → countries
    codes: dict[str, frozenset[str]]  # ISO and other capital codes ("US", "UK", "PRC")
    longest: int


@functools.cache
def _countries() -> _Countries:
    """countryinfo's table: every country's name, other spellings in ASCII, codes and demonyms;
    and a short name the table holds only inside a longer one ("Britain" of "Great Britain",
    "America" of "United States of America") when the demonym is formed from it ("British",
    "American")."""
    from countryinfo import all_countries

    phrases: dict[tuple[str, ...], set[str]] = collections.defaultdict(set)
    codes: dict[str, set[str]] = collections.defaultdict(set)
    for country in all_countries():
        info = country.info()
        key = f"country:{info['name'].lower()}"
        spellings = [s for s in (info.get("altSpellings") or []) if s.isascii()]
        demonyms = regex.split(r"[,/]", info.get("demonym") or "")
        for form in [info["name"], *spellings, *demonyms]:
            form = form.strip()
            if form.isupper() and len(form) <= 4 and form.isalpha():
                codes[form].add(key)
                continue
            words = tuple(word.lower() for word in _TOKEN.findall(_fold(form)))
            if words[:1] == ("the",):
                words = words[1:]
            if words:
                phrases[words].add(key)
        for spelling in spellings:
            short = regex.fullmatch(r"(?:.* of (?:the )?|Great )(\p{L}+)", spelling)
            if short and any(
                d.strip().lower().startswith(short.group(1).lower()[:4])
                for d in demonyms
                if d.strip()
            ):
                phrases[(short.group(1).lower(),)].add(key)
    stem = _stem()
    stems: dict[str, set[str]] = collections.defaultdict(set)
    for words, keys in phrases.items():
        if len(words) == 1:
            stems[stem(words[0])] |= keys
    return _Countries(
        {w: frozenset(k) for w, k in phrases.items()},
        {s: frozenset(k) for s, k in stems.items()},
        {c: frozenset(k) for c, k in codes.items()},
        max(map(len, phrases)),
    )


@dataclass(frozen=True)
class _Unit:
    """One piece of an answer's content: a word (its stem, and the countries it names), a
    country's multi-word name, or a number; ``keys`` are what two units share."""

    keys: frozenset[str]
    word: str  # lowercased surface form ("" for a number), for acronyms
    function: bool  # a function word: content only when an answer has nothing else


@functools.lru_cache(maxsize=65536)
def _units(text: str) -> tuple[_Unit, ...]:
    """The units of ``text`` in order (:class:`_Unit`), function words marked."""
    text = _fold(text)
    text = _DOTTED.sub(lambda m: m.group(1).replace(".", ""), text)
    text = _CANNOT.sub(
        lambda m: {"can": "can", "won": "will", "shan": "shall"}[m.group(1).lower()] + " not", text
    )
    text = _NOT.sub(" not", text)
    text = _CLITIC.sub("", text)
    tokens = _TOKEN.findall(numerals(text))
    countries, stem = _countries(), _stem()
    units: list[_Unit] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token[0].isdigit():
            number = token.rstrip("0").rstrip(".") if "." in token else str(int(token))
            units.append(_Unit(frozenset({f"number:{number}"}), "", False))
            i += 1
            continue
        width = next(
            (
                n
                for n in range(min(countries.longest, len(tokens) - i), 1, -1)
                if tuple(t.lower() for t in tokens[i : i + n]) in countries.phrases
            ),
            0,
        )
        if width:
            words = tuple(t.lower() for t in tokens[i : i + width])
            units.append(_Unit(countries.phrases[words], " ".join(words), False))
            i += width
            continue
        lower = token.lower()
        following = tokens[i + 1] if i + 1 < len(tokens) else ""
        function = (
            lower in _FUNCTION_WORDS
            or lower == _PRONOUN_I
            or (lower in _ANSWER_WHEN_CAPITALS and not (token.isupper() and len(token) > 1))
            or (lower in _ANSWER_WHEN_CAPITALISED and token.islower())
            or (lower == _AM and not (units and not units[-1].word))  # "am", not "10 am"
            or (lower in _TITLES and not token.isupper() and following[:1].isupper())
        )
        keys = {f"word:{stem(lower)}"}
        if not function:
            keys |= countries.phrases.get((lower,), frozenset()) | countries.stems.get(
                stem(lower), frozenset()
            )
            if token.isupper() and len(token) > 1:
                keys |= countries.codes.get(token, frozenset())
        units.append(_Unit(frozenset(keys), lower, function))
        i += 1
    return tuple(units)


def answer_content(text: str, question: str = "") -> frozenset[str]:
    """The content of an answer as :func:`content_match` compares it: stems of its content words
    ("word:tesla"), the countries it names ("country:france" for "French"), its numbers
    ("number:200" for "two hundred") — without what ``question`` holds: an answer that only
    restates its question carries none."""
    asked = {key for unit in _units(question) for key in unit.keys}
    return frozenset(
        key
        for unit in _units(text)
        if not unit.function and not unit.keys & asked
        for key in unit.keys
    )


@dataclass(frozen=True)
class ContentMatch:
    """The content check's decision on two answers and its reason: ``shared word``, ``country
    or demonym``, ``shared number``, ``acronym``, ``no content either side`` (passed to the
    judge); ``numbers differ``, ``no shared content`` (refused)."""

    shared: bool
    reason: str


def _acronym_of(words: Sequence[str], expansion: Sequence[str]) -> bool:
    """Whether a word of ``words`` is the initials of consecutive words of ``expansion``
    ("awb" / "American Water Bank", "sspx" / "Society of St Pius X")."""
    initials = "".join(word[0] for word in expansion if word.isalpha())
    return any(2 <= len(word) <= 6 and word.isalpha() and word in initials for word in words)


def content_match(premise: str, hypothesis: str) -> ContentMatch:
    """:func:`shares_answer_content` with its reason (:class:`ContentMatch`)."""
    premise_answer, hypothesis_answer = _answer_parts(premise, hypothesis)
    asked = {
        key for unit in _units(premise[: len(premise) - len(premise_answer)]) for key in unit.keys
    }
    premise_units, hypothesis_units = _units(premise_answer), _units(hypothesis_answer)
    # The content units without the question's; with them when an answer has no other (a gold
    # answer the question names); all words when an answer is function words alone ("after").
    first, second = (
        [u for u in units if not u.function and not u.keys & asked]
        for units in (premise_units, hypothesis_units)
    )
    if not first or not second:
        first, second = (
            [u for u in units if not u.function] for units in (premise_units, hypothesis_units)
        )
        if not first and not second:
            return ContentMatch(True, "no content either side")
    if not first or not second:
        first, second = list(premise_units), list(hypothesis_units)
    first_keys = {key for unit in first for key in unit.keys}
    second_keys = {key for unit in second for key in unit.keys}
    first_numbers = {k for k in first_keys if k.startswith("number:")}
    second_numbers = {k for k in second_keys if k.startswith("number:")}
    if first_numbers and second_numbers and not first_numbers & second_numbers:
        return ContentMatch(False, "numbers differ")
    common = first_keys & second_keys
    if any(k.startswith("number:") for k in common):
        return ContentMatch(True, "shared number")
    if any(k.startswith("word:") for k in common):
        return ContentMatch(True, "shared word")
    if common:
        return ContentMatch(True, "country or demonym")
    first_words = [w for u in first if not u.function for w in u.word.split()]
    second_words = [w for u in second if not u.function for w in u.word.split()]
    if _acronym_of(first_words, second_words) or _acronym_of(second_words, first_words):
        return ContentMatch(True, "acronym")
    return ContentMatch(False, "no shared content")


def shares_answer_content(premise: str, hypothesis: str) -> bool:
    """Whether two answers can be the same answer on their words: ragutil's content check, which
    ``nli: {answer_check: content}`` puts in front of the NLI (docs/metrics.md).

    Texts in SePer's ``"{q}? {answer}"`` form are compared without their shared question. Each
    answer's content (:func:`answer_content`) is its words without function words, stemmed
    (Snowball), with the countries they name (countryinfo: "French" names France) and its numbers
    as numerals (:func:`numerals`). The two answers must share a piece of content — a stem, a
    country, a number, or an acronym and its expansion — the question's own words left out unless
    an answer has no other (a gold answer the question names: "high-voltage" for "Were they
    high-voltage or low-voltage?"), and every word counted when an answer is function words alone
    ("after"); where both hold numbers, they must share a number; two empty answers pass, left to
    the NLI. So an answer sharing nothing with the gold ("a doctor" for "Dr. Kuhn" when the
    question asks for the doctor), another number ("13" for "12"), a restated question and a
    refusal are never equivalent to it, whatever the NLI says. Two answers that share a word are
    passed to the NLI, however different ("John Smith" / "Mary Smith", "5 km" / "5 miles")."""
    return content_match(premise, hypothesis).shared


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
    return float(
        max(_scorer("rouge_l").score(alias, prediction)["rougeL"].fmeasure for alias in aliases)
    )


def bleu(prediction: str, golds: Golds) -> float:
    """Sentence BLEU (Papineni et al. 2002) of the prediction against every gold alias as a
    reference (BLEU's own multi-reference definition), on a 0–1 scale: sacrebleu's
    ``BLEU(effective_order=True, lowercase=True).sentence_score`` (13a tokenizer, exponential
    smoothing). Effective order: a short answer with no 4-gram match is scored over the n-gram
    orders it has, not zeroed — sacrebleu's setting for sentence-level BLEU."""
    return _scorer("bleu").sentence_score(prediction, list(gold_aliases(golds))).score / 100.0
