"""Corpus, query and qrels ingest with validation.

Table schemas (polars; every id is a string):

- corpus / passages: ``id`` (String, unique, non-empty), ``text`` (String, non-empty after
  stripping whitespace), ``title`` (String, nullable; an empty title is stored as null),
  and for passages cut from longer documents ``doc_id`` (String, the source document's id;
  see :mod:`ragutil_dagster.data.chunking`).
- queries: ``id`` (String, unique), ``text`` (String, non-empty).
- qrels: ``query_id`` (String), ``doc_id`` (String), ``relevance`` (Int64).

Accepted inputs: JSONL and Parquet with ``id``, ``text`` and optional ``title``; the DPR
``psgs_w100.tsv`` layout (tab-separated ``id, text, title`` with a header row); BEIR folders
(``corpus.jsonl`` with ``_id``, ``title``, ``text``; ``queries.jsonl``; ``qrels/<split>.tsv``).
Every problem is reported as a :class:`CorpusValidationError` naming the file, the 1-based line
(the row, for Parquet) and the field.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from ragutil_dagster.errors import CorpusValidationError
from ragutil_dagster.tables import BEIR_QUERY_SCHEMA, CORPUS_SCHEMA, PASSAGE_SCHEMA, QRELS_SCHEMA

# DPR's passage file stores one passage per line, but a text field may legally be long.
csv.field_size_limit(1 << 30)


def open_error(path: Path, exc: OSError) -> CorpusValidationError:
    """A file that cannot be opened, as one error naming it (not an ``[Errno N]`` traceback)."""
    reason = {
        FileNotFoundError: "no such file",
        IsADirectoryError: "is a directory, not a file",
        PermissionError: "permission denied",
    }.get(type(exc), exc.strerror or str(exc))
    return CorpusValidationError(path, None, None, reason)


def decoded_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield ``(1-based line number, text without line ending)``, decoding UTF-8 strictly.

    A byte-order mark at the start of the file (Windows editors write one) is dropped."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise open_error(path, exc) from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CorpusValidationError(
                    path, number, None, f"not valid UTF-8 (byte {exc.start} of the line)"
                ) from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            yield number, line.rstrip("\r\n")


class _RecordCollector:
    """Validates records one at a time and gathers them into columns."""

    def __init__(self, path: Path, with_title: bool) -> None:
        self.path = path
        self.with_title = with_title
        self.first_line: dict[str, int] = {}
        self.ids: list[str] = []
        self.texts: list[str] = []
        self.titles: list[str | None] = []

    def add(
        self, line: int, doc_id: Any, text: Any, title: Any, fields: tuple[str, str, str]
    ) -> None:
        id_field, text_field, title_field = fields
        key = record_id(doc_id, self.path, line, id_field)
        if key in self.first_line:
            raise CorpusValidationError(
                self.path,
                line,
                id_field,
                f"duplicate id {key!r} (first seen on line {self.first_line[key]})",
            )
        if not isinstance(text, str):
            raise CorpusValidationError(
                self.path, line, text_field, f"expected a string, got {_type_name(text)}"
            )
        if not text.strip():
            raise CorpusValidationError(self.path, line, text_field, "empty text")
        if self.with_title:
            if title is not None and not isinstance(title, str):
                raise CorpusValidationError(
                    self.path,
                    line,
                    title_field,
                    f"expected a string or null, got {_type_name(title)}",
                )
            self.titles.append(title or None)
        self.first_line[key] = line
        self.ids.append(key)
        self.texts.append(text)

    def frame(self) -> pl.DataFrame:
        if not self.ids:
            raise CorpusValidationError(self.path, None, None, "no records")
        columns: dict[str, list[Any]] = {"id": self.ids, "text": self.texts}
        schema = BEIR_QUERY_SCHEMA
        if self.with_title:
            columns["title"] = self.titles
            schema = CORPUS_SCHEMA
        return pl.DataFrame(columns, schema=schema)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def record_id(value: Any, path: Path, line: int, field: str) -> str:
    """Ids may be strings or integers (BEIR and DPR files use both); they are stored as strings."""
    if value is None:
        raise CorpusValidationError(path, line, field, "missing")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise CorpusValidationError(
            path, line, field, f"expected a string or integer id, got {_type_name(value)}"
        )
    key = str(value)
    if not key.strip():
        raise CorpusValidationError(path, line, field, "empty id")
    return key


class _NonFinite:
    """Stands in for a ``NaN`` / ``Infinity`` literal while parsing, so the field can be named."""

    def __init__(self, literal: str) -> None:
        self.literal = literal


def _non_finite_field(value: Any, where: str) -> tuple[str, str] | None:
    """``(field path, literal)`` of the first non-finite literal inside a parsed value."""
    if isinstance(value, _NonFinite):
        return where, value.literal
    if isinstance(value, dict):
        items = [(f"{where}.{key}" if where else key, item) for key, item in value.items()]
    elif isinstance(value, list):
        items = [(f"{where}[{index}]", item) for index, item in enumerate(value)]
    else:
        return None
    for path, item in items:
        if found := _non_finite_field(item, path):
            return found
    return None


def jsonl_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(1-based line number, object)`` for every non-blank line of a JSONL file.

    Blank lines are skipped (line numbers stay physical). Bad UTF-8, malformed JSON, trailing
    text after the object, non-object lines and ``NaN`` / ``Infinity`` (which Python's json
    accepts but JSON does not) raise :class:`CorpusValidationError`."""
    for number, line in decoded_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line, parse_constant=_NonFinite)
        except json.JSONDecodeError as exc:
            raise CorpusValidationError(
                path, number, None, f"invalid JSON: {exc.msg} (column {exc.colno})"
            ) from None
        if not isinstance(record, dict):
            raise CorpusValidationError(
                path, number, None, f"expected a JSON object, got {_type_name(record)}"
            )
        # Only a line spelling NaN or Infinity can hold a non-finite literal; others skip the walk.
        if ("NaN" in line or "Infinity" in line) and (found := _non_finite_field(record, "")):
            field, literal = found
            raise CorpusValidationError(
                path, number, field, f"{literal} is not a JSON number (write null or a number)"
            )
        yield number, record


