"""ConSens — Vankov et al.: how much an answer is grounded in the provided context (§2, Table 1).

P_text = (1/N) Σ_i exp(−log p(token_i | token_<i)) is the arithmetic mean of per-token
perplexities over the kept tokens; r = log(P_E / P_C) contrasts the empty-context (E) and
with-context (C) conditions; ConSens = 2 / (1 + e^−r) − 1 ∈ (−1, 1). Only content words count:
closed-class words, punctuation and words of the question are dropped (Table 1's caption).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import regex

# Closed-class English words: determiners, pronouns, conjunctions, prepositions, auxiliaries and
# modals (with common contractions' pieces), plus negation and existential particles.
CLOSED_CLASS_WORDS = frozenset(
    """
    a an the this that these those some any each every either neither no all both such what
    which whatever whichever whose another other much many few little several enough
    i me my mine myself you your yours yourself yourselves he him his himself she her hers herself
    it its itself we us our ours ourselves they them their theirs themselves oneself
    who whom whoever someone somebody something anyone anybody anything everyone everybody
    everything nobody nothing none
    and or but nor so yet for if because although though while whereas unless until since as
    than that whether once when whenever where wherever why how both also either
    about above across after against along amid among around at before behind below beneath
    beside besides between beyond by despite down during except for from in inside into like near
    of off on onto out outside over past per regarding round through throughout till to toward
    towards under underneath unlike up upon via with within without
    be am is are was were been being have has had having do does did doing done
    will would shall should can could may might must ought
    s t d ll m re ve not nor there here
    """.split()
)

_WORD = regex.compile(r"[\p{L}\p{N}]+(?:['’][\p{L}]+)*")
# Word-start markers of common sub-word vocabularies (GPT-2 / Llama-3 byte-level BPE, SentencePiece).
_WORD_START_MARKERS = ("Ġ", "▁", "Ċ")


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _clean_piece(token: str) -> str:
    for marker in _WORD_START_MARKERS:
        token = token.replace(marker, " ")
    return token


def _is_content_word(word: str, question_words: set[str]) -> bool:
    pieces = _words(word)
    if not pieces:
        return False  # punctuation or whitespace only
    return any(p not in CLOSED_CLASS_WORDS and p not in question_words for p in pieces)


def content_token_mask(
    tokens: Sequence[str], question: str, word_ids: Sequence[int | None] | None = None
) -> np.ndarray:
    """Which answer tokens ConSens keeps: those of content words not appearing in the question.

    ``tokens`` are the answer's tokens as strings. Without ``word_ids`` each token is a word.
    With ``word_ids`` (as a fast tokenizer's ``word_ids()`` returns them) the tokens of one word
    are judged together and kept or dropped together; tokens with ``None`` (special tokens) are
    dropped. Matching is case-insensitive.
    """
    question_words = set(_words(question))
    if word_ids is None:
        return np.array([_is_content_word(_clean_piece(t), question_words) for t in tokens], dtype=bool)
    if len(word_ids) != len(tokens):
        raise ValueError(f"{len(tokens)} tokens but {len(word_ids)} word ids")
    word_text: dict[int, str] = {}
    for token, word_id in zip(tokens, word_ids):
        if word_id is not None:
            word_text[word_id] = word_text.get(word_id, "") + _clean_piece(token)
    keep_word = {w: _is_content_word(text, question_words) for w, text in word_text.items()}
    return np.array([w is not None and keep_word[w] for w in word_ids], dtype=bool)


def mean_token_perplexity(token_logprobs: Sequence[float], keep: Sequence[bool] | None = None) -> float:
    """P_text = (1/N) Σ exp(−log p_i) over the kept tokens (ConSens §2)."""
    logprobs = np.asarray(token_logprobs, dtype=np.float64)
    mask = np.ones(logprobs.shape, dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
    if mask.shape != logprobs.shape:
        raise ValueError(f"keep has {mask.size} entries for {logprobs.size} tokens")
    if not mask.any():
        raise ValueError("no token kept: the answer has no content word outside the question")
    kept = logprobs[mask]
    if not np.all(np.isfinite(kept)) or np.any(kept > 1e-6):
        raise ValueError("token log-probs must be finite and ≤ 0")
    return float(np.mean(np.exp(-kept)))


def consens_from_perplexities(perplexity_empty: float, perplexity_context: float) -> float:
    """ConSens = 2 / (1 + e^−r) − 1 with r = log(P_E / P_C) (§2)."""
    if perplexity_empty <= 0 or perplexity_context <= 0:
        raise ValueError("perplexities must be positive")
    r = np.log(perplexity_empty) - np.log(perplexity_context)
    # 2 / (1 + e^−r) − 1 = tanh(r / 2), which stays accurate for large |r|.
    return float(np.tanh(r / 2))


def consens(
    token_logprobs_without_context: Sequence[float],
    token_logprobs_with_context: Sequence[float],
    keep: Sequence[bool] | None = None,
) -> float:
    """ConSens of one answer from its teacher-forced token log-probs without and with context.

    Both sequences score the same answer tokens, so they have equal length; ``keep`` (e.g. from
    :func:`content_token_mask`) selects the tokens that count.
    """
    if len(token_logprobs_without_context) != len(token_logprobs_with_context):
        raise ValueError(
            f"the answer has {len(token_logprobs_without_context)} tokens without context but "
            f"{len(token_logprobs_with_context)} with context: score the same answer tokens"
        )
    return consens_from_perplexities(
        mean_token_perplexity(token_logprobs_without_context, keep),
        mean_token_perplexity(token_logprobs_with_context, keep),
    )
