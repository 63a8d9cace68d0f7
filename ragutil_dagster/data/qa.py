"""QA datasets for evaluation: a BEIR folder whose questions carry gold answers.

A dataset folder holds ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv`` (BEIR) and
the gold answers: an ``answers`` list on each record of ``questions.jsonl`` when that file exists
(the synthetic world's layout, which also gives question type and knowledge), else on each record
of ``queries.jsonl``. ``utility.jsonl`` (ground-truth passage utility) is read when present.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ragutil_dagster.config import DatasetConfig
from ragutil_dagster.data.corpus import jsonl_records, read_beir, record_id
from ragutil_dagster.errors import CorpusValidationError
from ragutil_dagster.files import embedded_dir
from ragutil_dagster.tables import QA_QUERY_SCHEMA

QUERY_COLUMNS = tuple(QA_QUERY_SCHEMA)
_OPTIONAL_FIELDS = {"type": pl.String, "known": pl.Boolean, "n_hops": pl.Int32}
_UTILITY_OPTIONAL_FIELDS = {"role": pl.String, "hop": pl.Int64}
# What a JSON value must be to fill a column of each type (bool is not an integer here).
_JSON_TYPES = {pl.String: (str,), pl.Boolean: (bool,), pl.Int32: (int,), pl.Int64: (int,), pl.Float64: (int, float)}
_JSON_TYPE_NAMES = {
    pl.String: "a string", pl.Boolean: "true or false", pl.Int32: "an integer", pl.Int64: "an integer",
    pl.Float64: "a finite number",
}


@dataclass(frozen=True)
class QADataset:
    """``queries``: query_id, question, answers (list of gold aliases) and, when known, type /
    known / n_hops; ``corpus``: id, text, title; ``qrels``: query_id, doc_id, relevance;
    ``utility``: query_id, doc_id, utility (ground truth) or None."""

    name: str
    queries: pl.DataFrame
    corpus: pl.DataFrame
    qrels: pl.DataFrame
    utility: pl.DataFrame | None


def dataset_folder(spec: DatasetConfig) -> Path:
    if spec.path:
        return Path(spec.path).expanduser()
    return embedded_dir() / "world"


def gold_answer_list(value: object, path: Path, line: int) -> list[str]:
    """A record's ``answers``: a non-empty list of non-empty strings, else an error naming the field."""
    if not isinstance(value, list) or not value:
        raise CorpusValidationError(path, line, "answers", "expected a non-empty list of gold answers")
    for position, answer in enumerate(value):
        if not isinstance(answer, str) or not answer.strip():
            raise CorpusValidationError(path, line, f"answers[{position}]", f"empty or not a string: {answer!r}")
    return value


def _typed_value(record: dict, field: str, dtype: type[pl.DataType], path: Path, line: int, required: bool = False):
    """``record[field]`` checked against the column type it fills; absent or null is None unless
    ``required``."""
    value = record.get(field)
    if value is None:
        if required:
            raise CorpusValidationError(path, line, field, "missing")
        return None
    wrong_type = isinstance(value, bool) != (dtype is pl.Boolean) or not isinstance(value, _JSON_TYPES[dtype])
    if wrong_type or (isinstance(value, float) and not math.isfinite(value)):  # 1e999 parses as inf
        raise CorpusValidationError(
            path, line, field,
            f"expected {_JSON_TYPE_NAMES[dtype]}{'' if required else ' or null'}, got {type(value).__name__} {value!r}",
        )
    return value


def _read_answers(path: Path) -> pl.DataFrame:
    rows: dict[str, list] = {"query_id": [], "answers": []} | {f: [] for f in _OPTIONAL_FIELDS}
    first_line: dict[str, int] = {}
    for number, record in jsonl_records(path):
        field = "_id" if "_id" in record else "id"
        qid = record_id(record.get(field), path, number, field)
        if qid in first_line:
            raise CorpusValidationError(path, number, field, f"duplicate id {qid!r} (first seen on line {first_line[qid]})")
        first_line[qid] = number
        rows["query_id"].append(qid)
        rows["answers"].append(gold_answer_list(record.get("answers"), path, number))
        for name, dtype in _OPTIONAL_FIELDS.items():
            rows[name].append(_typed_value(record, name, dtype, path, number))
    schema = {"query_id": pl.String, "answers": pl.List(pl.String)} | _OPTIONAL_FIELDS
    return pl.DataFrame(rows, schema=schema)


def load_dataset(spec: DatasetConfig) -> QADataset:
    """Read a dataset folder; every query must have gold answers. ``max_queries`` keeps the
    first queries in id order (a stable sample)."""
    folder = dataset_folder(spec)
    if not folder.is_dir():
        hint = " Build the embedded world with `ragutil world build`." if spec.format == "synthetic" else ""
        raise FileNotFoundError(f"dataset {spec.name!r}: no folder {folder}.{hint}")
    beir = read_beir(folder, spec.split)
    answers_file = folder / "questions.jsonl"
    if not answers_file.is_file():
        answers_file = folder / "queries.jsonl"
    answers = _read_answers(answers_file)
    queries = beir.queries.rename({"id": "query_id", "text": "question"}).join(answers, on="query_id", how="left")
    missing = queries.filter(pl.col("answers").is_null())
    if missing.height:
        raise CorpusValidationError(
            answers_file, None, "answers",
            f"{missing.height} queries have no gold answers, e.g. {missing['query_id'][0]!r}",
        )
    queries = queries.drop([c for c in _OPTIONAL_FIELDS if queries[c].null_count() == queries.height])
    queries = queries.sort("query_id")
    if spec.max_queries:
        queries = queries.head(spec.max_queries)
    keep = queries["query_id"].implode()
    utility = None
    if (folder / "utility.jsonl").is_file():
        utility = _read_utility(folder / "utility.jsonl", beir.corpus).filter(pl.col("query_id").is_in(keep))
    return QADataset(
        name=spec.name,
        queries=queries,
        corpus=beir.corpus,
        qrels=beir.qrels.filter(pl.col("query_id").is_in(keep)),
        utility=utility,
    )


def _read_utility(path: Path, corpus: pl.DataFrame) -> pl.DataFrame:
    """Ground-truth utility: one ``{"query-id", "corpus-id", "utility", "role"?, "hop"?}`` per line,
    every passage in the corpus and every utility a finite number."""
    columns = {"query_id": pl.String, "doc_id": pl.String} | _UTILITY_OPTIONAL_FIELDS | {"utility": pl.Float64}
    rows: dict[str, list] = {name: [] for name in columns}
    passages = set(corpus["id"].to_list())
    for number, record in jsonl_records(path):
        rows["query_id"].append(record_id(record.get("query-id"), path, number, "query-id"))
        doc_id = record_id(record.get("corpus-id"), path, number, "corpus-id")
        if doc_id not in passages:
            raise CorpusValidationError(path, number, "corpus-id", f"id {doc_id!r} is absent from corpus.jsonl")
        rows["doc_id"].append(doc_id)
        rows["utility"].append(float(_typed_value(record, "utility", pl.Float64, path, number, required=True)))
        for name, dtype in _UTILITY_OPTIONAL_FIELDS.items():
            rows[name].append(_typed_value(record, name, dtype, path, number))
    return pl.DataFrame(rows, schema=columns)