def _read_jsonl(
    path: Path, id_field: str, text_field: str, title_field: str | None
) -> pl.DataFrame:
    collector = _RecordCollector(path, with_title=title_field is not None)
    fields = (id_field, text_field, title_field or "")
    for number, record in jsonl_records(path):
        for required in (id_field, text_field):
            if required not in record:
                raise CorpusValidationError(path, number, required, "missing")
        title = record.get(title_field) if title_field is not None else None
        collector.add(number, record[id_field], record[text_field], title, fields)
    return collector.frame()


def read_jsonl_corpus(
    path: str | Path, *, id_field: str = "id", text_field: str = "text", title_field: str = "title"
) -> pl.DataFrame:
    """Read a JSONL corpus (one object per line with an id, a text and an optional title)."""
    return _read_jsonl(Path(path), id_field, text_field, title_field)


def read_jsonl_queries(
    path: str | Path, *, id_field: str = "id", text_field: str = "text"
) -> pl.DataFrame:
    """Read JSONL queries (one object per line with an id and a text) into the query schema."""
    return _read_jsonl(Path(path), id_field, text_field, None)


def read_dpr_tsv(path: str | Path) -> pl.DataFrame:
    """Read DPR's ``psgs_w100.tsv`` layout: a header row, then ``id<TAB>text<TAB>title`` rows."""
    path = Path(path)
    last_line = 0

    def texts() -> Iterator[str]:
        nonlocal last_line
        for number, line in decoded_lines(path):
            last_line = number
            yield line + "\n"  # csv needs the line break to keep it inside a quoted field

    reader = csv.reader(texts(), delimiter="\t", quotechar='"')
    header = next(reader, None)
    if header is None:
        raise CorpusValidationError(path, None, None, "empty file")
    if [name.strip().lower() for name in header] != ["id", "text", "title"]:
        raise CorpusValidationError(
            path, 1, None, f"expected the header 'id, text, title', got {header}"
        )
    collector = _RecordCollector(path, with_title=True)
    while True:
        # A quoted text may span physical lines; errors name the line the record starts on.
        start = last_line + 1
        row = next(reader, None)
        if row is None:
            break
        if not row:
            continue
        if len(row) != 3:
            # A quote opened and never closed swallows the following lines into one field.
            spans = (
                f" (the record runs on to line {last_line}: an unclosed quote?)"
                if last_line > start
                else ""
            )
            raise CorpusValidationError(
                path, start, None, f"expected 3 tab-separated fields, got {len(row)}{spans}"
            )
        collector.add(start, row[0], row[1], row[2], ("id", "text", "title"))
    return collector.frame()


