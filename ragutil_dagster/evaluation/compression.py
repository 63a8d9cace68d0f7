"""Context compression between the retrieval run and generation (SePer §5.4, RQ3; App. D.1).

A compressor shortens the context of a setting's ``rag`` prompt — its top-k passages together —
to at most ``budget`` *context tokens*, and the generations step samples the ``rag`` condition
with the compressed context (docs/pipeline.md, "Context compression"). SePer's RQ3 asks how much
utility (ΔSePer) a compressed prompt keeps; ragutil reports it per context token
(``metrics.seper.delta_seper_per_context_tokens``).

Context tokens are the tokens the context adds to the rag prompt: the prompt's tokens with the
passages minus its tokens without any (:class:`ContextTokens`), counted by the generator's own
tokenizer as it encodes prompts (``Generator.count_prompt_tokens``), so a chat template or the
``Doc i:`` markers are counted as the generator pays for them; :func:`whitespace_token_count`
(whitespace-separated words) where no tokenizer is available.

* ``truncate`` — the context's first ``budget`` tokens: passages in rank order, the last one cut
  at a word boundary (:func:`truncate`);
* ``extractive`` — the context's sentences (:func:`split_sentences`) most similar to the question
  (cosine of the embedder's unit vectors), added best first while the context stays within the
  budget, shown in their original order within their passages; the best one truncated when no
  whole sentence fits (:func:`extract`);
* ``abstractive`` — the generator's greedy summary under the prompt of role ``compression``
  (default: the built-in ``compress_abstractive``), at most ``budget`` new tokens, then truncated to the budget
  (:func:`summary_prompt`).

A compressed passage keeps its document id where its text survives (truncate, extractive); an
abstractive summary draws on every passage of the context. Every function here is deterministic.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus

import numpy as np
import polars as pl

from ragutil_dagster import prompts as templates
from ragutil_dagster.config import CompressorConfig
from ragutil_dagster.errors import ServerResponseError
from ragutil_dagster.prompts import Template
from ragutil_dagster.sampling import SamplingParams
from ragutil_dagster.tables import CONTEXT_SCHEMA

TokenCount = Callable[[Sequence[str]], list[int]]
"""Tokens of each prompt (``Generator.count_prompt_tokens``, or :func:`whitespace_token_count`)."""

Passage = tuple[str, str]
"""(doc_id, text) of one passage of a context, in rank order."""

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def whitespace_token_count(texts: Sequence[str]) -> list[int]:
    """The fallback token count: whitespace-separated words (every BPE, WordPiece or SentencePiece
    tokenizer splits at whitespace first, so this is a lower bound on their counts)."""
    return [len(text.split()) for text in texts]


NO_TOKENIZE_ENDPOINT = frozenset(
    {HTTPStatus.NOT_FOUND, HTTPStatus.METHOD_NOT_ALLOWED, HTTPStatus.NOT_IMPLEMENTED}
)
"""The HTTP statuses by which a server refuses ``POST /tokenize`` for having no such endpoint
(vLLM serves one; servers without it answer 404 for an unknown path, 405 where the path takes
no POST, 501 where the server implements no POST)."""


def context_token_count(generator: object) -> tuple[TokenCount, str]:
    """How context tokens are counted, and the unit's name: the generator's own tokenizer
    (``count_prompt_tokens``), or :func:`whitespace_token_count` for a generator served without a
    local tokenizer by a server that has no ``/tokenize`` (:data:`NO_TOKENIZE_ENDPOINT`). Any
    other failure to count — a refused key, a server down, an answer without a count — is raised."""
    try:
        generator.count_prompt_tokens(["Question:"])
    except ServerResponseError as err:
        if err.status not in NO_TOKENIZE_ENDPOINT:
            raise
        return whitespace_token_count, "whitespace words"
    return generator.count_prompt_tokens, "generator tokens"


def ranked_contexts(
    queries: pl.DataFrame, passages: pl.DataFrame, run: pl.DataFrame
) -> tuple[dict[str, str], dict[str, list[Passage]]]:
    """Each query's question, and its context: the passages of ``run`` (query_id, doc_id, rank)
    in rank order, with their text from ``passages`` (id, text)."""
    questions = dict(queries.select("query_id", "question").iter_rows())
    texts = dict(passages.select("id", "text").iter_rows())
    ranked = run.sort("query_id", "rank").group_by("query_id", maintain_order=True).agg("doc_id")
    return questions, {
        qid: [(doc, texts[doc]) for doc in docs]
        for qid, docs in ranked.iter_rows()
        if qid in questions
    }


def split_sentences(text: str) -> list[str]:
    """``text``'s sentences: split after ``.``, ``!`` or ``?`` followed by whitespace; a text
    without such an end is one sentence. Blank text has none."""
    return [sentence for sentence in _SENTENCE_END.split(text.strip()) if sentence]


@dataclass
class ContextTokens:
    """Context tokens of ``question``'s rag prompt (``template``) over a context: the prompt's
    tokens with the context minus its tokens with none, by ``count``; 0 for an empty context."""

    question: str
    template: Template | str
    count: TokenCount
    _empty: int | None = field(default=None, repr=False)

    def prompt(self, context: Sequence[Passage]) -> str:
        return templates.with_context(
            self.question, [("", text) for _, text in context], self.template
        )

    def __call__(self, context: Sequence[Passage]) -> int:
        if not context:
            return 0
        if self._empty is None:
            self._empty = self.count([self.prompt([])])[0]
        return max(self.count([self.prompt(context)])[0] - self._empty, 0)


def truncate(
    context: Sequence[Passage], budget: int, tokens: Callable[[Sequence[Passage]], int]
) -> list[Passage]:
    """The longest prefix of whole words of ``context`` (passages in order, the last one cut)
    within ``budget`` ``tokens``; the context itself when it fits."""
    context = list(context)
    if tokens(context) <= budget:
        return context
    words = [
        (index, match.end())
        for index, (_, text) in enumerate(context)
        for match in re.finditer(r"\S+", text)
    ]

    def prefix(n: int) -> list[Passage]:
        if n == 0:
            return []
        index, end = words[n - 1]
        kept = context[: index + 1]
        kept[-1] = (kept[-1][0], kept[-1][1][:end])
        return kept

    # The most words within the budget: galloping up, then bisecting (token counts grow with words).
    fitting, failing = 0, 1
    while failing <= len(words) and tokens(prefix(failing)) <= budget:
        fitting, failing = failing, 2 * failing
    failing = min(failing, len(words) + 1)
    while failing - fitting > 1:
        middle = (fitting + failing) // 2
        fitting, failing = (
            (middle, failing) if tokens(prefix(middle)) <= budget else (fitting, middle)
        )
    return prefix(fitting)


def context_sentences(context: Sequence[Passage]) -> list[tuple[int, str]]:
    """Every sentence of ``context`` as (passage index, sentence), in context order."""
    return [
        (index, sentence)
        for index, (_, text) in enumerate(context)
        for sentence in split_sentences(text)
    ]


def extract(
    context: Sequence[Passage],
    similarity: Sequence[float],
    budget: int,
    tokens: Callable[[Sequence[Passage]], int],
) -> list[Passage]:
    """The sentences of ``context`` (:func:`context_sentences`, scored by ``similarity`` in that
    order) most similar first — ties in context order — each kept when the context with it stays
    within ``budget`` ``tokens``; the kept sentences in their context order, joined by a space
    within their passage, passages left without any dropped; when no whole sentence fits, the most
    similar one truncated to the budget (:func:`truncate`). The context itself when it fits."""
    context = list(context)
    if tokens(context) <= budget:
        return context
    sentences = context_sentences(context)
    if len(similarity) != len(sentences):
        raise ValueError(f"{len(similarity)} similarities for {len(sentences)} sentences")

    def shown(chosen: set[int]) -> list[Passage]:
        texts: dict[int, list[str]] = {}
        for position in sorted(chosen):
            index, sentence = sentences[position]
            texts.setdefault(index, []).append(sentence)
        return [(context[index][0], " ".join(parts)) for index, parts in texts.items()]

    chosen: set[int] = set()
    ranked = sorted(range(len(sentences)), key=lambda p: (-similarity[p], p))
    for position in ranked:
        if tokens(shown(chosen | {position})) <= budget:
            chosen.add(position)
    if not chosen and ranked:  # no whole sentence fits: the most similar one, truncated
        return truncate(shown({ranked[0]}), budget, tokens)
    return shown(chosen)


def summary_prompt(
    question: str, context: Sequence[Passage], template: Template | str = "compress_abstractive"
) -> str:
    """The abstractive compressor's prompt (role ``compression``, by default the built-in
    ``compress_abstractive``) over ``context``."""
    return templates.render(
        template,
        question=question,
        reference=templates.format_reference([("", text) for _, text in context]),
    )


def summary_params(budget: int, seed: int) -> SamplingParams:
    """Greedy decoding of at most ``budget`` new tokens, no stop string (a summary has lines)."""
    return SamplingParams(n=1, temperature=0.0, max_new_tokens=budget, stop=(), seed=seed)


def compress_contexts(
    questions: dict[str, str],
    contexts: dict[str, list[Passage]],
    compressor: CompressorConfig | None,
    count: TokenCount,
    template: Template | str,
    embed: Callable[[Sequence[str]], np.ndarray] | None = None,
    generate: Callable[[Sequence[str], SamplingParams], list] | None = None,
    seed: int = 0,
    summary_template: Template | str = "compress_abstractive",
) -> pl.DataFrame:
    """Per query (``contexts``: its passages in rank order), the context its rag prompt
    (``template``) shows — compressed by ``compressor``, or as it is when None — with its context
    tokens before and after (``CONTEXT_SCHEMA``). ``embed`` (unit vectors of texts) serves
    ``extractive``, ``generate`` (``Generator.sample``) serves ``abstractive``, prompted with
    ``summary_template``."""
    order = list(contexts)
    counters = {qid: ContextTokens(questions[qid], template, count) for qid in order}
    shown: dict[str, list[Passage]] = {}
    sources: dict[str, list[str]] = {qid: [doc for doc, _ in contexts[qid]] for qid in order}
    if compressor is None:
        shown = {qid: list(contexts[qid]) for qid in order}
    elif compressor.method == "truncate":
        shown = {qid: truncate(contexts[qid], compressor.budget, counters[qid]) for qid in order}
    elif compressor.method == "extractive":
        if embed is None:
            raise ValueError("an extractive compressor needs an embedder")
        sentences = {qid: [s for _, s in context_sentences(contexts[qid])] for qid in order}
        vectors = embed(
            [questions[qid] for qid in order] + [s for qid in order for s in sentences[qid]]
        )
        start = len(order)
        for position, qid in enumerate(order):
            end = start + len(sentences[qid])
            similarity = (vectors[start:end] @ vectors[position]).tolist()
            shown[qid] = extract(contexts[qid], similarity, compressor.budget, counters[qid])
            start = end
    else:
        if generate is None:
            raise ValueError("an abstractive compressor needs a generator")
        prompts = [summary_prompt(questions[qid], contexts[qid], summary_template) for qid in order]
        summaries = generate(prompts, summary_params(compressor.budget, seed))
        for qid, (sample, *_) in zip(order, summaries, strict=True):
            text = sample.text.strip()
            shown[qid] = truncate([("", text)], compressor.budget, counters[qid]) if text else []
    if compressor is not None and compressor.method != "abstractive":
        sources = {qid: [doc for doc, _ in shown[qid]] for qid in order}
    before = {qid: counters[qid](contexts[qid]) for qid in order}
    return pl.DataFrame(
        {
            "query_id": order,
            "doc_ids": [sources[qid] for qid in order],
            "passages": [[text for _, text in shown[qid]] for qid in order],
            "context_tokens_before": [before[qid] for qid in order],
            "context_tokens_after": [
                before[qid] if shown[qid] == contexts[qid] else counters[qid](shown[qid])
                for qid in order
            ],
        },
        schema=CONTEXT_SCHEMA,
    )
