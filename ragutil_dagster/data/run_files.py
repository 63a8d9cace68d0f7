"""Run files: a retriever's ranking written by someone else's system, read into a run table and
checked against the dataset it ranks (docs/datasets.md, "Your own retriever: run files").

The format follows the extension: ``.jsonl`` — one object per line with ``query_id``, ``doc_id``,
``rank`` and ``score``; ``.parquet`` — those four columns; anything else — a TREC run file,
``qid Q0 docid rank score tag`` per line, whitespace-separated. Every error names the file, the
1-based line (for Parquet the 1-based row) and the field or id at fault.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ragutil_dagster.config import MissingQueries
from ragutil_dagster.data.corpus import decoded_lines, jsonl_records, read_parquet_table, record_id
from ragutil_dagster.errors import CorpusValidationError
from ragutil_dagster.tables import RUN_SCHEMA

RUN_FILE_COLUMNS = ("query_id", "doc_id", "rank", "score")
NAMED_MISSING_QUERIES = 5
"""How many questions without a row an error, the step's metadata and its log name."""
# A run file's rows as read: the four columns and the line (Parquet: row) each came from.
_ROWS_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String(),
    "doc_id": pl.String(),
    "rank": pl.Int64(),
    "score": pl.Float64(),
    "line": pl.Int64(),
}


def read_trec_rows(path: Path) -> pl.DataFrame:
    """The rows of a TREC run file, with their ``tag`` and ``line``; blank lines are skipped."""

    def rows() -> Iterator[tuple[str, str, int, float, int, str]]:
        for number, line in decoded_lines(path):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 6:
                raise CorpusValidationError(
                    path,
                    number,
                    None,
                    f"expected 6 fields 'qid Q0 docid rank score tag', got {len(fields)}",
                )
            try:
                rank = int(fields[3])
            except ValueError:
                raise CorpusValidationError(
                    path, number, "rank", f"expected an integer, got {fields[3]!r}"
                ) from None
            try:
                score = float(fields[4])
            except ValueError:
                raise CorpusValidationError(
                    path, number, "score", f"expected a number, got {fields[4]!r}"
                ) from None
            yield fields[0], fields[2], rank, score, number, fields[5]

    return pl.DataFrame(list(rows()), schema={**_ROWS_SCHEMA, "tag": pl.String()}, orient="row")


def _jsonl_rows(path: Path) -> pl.DataFrame:
    rows = []
    for number, record in jsonl_records(path):
        for field in RUN_FILE_COLUMNS:
            if field not in record:
                raise CorpusValidationError(path, number, field, "missing")
        rank, score = record["rank"], record["score"]
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise CorpusValidationError(path, number, "rank", f"expected an integer, got {rank!r}")
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise CorpusValidationError(path, number, "score", f"expected a number, got {score!r}")
        rows.append(
            (
                record_id(record["query_id"], path, number, "query_id"),
                record_id(record["doc_id"], path, number, "doc_id"),
                rank,
                float(score),
                number,
            )
        )
    return pl.DataFrame(rows, schema=_ROWS_SCHEMA, orient="row")


def _parquet_rows(path: Path) -> pl.DataFrame:
    frame = read_parquet_table(path)
    if missing := [column for column in RUN_FILE_COLUMNS if column not in frame.columns]:
        raise CorpusValidationError(
            path, None, None, f"lacks columns {missing}; a run file has {list(RUN_FILE_COLUMNS)}"
        )
    frame = frame.select(RUN_FILE_COLUMNS).with_row_index("line", offset=1)
    typed = frame.select(
        pl.col("query_id", "doc_id").cast(pl.String, strict=False),
        pl.col("rank").cast(pl.Float64, strict=False).alias("rank_value"),
        pl.col("score").cast(pl.Float64, strict=False),
        pl.col("line").cast(pl.Int64),
    )
    for field, bad, expected in (
        ("query_id", pl.col("query_id").str.strip_chars().fill_null("") == "", "a non-empty id"),
        ("doc_id", pl.col("doc_id").str.strip_chars().fill_null("") == "", "a non-empty id"),
        (
            "rank",
            (pl.col("rank_value") != pl.col("rank_value").floor()).fill_null(True),
            "an integer",
        ),
        ("score", pl.col("score").is_null(), "a number"),
    ):
        if (rows := typed.filter(bad)).height:
            value = frame.filter(pl.col("line") == rows["line"][0])[field][0]
            raise CorpusValidationError(
                path, int(rows["line"][0]), field, f"expected {expected}, got {value!r}"
            )
    return typed.select(
        "query_id", "doc_id", pl.col("rank_value").cast(pl.Int64).alias("rank"), "score", "line"
    )