def read_parquet_table(path: str | Path) -> pl.DataFrame:
    """Read a Parquet file; a missing or unreadable one is one error naming it."""
    path = Path(path)
    if not path.is_file():
        raise open_error(path, FileNotFoundError() if not path.exists() else IsADirectoryError())
    try:
        return pl.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 — polars raises several unrelated types here
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CorpusValidationError(
            path, None, None, f"unreadable Parquet file: {reason}"
        ) from None


def read_parquet_corpus(path: str | Path) -> pl.DataFrame:
    """Read a Parquet corpus with columns ``id``, ``text`` and optional ``title``; rows are 1-based."""
    return validate_corpus(read_parquet_table(path), source=path)


def validate_corpus(frame: pl.DataFrame, source: str | Path = "<dataframe>") -> pl.DataFrame:
    """Check a corpus table and return it in the corpus schema (title added as null if absent).

    Integer ids are converted to strings. Errors name ``source`` and the 1-based row.
    """
    for column in ("id", "text"):
        if column not in frame.columns:
            raise CorpusValidationError(source, None, column, "missing column")
    if frame.height == 0:
        raise CorpusValidationError(source, None, None, "no records")
    if "title" not in frame.columns:
        frame = frame.with_columns(pl.lit(None, dtype=pl.String()).alias("title"))
    id_type, text_type, title_type = frame.schema["id"], frame.schema["text"], frame.schema["title"]
    if not (id_type == pl.String() or id_type.is_integer()):
        raise CorpusValidationError(
            source, None, "id", f"expected strings or integers, got {id_type}"
        )
    for column, dtype in (("text", text_type), ("title", title_type)):
        if not (dtype == pl.String() or dtype == pl.Null()):
            raise CorpusValidationError(source, None, column, f"expected strings, got {dtype}")
    extra = [column for column in frame.columns if column not in PASSAGE_SCHEMA]
    frame = frame.drop(extra).with_columns(
        pl.col("id").cast(pl.String()),
        pl.col("text").cast(pl.String()),
        pl.col("title").cast(pl.String()).replace("", None),
    )
    _first_bad_row(
        frame,
        pl.col("id").is_null() | (pl.col("id").str.strip_chars() == ""),
        source,
        "id",
        "empty id",
    )
    _first_bad_row(
        frame,
        pl.col("text").is_null() | (pl.col("text").str.strip_chars() == ""),
        source,
        "text",
        "empty text",
    )
    duplicated = frame.with_row_index("row", offset=1).filter(pl.col("id").is_duplicated())
    if duplicated.height:
        first = duplicated.group_by("id", maintain_order=True).agg(pl.col("row")).row(0)
        raise CorpusValidationError(
            source,
            first[1][1],
            "id",
            f"duplicate id {first[0]!r} (first seen on row {first[1][0]})",
        )
    columns = list(PASSAGE_SCHEMA if "doc_id" in frame.columns else CORPUS_SCHEMA)
    return frame.select(columns)


