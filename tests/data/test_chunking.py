"""Chunking: DPR-style word windows and MIRAGE-style sentence-packed token chunks."""

from __future__ import annotations

from itertools import pairwise

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragutil_dagster.data.chunking import (
    chunk_tokens,
    chunk_words,
    minilm_token_counter,
    split_sentences,
)
from ragutil_dagster.tables import PASSAGE_SCHEMA


def _corpus(*texts: str) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": [f"doc{i}" for i in range(len(texts))],
            "text": list(texts),
            "title": [f"T{i}" for i in range(len(texts))],
        }
    )


@pytest.fixture(scope="module")
def count_tokens():
    return minilm_token_counter()


@settings(max_examples=60, deadline=None)
@given(n_words=st.integers(1, 400), size=st.integers(1, 120), overlap_share=st.floats(0, 0.9))
def test_word_windows_cover_the_document_in_order(
    n_words: int, size: int, overlap_share: float
) -> None:
    overlap = min(int(size * overlap_share), size - 1)
    words = [f"w{i}" for i in range(n_words)]
    passages = chunk_words(_corpus(" ".join(words)), words=size, overlap=overlap)
    windows = [text.split() for text in passages["text"]]
    assert all(1 <= len(window) <= size for window in windows)
    rebuilt = list(windows[0])
    for previous, window in pairwise(windows):
        assert window[:overlap] == previous[len(previous) - overlap :]
        rebuilt.extend(window[overlap:])
    assert rebuilt == words
    assert passages["id"].to_list() == [f"doc0#{n}" for n in range(len(windows))]


def test_dpr_windows_ids_titles_and_schema() -> None:
    text = " ".join(f"w{i}" for i in range(250))
    passages = chunk_words(_corpus(text, "short doc"), words=100)
    assert passages.schema == pl.Schema(PASSAGE_SCHEMA)
    assert passages["id"].to_list() == ["doc0#0", "doc0#1", "doc0#2", "doc1#0"]
    assert passages["doc_id"].to_list() == ["doc0", "doc0", "doc0", "doc1"]
    assert passages["title"].to_list() == ["T0", "T0", "T0", "T1"]
    assert [len(t.split()) for t in passages["text"]] == [100, 100, 50, 2]
    with pytest.raises(ValueError, match="overlap < words"):
        chunk_words(_corpus(text), words=10, overlap=10)


def test_split_sentences() -> None:
    assert split_sentences('He left. "Why?" she asked!  Then (quietly.) it\nended') == [
        "He left.",
        '"Why?"',
        "she asked!",
        "Then (quietly.)",
        "it",
        "ended",
    ]


def test_token_chunks_keep_sentences_whole_and_fit_the_budget(count_tokens) -> None:
    sentences = [
        f"Sentence number {i} tells about the river {'and the hills ' * (i % 5)}today."
        for i in range(60)
    ]
    passages = chunk_tokens(_corpus(" ".join(sentences)), count_tokens, max_tokens=60)
    texts = passages["text"].to_list()
    assert len(texts) > 1
    assert max(count_tokens(texts)) <= 60
    # Every chunk is a run of whole sentences, and together they are the document in order.
    recovered = [sentence for text in texts for sentence in split_sentences(text)]
    assert recovered == sentences
    # Greedy packing: the next sentence would not have fitted.
    for text, following in pairwise(texts):
        next_sentence = split_sentences(following)[0]
        assert count_tokens([text])[0] + count_tokens([next_sentence])[0] > 60


def test_token_chunks_overlap_and_long_sentences(count_tokens) -> None:
    sentences = [f"Fact {i} is short." for i in range(12)]
    overlapping = chunk_tokens(
        _corpus(" ".join(sentences)), count_tokens, max_tokens=20, overlap_sentences=1
    )
    pieces = [split_sentences(text) for text in overlapping["text"]]
    for previous, current in pairwise(pieces):
        assert current[0] == previous[-1]
    long_sentence = " ".join(f"word{i}" for i in range(200)) + "."
    split = chunk_tokens(_corpus(long_sentence), count_tokens, max_tokens=50)
    assert max(count_tokens(split["text"].to_list())) <= 50
    assert " ".join(split["text"]) == long_sentence
    assert split["id"].to_list() == [f"doc0#{n}" for n in range(split.height)]
