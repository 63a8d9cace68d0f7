"""ConSens — Vankov et al.: how much an answer is grounded in the provided context (§2, Table 1).

P_text = (1/N) Σ_i exp(−log p(token_i | token_<i)) is the arithmetic mean of per-token
perplexities over the kept tokens; r = log(P_E / P_C) contrasts the empty-context (E) and
with-context (C) conditions; ConSens = 2 / (1 + e^−r) − 1 ∈ (−1, 1). Only content words count:
closed-class words, punctuation and words of the question are dropped (Table 1's caption).

Leave-one-document-out (§3.3, Experiment 3): in a context of several retrieved documents, the
answer is scored again with each document left out in turn; a document's attribution is how far
ConSens drops without it, and the experiment's ROC AUC says how well ConSens tells the contexts
that keep the relevant document from the one that leaves it out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import regex

from ragutil_dagster.metrics.stats import roc_auc

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
        return np.array(
            [_is_content_word(_clean_piece(t), question_words) for t in tokens], dtype=bool
        )
    if len(word_ids) != len(tokens):
        raise ValueError(f"{len(tokens)} tokens but {len(word_ids)} word ids")
    word_text: dict[int, str] = {}
    for token, word_id in zip(tokens, word_ids):
        if word_id is not None:
            word_text[word_id] = word_text.get(word_id, "") + _clean_piece(token)
    keep_word = {w: _is_content_word(text, question_words) for w, text in word_text.items()}
    return np.array([w is not None and keep_word[w] for w in word_ids], dtype=bool)


def mean_token_perplexity(
    token_logprobs: Sequence[float], keep: Sequence[bool] | None = None
) -> float:
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


def _values(values: Sequence[float], what: str, bound: float = 1.0) -> np.ndarray:
    """A non-empty 1-d array of finite values within [−bound, bound] (ConSens: 1; a difference of
    two ConSens values: 2)."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or not array.size:
        raise ValueError(
            f"{what}: expected a non-empty 1-d sequence of values, got shape {array.shape}"
        )
    if not np.all(np.isfinite(array)) or np.any(np.abs(array) > bound):
        raise ValueError(f"{what}: values must be finite and within [-{bound:g}, {bound:g}]")
    return array


def _with_contrast(
    values: Sequence[float], relevant: Sequence[bool], what: str, bound: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """One query's values with its boolean relevance labels; it must hold a relevant document and
    another one (a retrieval hit, Experiment 3)."""
    array = _values(values, what, bound)
    labels = np.asarray(relevant)
    if labels.shape != array.shape or labels.dtype != bool:
        raise ValueError(
            f"{what}: expected one boolean relevance label per document ({array.size}), got {list(relevant)!r}"
        )
    if labels.all() or not labels.any():
        raise ValueError(
            f"{what}: needs a relevant document and another one in the context (Experiment 3 scores "
            f"retrieval hits only), got relevance {labels.tolist()}"
        )
    return array, labels


def _queries_with_contrast(
    values: Sequence[Sequence[float]],
    relevant: Sequence[Sequence[bool]],
    what: str,
    bound: float = 1.0,
) -> list[tuple[np.ndarray, np.ndarray]]:
    if len(values) != len(relevant) or not len(relevant):
        raise ValueError(
            f"{what}: expected the same positive number of queries of values and of labels, "
            f"got {len(values)} and {len(relevant)}"
        )
    return [
        _with_contrast(v, labels, f"{what}, query #{position}", bound)
        for position, (v, labels) in enumerate(zip(values, relevant))
    ]


def leave_one_out_attribution(consens_full: float, consens_without: Sequence[float]) -> np.ndarray:
    """Each document's attribution in a context C of several documents (§3.3, Experiment 3):
    a_d = ConSens(C) − ConSens(C \\ {d}), the drop of ConSens when d alone is left out, for the
    same answer against the same empty context (§2); within [−2, 2].

    Experiment 3 recomputes ConSens with each retrieved document excluded in turn and takes the
    document whose removal gives the lowest score as the most influential: a_d orders a query's
    documents the same way (largest a_d = lowest ConSens without d), is positive when d grounds
    the answer and ≤ 0 when the answer does not need it. ``consens_without`` holds
    ConSens(C \\ {d}) for every document d of C."""
    full = _values([consens_full], "consens_full")[0]
    return full - _values(consens_without, "consens_without")


def removal_lowest(consens_without: Sequence[float], relevant: Sequence[bool]) -> float:
    """Experiment 3's "removing the correct context resulted in the lowest ConSens score" for one
    query (§3.3; 89.43 % of the paper's retrieval hits): 1 when the lowest ConSens(C \\ {d})
    leaves out a relevant document, 0 when it leaves out another; documents tied for the lowest
    share the point (the relevant share of the tie). Equivalently: a relevant document has the
    largest attribution (:func:`leave_one_out_attribution`). The query needs a relevant
    document and another one."""
    values, labels = _with_contrast(consens_without, relevant, "removal_lowest")
    return float(labels[values == values.min()].mean())


def leave_one_out_auc(
    consens_without: Sequence[Sequence[float]], relevant: Sequence[Sequence[bool]]
) -> float:
    """Experiment 3's ROC AUC (§3.3, Fig. 3, Table 2: 0.88 with Llama 3.2 1B): how well ConSens
    tells the contexts that keep the relevant document from those that leave it out, over
    retrieval hits. Per query (ConSens(C \\ {d}) for each of its documents d, with their
    relevance), as Fig. 3 pairs them: the context keeping the relevant documents counts with the
    *minimum* ConSens over the other documents left out (x axis), each context leaving a relevant
    document out with its ConSens (y axis; one per query in the paper, which has one relevant
    document). The AUC is the share of (kept, left-out) pairs, over all queries, in which the
    kept context scores higher, ties counting half (:func:`~ragutil_dagster.metrics.stats.roc_auc`).
    Every query needs a relevant document and another one."""
    queries = _queries_with_contrast(consens_without, relevant, "leave_one_out_auc")
    kept = [values[~labels].min() for values, labels in queries]
    left_out = np.concatenate([values[labels] for values, labels in queries])
    return float(roc_auc(kept, left_out))


def attribution_auc(
    attributions: Sequence[Sequence[float]], relevant: Sequence[Sequence[bool]]
) -> float:
    """ROC AUC of the leave-one-out attribution a_d (:func:`leave_one_out_attribution`) at
    telling the relevant documents from the others, pooled over every document of the given
    queries: the share of (relevant, other) document pairs in which the relevant one has the
    larger attribution, ties half. ragutil's per-document reading of Experiment 3 (§3.3), which
    compares ConSens of whole contexts instead (:func:`leave_one_out_auc`); over the same
    queries, each needing a relevant document and another one."""
    queries = _queries_with_contrast(attributions, relevant, "attribution_auc", bound=2.0)
    scores = np.concatenate([values for values, _ in queries])
    labels = np.concatenate([labels for _, labels in queries])
    return float(roc_auc(scores[labels], scores[~labels]))
