"""Run files of a user's own retriever: each format read into the same run table, ranks derived
as trec_eval orders a run, and every bad input one error naming the file, the line and the id."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from ragutil_dagster.data.run_files import read_external_run, read_run_rows
from ragutil_dagster.errors import CorpusValidationError
from ragutil_dagster.tables import RUN_SCHEMA

QUERIES = pl.Series(["q1", "q2"])
PASSAGES = pl.Series(["d1", "d2", "d3"])
# (query, doc, rank, score) as a user's system wrote them: q1's ranks disagree with its scores,
# q2 has a tie that the file's ranks break.
ROWS = [
    ("q1", "d1", 1, 0.5),
    ("q1", "d3", 2, 2.0),
    ("q2", "d2", 2, 1.0),
    ("q2", "d3", 1, 1.0),
    ("q2", "d1", 3, 0.25),
]
EXPECTED = pl.DataFrame(
    {
        "query_id": ["q1", "q1", "q2", "q2", "q2"],
        "rank": [1, 2, 1, 2, 3],
        "doc_id": ["d3", "d1", "d3", "d2", "d1"],
        "score": [2.0, 0.5, 1.0, 1.0, 0.25],
        "retriever": ["mine"] * 5,
    },
    schema=RUN_SCHEMA,
)


def write_trec(path: Path, rows=ROWS) -> Path:
    path.write_text("".join(f"{q} Q0 {d} {r} {s} their-tag\n" for q, d, r, s in rows))
    return path


def write_jsonl(path: Path, rows=ROWS) -> Path:
    path.write_text(
        "".join(
            json.dumps({"query_id": q, "doc_id": d, "rank": r, "score": s}) + "\n"
            for q, d, r, s in rows
        )
    )
    return path


def write_parquet(path: Path, rows=ROWS) -> Path:
    pl.DataFrame(rows, schema=["query_id", "doc_id", "rank", "score"], orient="row").write_parquet(
        path
    )
    return path


def read(path: Path, **options) -> pl.DataFrame:
    return read_external_run(path, "mine", "world", QUERIES, PASSAGES, **options).run


@pytest.mark.parametrize(
    "name, write",
    [
        ("run.trec", write_trec),
        ("run.txt", write_trec),
        ("run.jsonl", write_jsonl),
        ("run.parquet", write_parquet),
    ],
)
def test_each_format_reads_into_the_same_run_table(tmp_path, name, write) -> None:
    """Ranked by score, highest first; the tie in q2 broken by the file's ranks (d3 ranked 1)."""
    assert read(write(tmp_path / name)).equals(EXPECTED)


def test_equal_scores_and_ranks_keep_the_order_of_the_lines(tmp_path) -> None:
    run = read(
        write_trec(
            tmp_path / "run", [("q1", "d2", 1, 1.0), ("q1", "d1", 1, 1.0), ("q2", "d3", 0, 3.0)]
        )
    )
    assert run["doc_id"].to_list() == ["d2", "d1", "d3"] and run["rank"].to_list() == [1, 2, 1]