def _first_bad_row(
    frame: pl.DataFrame, bad: pl.Expr, source: str | Path, field: str, message: str
) -> None:
    rows = frame.with_row_index("row", offset=1).filter(bad)["row"]
    if rows.len():
        raise CorpusValidationError(source, int(rows[0]), field, message)


def read_corpus(path: str | Path) -> pl.DataFrame:
    """Read a corpus file, choosing the reader from the suffix (.jsonl, .parquet, .tsv)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in {".jsonl", ".ndjson"}:
        return read_jsonl_corpus(path)
    if suffix == ".parquet":
        return read_parquet_corpus(path)
    if suffix == ".tsv":
        return read_dpr_tsv(path)
    raise CorpusValidationError(
        path, None, None, "unknown corpus format; expected .jsonl, .parquet or .tsv"
    )


# The score column's name in a BEIR qrels header row (``query-id<TAB>corpus-id<TAB>score``).
_QRELS_HEADER_SCORES = {"score", "relevance", "rel", "label"}


def read_qrels(path: str | Path) -> pl.DataFrame:
    """Read relevance judgements: BEIR ``query-id<TAB>corpus-id<TAB>score`` (header optional)
    or TREC ``qid iter docid relevance`` (whitespace-separated).

    Relevance must be an integer; a query-document pair judged twice with different relevance is
    an error (an identical repeat is kept once)."""
    return _read_qrels_lines(Path(path)).drop("line")


def _read_qrels_lines(path: Path) -> pl.DataFrame:
    """The judgements of :func:`read_qrels` with the 1-based ``line`` each came from."""
    rows: list[tuple[str, str, int, int]] = []
    judged: dict[tuple[str, str], tuple[int, int]] = {}  # pair → (relevance, line)
    first_row = True
    for number, line in decoded_lines(path):
        if not line.strip():
            continue
        header_allowed, first_row = first_row, False
        fields = line.split("\t") if "\t" in line else line.split()
        if len(fields) == 4:
            fields = [fields[0], fields[2], fields[3]]
        if len(fields) != 3:
            raise CorpusValidationError(
                path, number, None, f"expected 3 (BEIR) or 4 (TREC) fields, got {len(fields)}"
            )
        if header_allowed and fields[2].strip().lower() in _QRELS_HEADER_SCORES:
            continue
        for value, field in ((fields[0], "query_id"), (fields[1], "doc_id")):
            if not value.strip():
                raise CorpusValidationError(path, number, field, "empty id")
        try:
            relevance = int(fields[2])
        except ValueError:
            raise CorpusValidationError(
                path, number, "score", f"expected an integer, got {fields[2]!r}"
            ) from None
        pair = (fields[0].strip(), fields[1].strip())
        if pair in judged:
            # A repeated identical judgement (merged qrels files) is harmless; a different one is
            # ambiguous, and evaluators would silently keep whichever came last.
            earlier, line_before = judged[pair]
            if earlier == relevance:
                continue
            raise CorpusValidationError(
                path,
                number,
                "score",
                f"query {pair[0]!r} and document {pair[1]!r} are judged {earlier} on line "
                f"{line_before} and {relevance} here",
            )
        judged[pair] = (relevance, number)
        rows.append((*pair, relevance, number))
    if not rows:
        raise CorpusValidationError(path, None, None, "no judgements")
    return pl.DataFrame(rows, schema={**QRELS_SCHEMA, "line": pl.Int64()}, orient="row")


def read_judgements(
    path: str | Path, query_ids: pl.Series, doc_ids: pl.Series, queries_file: str, corpus_file: str
) -> pl.DataFrame:
    """:func:`read_qrels`, every judgement naming a query of ``query_ids`` and a passage of
    ``doc_ids`` (read from ``queries_file`` and ``corpus_file``, named in the error)."""
    path = Path(path)
    qrels = _read_qrels_lines(path)
    for column, ids, what in (
        ("query_id", query_ids, queries_file),
        ("doc_id", doc_ids, corpus_file),
    ):
        unknown = qrels.filter(~pl.col(column).is_in(ids.implode()))
        if unknown.height:
            raise CorpusValidationError(
                path,
                unknown["line"][0],
                column,
                f"{unknown.height} judgements name ids absent from {what}, "
                f"e.g. {unknown[column][0]!r}",
            )
    return qrels.drop("line")


@dataclass(frozen=True)
class BeirDataset:
    """A BEIR folder: the corpus, the queries and the judgements of one split."""

    corpus: pl.DataFrame
    queries: pl.DataFrame
    qrels: pl.DataFrame


def read_beir(folder: str | Path, split: str = "test") -> BeirDataset:
    """Read a BEIR folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``).

    Only queries that have judgements in ``split`` are kept, as BEIR's own loader does;
    judgements naming an unknown query or document are an error.
    """
    folder = Path(folder)
    qrels_path = folder / "qrels" / f"{split}.tsv"
    for needed in (folder / "corpus.jsonl", folder / "queries.jsonl", qrels_path):
        if not needed.is_file():
            raise CorpusValidationError(needed, None, None, "missing from the BEIR folder")
    corpus = read_jsonl_corpus(folder / "corpus.jsonl", id_field="_id")
    queries = read_jsonl_queries(folder / "queries.jsonl", id_field="_id")
    qrels = read_judgements(
        qrels_path, queries["id"], corpus["id"], "queries.jsonl", "corpus.jsonl"
    )
    queries = queries.filter(pl.col("id").is_in(qrels["query_id"].unique().implode()))
    return BeirDataset(corpus=corpus, queries=queries, qrels=qrels)


def corpus_fingerprint(corpus: pl.DataFrame) -> str:
    """SHA-256 over every row's id, title and text, in order: identifies the exact corpus an
    index was built from."""
    digest = hashlib.sha256()
    columns = [corpus["id"], corpus["title"] if "title" in corpus.columns else None, corpus["text"]]
    batch = 65_536
    for start in range(0, corpus.height, batch):
        stop = min(start + batch, corpus.height)
        ids = columns[0][start:stop].to_list()
        titles = (
            columns[1][start:stop].to_list() if columns[1] is not None else [None] * (stop - start)
        )
        texts = columns[2][start:stop].to_list()
        # Unit and record separators cannot occur in ids; they keep field boundaries unambiguous.
        digest.update(
            "".join(f"{i}\x1f{t or ''}\x1f{x}\x1e" for i, t, x in zip(ids, titles, texts)).encode(
                "utf-8"
            )
        )
    return f"sha256:{digest.hexdigest()}"


def corpus_record(corpus: pl.DataFrame) -> dict[str, object]:
    """What identifies and describes a corpus without its rows: the fingerprint, the number of
    passages and the column types — what a step needs that must not load a Wikipedia-scale table."""
    return {
        "fingerprint": corpus_fingerprint(corpus),
        "rows": corpus.height,
        "columns": {name: str(dtype) for name, dtype in corpus.schema.items()},
    }


def indexed_texts(corpus: pl.DataFrame, include_title: bool = True) -> list[str]:
    """The text each retriever indexes for a passage: ``"<title>\\n<text>"`` when the passage has a
    title and ``include_title`` is set (as DPR and Pyserini index Wikipedia), else the text alone."""
    if not include_title or "title" not in corpus.columns:
        return corpus["text"].to_list()
    return (
        corpus.select(
            pl.when(pl.col("title").is_not_null())
            .then(pl.concat_str("title", pl.lit("\n"), "text"))
            .otherwise("text")
        )
        .to_series()
        .to_list()
    )