def read_run_rows(path: str | Path) -> pl.DataFrame:
    """A run file's rows as written (``query_id, doc_id, rank, score, line``), in the format its
    extension names (module docstring); malformed lines and values are errors."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _jsonl_rows(path)
    if suffix == ".parquet":
        return _parquet_rows(path)
    return read_trec_rows(path).drop("tag")


@dataclass(frozen=True)
class ExternalRun:
    run: pl.DataFrame
    """The run table (``RUN_SCHEMA``), ranks 1..n per query."""
    rows_of_other_queries: int
    """Rows left out for naming a query the dataset's ``max_queries`` cut."""
    queries_without_rows: list[str]
    """The queries of the dataset without any row (``missing_queries: empty``), in dataset order."""


def read_external_run(
    path: str | Path,
    retriever: str,
    dataset: str,
    query_ids: pl.Series,
    doc_ids: pl.Series,
    queries_cut: bool = False,
    missing_queries: MissingQueries = "refuse",
) -> ExternalRun:
    """Read run file ``path`` as the ranking of ``retriever`` over ``dataset``'s queries
    ``query_ids`` and passages ``doc_ids``.

    A row naming a passage outside ``doc_ids`` or a query outside ``query_ids`` is an error (with
    ``queries_cut`` — the dataset keeps its first ``max_queries`` questions — rows of other
    queries are left out and counted instead: they may be the questions it cut), as is a passage
    ranked twice for one query or a score that is not finite. A query without any row is an
    error with ``missing_queries: refuse``; with ``empty`` it is kept without passages — a
    retriever that returned nothing — and listed (docs/datasets.md), unless no query has a row.

    Ranks are derived again per query, as trec_eval orders a run: by score, highest first; equal
    scores by the file's rank, then by the order of the lines."""
    path = Path(path)
    rows = read_run_rows(path)
    if not rows.height:
        raise CorpusValidationError(path, None, None, "no rows")
    if (infinite := rows.filter(~pl.col("score").is_finite())).height:
        raise CorpusValidationError(
            path,
            int(infinite["line"][0]),
            "score",
            f"{infinite['score'][0]} is not a finite number",
        )
    other = rows.filter(~pl.col("query_id").is_in(query_ids.implode()))
    if other.height and not queries_cut:
        _unknown_ids(path, other, "query_id", f"a query of dataset {dataset!r}")
    rows = rows.filter(pl.col("query_id").is_in(query_ids.implode()))
    _unknown_ids(
        path,
        rows.filter(~pl.col("doc_id").is_in(doc_ids.implode())),
        "doc_id",
        f"a passage of dataset {dataset!r}",
    )
    repeated = rows.filter(pl.col("line") != pl.col("line").min().over("query_id", "doc_id"))
    if repeated.height:
        query, doc = repeated["query_id"][0], repeated["doc_id"][0]
        raise CorpusValidationError(
            path,
            int(repeated["line"][0]),
            "doc_id",
            f"passage {doc!r} is ranked twice for query {query!r}",
        )
    missing = query_ids.filter(~query_ids.is_in(rows["query_id"].implode())).to_list()
    if missing and (missing_queries == "refuse" or len(missing) == query_ids.len()):
        named = ", ".join(repr(q) for q in missing[:NAMED_MISSING_QUERIES])
        remedy = (
            "rank at least one passage for every question, or set 'missing_queries: empty' on the retriever to "
            "score them as a retriever that returned nothing"
            if missing_queries == "refuse"
            else "a run that ranks none of its questions has nothing to measure"
        )
        raise CorpusValidationError(
            path,
            None,
            "query_id",
            f"{len(missing)} of the {query_ids.len()} queries of dataset {dataset!r} have no row, e.g. {named}; {remedy}",
        )
    run = rows.sort(
        ["query_id", "score", "rank", "line"], descending=[False, True, False, False]
    ).select(
        "query_id",
        pl.int_range(1, pl.len() + 1, dtype=pl.Int32).over("query_id").alias("rank"),
        "doc_id",
        "score",
        pl.lit(retriever, dtype=pl.String).alias("retriever"),
    )
    return ExternalRun(run.cast(RUN_SCHEMA), other.height, missing)  # type: ignore[arg-type]


def _unknown_ids(path: Path, unknown: pl.DataFrame, field: str, what: str) -> None:
    if unknown.height:
        raise CorpusValidationError(
            path,
            int(unknown["line"][0]),
            field,
            f"{unknown[field][0]!r} is not {what} ({unknown.height} such rows)",
        )
