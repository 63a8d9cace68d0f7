"""Corpus, query and qrels ingest: accepted layouts and the errors for bad records."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from ragutil_dagster.data.corpus import (
    corpus_fingerprint,
    indexed_texts,
    read_beir,
    read_corpus,
    read_dpr_tsv,
    read_jsonl_corpus,
    read_qrels,
    validate_corpus,
)
from ragutil_dagster.errors import CorpusValidationError
from ragutil_dagster.tables import CORPUS_SCHEMA


def _jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def test_jsonl_reads_ids_texts_titles(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "c.jsonl",
        [
            {"id": "a", "text": "Alpha text.", "title": "A"},
            {"id": 7, "text": "Seven.", "title": ""},
            {"id": "b", "text": "B"},
        ],
    )
    corpus = read_corpus(path)
    assert corpus.schema == pl.Schema(CORPUS_SCHEMA)
    assert corpus.to_dicts() == [
        {"id": "a", "text": "Alpha text.", "title": "A"},
        {"id": "7", "text": "Seven.", "title": None},
        {"id": "b", "text": "B", "title": None},
    ]
    assert indexed_texts(corpus) == ["A\nAlpha text.", "Seven.", "B"]
    assert indexed_texts(corpus, include_title=False) == ["Alpha text.", "Seven.", "B"]


@pytest.mark.parametrize(
    ("records", "line", "field", "fragment"),
    [
        (
            [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}],
            2,
            "id",
            "duplicate id 'a' (first seen on line 1)",
        ),
        ([{"id": "a", "text": "x"}, {"id": "b", "text": "   "}], 2, "text", "empty text"),
        ([{"id": "a", "text": 3}], 1, "text", "expected a string, got int"),
        ([{"id": 1.5, "text": "x"}], 1, "id", "expected a string or integer id, got float"),
        ([{"id": True, "text": "x"}], 1, "id", "got bool"),
        (
            [{"id": "a", "text": "x", "title": ["t"]}],
            1,
            "title",
            "expected a string or null, got list",
        ),
        ([{"id": "a", "text": "x"}, {"text": "y"}], 2, "id", "missing"),
        ([{"id": "a", "text": "x"}, ["not", "an", "object"]], 2, None, "expected a JSON object"),
    ],
)
def test_jsonl_errors_name_line_and_field(
    tmp_path: Path, records: list[object], line: int, field: str | None, fragment: str
) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", records)
    with pytest.raises(CorpusValidationError) as caught:
        read_jsonl_corpus(path)
    error = caught.value
    assert (error.path, error.line, error.field) == (str(path), line, field)
    assert fragment in str(error)
    assert f"{path}:{line}" in str(error)


def test_jsonl_bad_encoding_and_bad_json(tmp_path: Path) -> None:
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes(b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "caf\xe9"}\n')
    with pytest.raises(CorpusValidationError, match=r"latin1.jsonl:2: not valid UTF-8") as caught:
        read_jsonl_corpus(latin)
    assert caught.value.line == 2
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "a", "text": "ok"}\n\n{"id": "b", "text": \n', encoding="utf-8")
    with pytest.raises(CorpusValidationError, match="invalid JSON") as caught:
        read_jsonl_corpus(broken)
    assert caught.value.line == 3


def test_parquet_reader_validates_rows(tmp_path: Path) -> None:
    good = tmp_path / "good.parquet"
    pl.DataFrame({"id": [10, 11], "text": ["x", "y"], "extra": [1, 2]}).write_parquet(good)
    assert read_corpus(good).to_dicts() == [
        {"id": "10", "text": "x", "title": None},
        {"id": "11", "text": "y", "title": None},
    ]
    cases = [
        (
            pl.DataFrame({"id": ["a", "b", "a"], "text": ["x", "y", "z"]}),
            3,
            "id",
            "first seen on row 1",
        ),
        (pl.DataFrame({"id": ["a", "b"], "text": ["x", None]}), 2, "text", "empty text"),
        (pl.DataFrame({"id": ["a", "b"], "text": [1, 2]}), None, "text", "expected strings"),
        (pl.DataFrame({"id": ["a"], "body": ["x"]}), None, "text", "missing column"),
    ]
    for frame, row, field, fragment in cases:
        path = tmp_path / "bad.parquet"
        frame.write_parquet(path)
        with pytest.raises(CorpusValidationError) as caught:
            read_corpus(path)
        assert (caught.value.line, caught.value.field) == (row, field)
        assert fragment in str(caught.value)


def test_dpr_tsv_layout_with_quoted_text(tmp_path: Path) -> None:
    path = tmp_path / "psgs_w100.tsv"
    path.write_text(
        'id\ttext\ttitle\n1\t"Aaron ( or ; ""Ahärôn"") was a prophet"\tAaron\n2\tplain text\tSecond\n',
        encoding="utf-8",
    )
    corpus = read_dpr_tsv(path)
    assert corpus.to_dicts() == [
        {"id": "1", "text": 'Aaron ( or ; "Ahärôn") was a prophet', "title": "Aaron"},
        {"id": "2", "text": "plain text", "title": "Second"},
    ]
    path.write_text('id\ttext\ttitle\n1\t"two\nlines"\tT\n2\tok\t\n3\tthree\n', encoding="utf-8")
    with pytest.raises(CorpusValidationError, match="expected 3 tab-separated fields") as caught:
        read_corpus(path)
    assert caught.value.line == 5  # the quoted text spans lines 2-3; numbering stays physical
    path.write_text('id\ttext\ttitle\n1\t"two\nlines"\tT\n', encoding="utf-8")
    assert read_corpus(path)["text"].to_list() == ["two\nlines"]
    path.write_text("id\ttext\ttitle\n1\tone\tT\n1\ttwo\tT\n", encoding="utf-8")
    with pytest.raises(CorpusValidationError, match="duplicate id '1'") as caught:
        read_corpus(path)
    assert caught.value.line == 3


def test_beir_folder(tmp_path: Path) -> None:
    _jsonl(
        tmp_path / "corpus.jsonl",
        [
            {"_id": "d1", "title": "One", "text": "first doc", "metadata": {}},
            {"_id": "d2", "title": "", "text": "second doc"},
        ],
    )
    _jsonl(
        tmp_path / "queries.jsonl",
        [{"_id": "q1", "text": "first?"}, {"_id": "q2", "text": "unjudged?"}],
    )
    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\n", encoding="utf-8"
    )
    beir = read_beir(tmp_path)
    assert beir.corpus["id"].to_list() == ["d1", "d2"]
    assert beir.corpus["title"].to_list() == ["One", None]
    assert beir.queries.to_dicts() == [{"id": "q1", "text": "first?"}]
    assert beir.qrels.to_dicts() == [
        {"query_id": "q1", "doc_id": "d1", "relevance": 1},
        {"query_id": "q1", "doc_id": "d2", "relevance": 0},
    ]
    (tmp_path / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td9\t1\n", encoding="utf-8"
    )
    with pytest.raises(CorpusValidationError, match="absent from corpus.jsonl, e.g. 'd9'"):
        read_beir(tmp_path)
    with pytest.raises(CorpusValidationError, match="missing from the BEIR folder"):
        read_beir(tmp_path, split="dev")


def test_trec_qrels_and_bad_score(tmp_path: Path) -> None:
    path = tmp_path / "qrels.txt"
    path.write_text("q1 0 d1 2\nq2 0 d3 1\n", encoding="utf-8")
    assert read_qrels(path)["relevance"].to_list() == [2, 1]
    path.write_text("q1\td1\t1\nq2\td3\thigh\n", encoding="utf-8")
    with pytest.raises(CorpusValidationError, match="expected an integer") as caught:
        read_qrels(path)
    assert (caught.value.line, caught.value.field) == (2, "score")


def test_fingerprint_tracks_ids_titles_texts_and_order() -> None:
    base = validate_corpus(
        pl.DataFrame({"id": ["a", "b"], "text": ["x", "y"], "title": ["T", None]})
    )
    variants = [
        base.with_columns(pl.Series("text", ["x", "y!"])),
        base.with_columns(pl.Series("id", ["a", "c"])),
        base.with_columns(pl.Series("title", ["T", "U"])),
        base.reverse(),
    ]
    fingerprint = corpus_fingerprint(base)
    assert fingerprint == corpus_fingerprint(base.clone())
    assert len({fingerprint, *map(corpus_fingerprint, variants)}) == 5