def test_jsonl_line_numbers_are_physical_and_integer_ids_are_strings(tmp_path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text(
        '\n{"query_id": "q1", "doc_id": "d1", "rank": 1, "score": 1}\n{"query_id": "q2", "doc_id": 7, "rank": 1, "score": 1}\n'
    )
    with pytest.raises(CorpusValidationError) as caught:
        read(path)
    assert (
        str(caught.value)
        == f"{path}:3: field 'doc_id': '7' is not a passage of dataset 'world' (1 such rows)"
    )


BAD = [
    # (format, rows or raw text, line, field, what the message says)
    (
        "trec",
        [("q1", "d1", 1, 1.0), ("q9", "d2", 1, 1.0), ("q2", "d2", 1, 1.0)],
        2,
        "query_id",
        "'q9' is not a query of dataset 'world'",
    ),
    (
        "trec",
        [("q1", "d1", 1, 1.0), ("q2", "d7", 1, 1.0)],
        2,
        "doc_id",
        "'d7' is not a passage of dataset 'world'",
    ),
    (
        "trec",
        "q1 Q0 d1 1 1.0 tag\nq2 Q0 d2 1 1.0\n",
        2,
        None,
        "expected 6 fields 'qid Q0 docid rank score tag', got 5",
    ),
    (
        "trec",
        "q1 Q0 d1 1 1.0 tag\nq2 Q0 d2 first 1.0 tag\n",
        2,
        "rank",
        "expected an integer, got 'first'",
    ),
    (
        "trec",
        "q1 Q0 d1 1 1.0 tag\nq2 Q0 d2 1 high tag\n",
        2,
        "score",
        "expected a number, got 'high'",
    ),
    ("trec", "q1 Q0 d1 1 1.0 tag\nq2 Q0 d2 1 nan tag\n", 2, "score", "nan is not a finite number"),
    (
        "trec",
        [("q1", "d1", 1, 1.0), ("q2", "d2", 1, 1.0), ("q1", "d1", 2, 0.5)],
        3,
        "doc_id",
        "passage 'd1' is ranked twice for query 'q1'",
    ),
    (
        "jsonl",
        '{"query_id": "q1", "doc_id": "d1", "rank": 1, "score": 1}\n{"query_id": "q2", "doc_id": "d1", "rank": 1.5, "score": 1}\n',
        2,
        "rank",
        "expected an integer, got 1.5",
    ),
    (
        "jsonl",
        '{"query_id": "q1", "doc_id": "d1", "rank": 1, "score": 1}\n{"query_id": "q2", "doc_id": "d1", "rank": 1, "score": "1"}\n',
        2,
        "score",
        "expected a number, got '1'",
    ),
    (
        "jsonl",
        '{"query_id": "q1", "doc_id": "d1", "rank": 1, "score": 1}\n{"query_id": "q2", "doc_id": "d1", "score": 1}\n',
        2,
        "rank",
        "missing",
    ),
    (
        "parquet",
        [("q1", "d1", 1, 1.0), ("q2", "d9", 1, 1.0)],
        2,
        "doc_id",
        "'d9' is not a passage of dataset 'world'",
    ),
    (
        "parquet",
        pl.DataFrame(
            {
                "query_id": ["q1", "q2"],
                "doc_id": ["d1", "d2"],
                "rank": [1.0, 2.5],
                "score": [1.0, 1.0],
            }
        ),
        2,
        "rank",
        "expected an integer, got 2.5",
    ),
    (
        "parquet",
        pl.DataFrame(
            {
                "query_id": ["q1", "q2"],
                "doc_id": ["d1", "d2"],
                "rank": [1, 2],
                "score": ["1", "high"],
            }
        ),
        2,
        "score",
        "expected a number, got 'high'",
    ),
]


@pytest.mark.parametrize("form, content, line, field, says", BAD)
def test_a_bad_row_is_one_error_naming_file_line_and_id(
    tmp_path, form, content, line, field, says
) -> None:
    path = tmp_path / f"run.{form}"
    if isinstance(content, str):
        path.write_text(content)
    elif isinstance(content, pl.DataFrame):
        content.write_parquet(path)
    else:
        {"trec": write_trec, "jsonl": write_jsonl, "parquet": write_parquet}[form](path, content)
    with pytest.raises(CorpusValidationError) as caught:
        read(path)
    error = caught.value
    assert (error.path, error.line, error.field) == (str(path), line, field)
    assert says in str(error) and str(error).startswith(f"{path}:{line}:")


def test_a_query_without_rows_is_refused_naming_the_option(tmp_path) -> None:
    path = write_trec(tmp_path / "run.trec", [("q1", "d1", 1, 1.0)])
    for options in ({}, {"missing_queries": "refuse"}):
        with pytest.raises(CorpusValidationError) as caught:
            read(path, **options)
        assert str(caught.value) == (
            f"{path}: field 'query_id': 1 of the 2 queries of dataset 'world' have no row, e.g. 'q2'; rank at least "
            "one passage for every question, or set 'missing_queries: empty' on the retriever to score them as a "
            "retriever that returned nothing"
        )


def test_with_missing_queries_empty_queries_without_rows_are_kept_without_passages_and_listed(
    tmp_path,
) -> None:
    """The ranked queries read as they would with every query ranked; the others are listed in the
    dataset's order and have no row — unless no query has one, which stays an error."""
    queries = pl.Series(["q3", "q1", "q4", "q2"])
    path = write_trec(tmp_path / "run.trec")
    external = read_external_run(path, "mine", "world", queries, PASSAGES, missing_queries="empty")
    assert external.run.equals(EXPECTED)
    assert external.queries_without_rows == ["q3", "q4"] and external.rows_of_other_queries == 0
    assert (
        read_external_run(
            path, "mine", "world", QUERIES, PASSAGES, missing_queries="empty"
        ).queries_without_rows
        == []
    )
    with pytest.raises(
        CorpusValidationError,
        match=r"2 of the 2 queries of dataset 'world' have no row, e.g. 'q3', 'q4'; "
        "a run that ranks none of its questions has nothing to measure",
    ):
        read_external_run(
            path,
            "mine",
            "world",
            pl.Series(["q3", "q4"]),
            PASSAGES,
            queries_cut=True,
            missing_queries="empty",
        )


def test_with_max_queries_rows_of_other_questions_are_left_out_and_counted(tmp_path) -> None:
    path = write_trec(tmp_path / "run.trec", [*ROWS, ("q3", "d1", 1, 1.0), ("q3", "d2", 2, 0.5)])
    external = read_external_run(path, "mine", "world", QUERIES, PASSAGES, queries_cut=True)
    assert external.run.equals(EXPECTED) and external.rows_of_other_queries == 2
    with pytest.raises(
        CorpusValidationError, match=r"run.trec:6: field 'query_id': 'q3' is not a query"
    ):
        read(path)


def test_empty_and_missing_files_are_errors(tmp_path) -> None:
    with pytest.raises(CorpusValidationError, match=r"empty.trec: no rows"):
        read(write_trec(tmp_path / "empty.trec", []))
    with pytest.raises(CorpusValidationError, match=r"gone.jsonl: no such file"):
        read_run_rows(tmp_path / "gone.jsonl")
    pl.DataFrame({"query_id": ["q1"], "doc": ["d1"]}).write_parquet(tmp_path / "cols.parquet")
    with pytest.raises(
        CorpusValidationError, match=r"cols.parquet: lacks columns \['doc_id', 'rank', 'score'\]"
    ):
        read(tmp_path / "cols.parquet")
