"""QA datasets for evaluation: questions with gold answers, the passages to retrieve from, and
relevance judgements (formats in docs/datasets.md; ``DatasetConfig.format`` names one).

- ``beir`` / ``synthetic``: a folder holding ``corpus.jsonl``, ``queries.jsonl`` and
  ``qrels/<split>.tsv`` (BEIR) and the gold answers: an ``answers`` list on each record of
  ``questions.jsonl`` when that file exists (the synthetic world's layout, which also gives question
  type and knowledge), else on each record of ``queries.jsonl``. ``utility.jsonl`` (ground-truth
  passage utility) is read when present.
- ``squad``: the official SQuAD JSON (v1.1; v2.0's unanswerable questions are left out): each
  paragraph a passage ``<title slug>_<paragraph index>``, each question a query judged relevant
  to its paragraph.
- ``qa``: questions with answers, one record per line (JSONL) or row (Parquet), NQ-open style,
  over a separate corpus file; judged by a qrels file, or else each passage holding a gold answer
  (DPR ``has_answer``) is relevant.

``chunking`` then cuts the corpus's documents into passages and maps the judgements onto them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from ragutil_dagster.config import ChunkingConfig, DatasetConfig
from ragutil_dagster.data.chunking import (
    chunk_sentences,
    chunk_tokens,
    chunk_words,
    minilm_token_counter,
    passage_qrels,
)
from ragutil_dagster.data.corpus import (
    jsonl_records,
    open_error,
    read_beir,
    read_corpus,
    read_judgements,
    read_parquet_table,
    record_id,
)
from ragutil_dagster.errors import CorpusValidationError
from ragutil_dagster.infra.files import user_path
from ragutil_dagster.infra.shared import embedded_build
from ragutil_dagster.metrics.answers import has_answer
from ragutil_dagster.tables import QA_QUERY_OPTIONAL_SCHEMA, QA_QUERY_SCHEMA, QRELS_SCHEMA

QUERY_COLUMNS = tuple(QA_QUERY_SCHEMA)
_UTILITY_OPTIONAL_FIELDS = {"role": pl.String, "hop": pl.Int64}
# What a JSON value must be to fill a column of each type (bool is not an integer here).
_JSON_TYPES = {
    pl.String: (str,),
    pl.Boolean: (bool,),
    pl.Int32: (int,),
    pl.Int64: (int,),
    pl.Float64: (int, float),
}
_JSON_TYPE_NAMES = {
    pl.String: "a string",
    pl.Boolean: "true or false",
    pl.Int32: "an integer",
    pl.Int64: "an integer",
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
    """Where a dataset's ``path`` points (a folder, or the file of ``squad`` and ``qa``)."""
    if spec.path:
        return user_path(spec.path)
    return embedded_build() / "world"


def gold_answer_list(value: object, path: Path, line: int) -> list[str]:
    """A record's ``answers``: a non-empty list of non-empty strings, else an error naming the field."""
    if not isinstance(value, list) or not value:
        raise CorpusValidationError(
            path, line, "answers", "expected a non-empty list of gold answers"
        )
    for position, answer in enumerate(value):
        if not isinstance(answer, str) or not answer.strip():
            raise CorpusValidationError(
                path, line, f"answers[{position}]", f"empty or not a string: {answer!r}"
            )
    return value


def _typed_value(
    record: dict,
    field: str,
    dtype: type[pl.DataType],
    path: Path,
    line: int,
    required: bool = False,
):
    """``record[field]`` checked against the column type it fills; absent or null is None unless
    ``required``."""
    value = record.get(field)
    if value is None:
        if required:
            raise CorpusValidationError(path, line, field, "missing")
        return None
    wrong_type = isinstance(value, bool) != (dtype is pl.Boolean) or not isinstance(
        value, _JSON_TYPES[dtype]
    )
    if wrong_type or (isinstance(value, float) and not math.isfinite(value)):  # 1e999 parses as inf
        raise CorpusValidationError(
            path,
            line,
            field,
            f"expected {_JSON_TYPE_NAMES[dtype]}{'' if required else ' or null'}, got {type(value).__name__} {value!r}",
        )
    return value


def _read_answers(path: Path) -> pl.DataFrame:
    rows: dict[str, list] = {"query_id": [], "answers": []} | {
        f: [] for f in QA_QUERY_OPTIONAL_SCHEMA
    }
    first_line: dict[str, int] = {}
    for number, record in jsonl_records(path):
        field = "_id" if "_id" in record else "id"
        qid = record_id(record.get(field), path, number, field)
        if qid in first_line:
            raise CorpusValidationError(
                path, number, field, f"duplicate id {qid!r} (first seen on line {first_line[qid]})"
            )
        first_line[qid] = number
        rows["query_id"].append(qid)
        rows["answers"].append(gold_answer_list(record.get("answers"), path, number))
        for name, dtype in QA_QUERY_OPTIONAL_SCHEMA.items():
            rows[name].append(_typed_value(record, name, dtype, path, number))
    schema = {"query_id": pl.String, "answers": pl.List(pl.String)} | QA_QUERY_OPTIONAL_SCHEMA
    return pl.DataFrame(rows, schema=schema)


def load_dataset(spec: DatasetConfig) -> QADataset:
    """Read a dataset; every query must have gold answers. ``max_queries`` keeps the first queries
    in id order (a stable sample); ``chunking`` then cuts the corpus into passages."""
    readers = {"squad": _read_squad_dataset, "qa": _read_qa_dataset}
    loaded = readers.get(spec.format, _read_folder_dataset)(spec)
    queries = _first_queries(loaded.queries, spec.max_queries)
    keep = queries["query_id"].implode()
    loaded = replace(
        loaded,
        queries=queries,
        qrels=loaded.qrels.filter(pl.col("query_id").is_in(keep)),
        utility=None
        if loaded.utility is None
        else loaded.utility.filter(pl.col("query_id").is_in(keep)),
    )
    return _chunked(loaded, spec.chunking) if spec.chunking else loaded


def _first_queries(queries: pl.DataFrame, max_queries: int | None) -> pl.DataFrame:
    """The first ``max_queries`` queries in id order (all when None)."""
    queries = queries.sort("query_id")
    return queries.head(max_queries) if max_queries else queries


def _read_folder_dataset(spec: DatasetConfig) -> QADataset:
    """A BEIR folder, or the synthetic world (a BEIR folder with ``questions.jsonl`` and utility)."""
    folder = dataset_folder(spec)
    if not folder.is_dir():
        hint = (
            " Build the embedded world with `ragutil world build`."
            if spec.format == "synthetic"
            else ""
        )
        raise FileNotFoundError(f"dataset {spec.name!r}: no folder {folder}.{hint}")
    beir = read_beir(folder, spec.split)
    answers_file = folder / "questions.jsonl"
    if not answers_file.is_file():
        answers_file = folder / "queries.jsonl"
    answers = _read_answers(answers_file)
    queries = beir.queries.rename({"id": "query_id", "text": "question"}).join(
        answers, on="query_id", how="left"
    )
    missing = queries.filter(pl.col("answers").is_null())
    if missing.height:
        raise CorpusValidationError(
            answers_file,
            None,
            "answers",
            f"{missing.height} queries have no gold answers, e.g. {missing['query_id'][0]!r}",
        )
    queries = queries.drop(
        [c for c in QA_QUERY_OPTIONAL_SCHEMA if queries[c].null_count() == queries.height]
    )
    utility = None
    if (folder / "utility.jsonl").is_file():
        utility = _read_utility(folder / "utility.jsonl", beir.corpus)
    return QADataset(
        name=spec.name, queries=queries, corpus=beir.corpus, qrels=beir.qrels, utility=utility
    )


def _chunked(loaded: QADataset, chunking: ChunkingConfig) -> QADataset:
    """``loaded`` with its documents cut into passages and its judgements mapped onto them."""
    if chunking.unit == "words":
        passages = chunk_words(loaded.corpus, chunking.size, chunking.overlap)
    elif chunking.unit == "sentences":
        passages = chunk_sentences(loaded.corpus, chunking.size, chunking.overlap)
    else:
        passages = chunk_tokens(
            loaded.corpus, minilm_token_counter(), chunking.size, chunking.overlap
        )
    answers = dict(loaded.queries.select("query_id", "answers").iter_rows())
    return replace(loaded, corpus=passages, qrels=passage_qrels(loaded.qrels, passages, answers))


# --- SQuAD ---------------------------------------------------------------------------------------


def _read_squad_dataset(spec: DatasetConfig) -> QADataset:
    corpus, queries, qrels = read_squad(dataset_folder(spec))
    return QADataset(name=spec.name, queries=queries, corpus=corpus, qrels=qrels, utility=None)


def _squad_list(value: object, path: Path, field: str) -> list:
    if not isinstance(value, list):
        raise CorpusValidationError(
            path, None, field, f"expected a list, got {type(value).__name__}"
        )
    return value


def _squad_text(value: object, path: Path, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise CorpusValidationError(
            path, None, field, f"expected a non-empty string, got {value!r}"
        )
    return value


def read_squad(path: str | Path) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(corpus, queries, qrels) of an official SQuAD JSON file: ``{"data": [{"title",
    "paragraphs": [{"context", "qas": [{"id", "question", "answers": [{"text"}, ...]}]}]}]}``.

    Each paragraph is a passage ``<title slug>_<index in its article>``; each question a query with
    its distinct answer texts (annotator order), relevant (1) to its paragraph. Questions marked
    ``is_impossible`` (SQuAD 2.0) have no answer to judge and are left out. A problem names the file
    and the JSON path of the field (``data[3].paragraphs[0].qas[2].answers``)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise open_error(path, exc) from None
    try:
        document = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise CorpusValidationError(
            path, None, None, f"not valid UTF-8 (byte {exc.start})"
        ) from None
    except json.JSONDecodeError as exc:
        raise CorpusValidationError(
            path, exc.lineno, None, f"invalid JSON: {exc.msg} (column {exc.colno})"
        ) from None
    if not isinstance(document, dict) or "data" not in document:
        raise CorpusValidationError(
            path, None, "data", "not a SQuAD file: expected an object with a 'data' list"
        )
    passages: dict[str, list] = {"id": [], "text": [], "title": []}
    queries: dict[str, list] = {"query_id": [], "question": [], "answers": []}
    qrels: list[tuple[str, str, int]] = []
    seen: dict[str, str] = {}  # id → the field that first held it
    for a, article in enumerate(_squad_list(document["data"], path, "data")):
        where = f"data[{a}]"
        if not isinstance(article, dict):
            raise CorpusValidationError(
                path, None, where, f"expected an object, got {type(article).__name__}"
            )
        title = _squad_text(article.get("title"), path, f"{where}.title")
        slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "article"
        for p, paragraph in enumerate(
            _squad_list(article.get("paragraphs"), path, f"{where}.paragraphs")
        ):
            at = f"{where}.paragraphs[{p}]"
            if not isinstance(paragraph, dict):
                raise CorpusValidationError(
                    path, None, at, f"expected an object, got {type(paragraph).__name__}"
                )
            passage_id = _new_id(f"{slug}_{p}", seen, path, at)
            passages["id"].append(passage_id)
            passages["text"].append(_squad_text(paragraph.get("context"), path, f"{at}.context"))
            passages["title"].append(title.replace("_", " "))
            for q, qa in enumerate(_squad_list(paragraph.get("qas"), path, f"{at}.qas")):
                field = f"{at}.qas[{q}]"
                if not isinstance(qa, dict):
                    raise CorpusValidationError(
                        path, None, field, f"expected an object, got {type(qa).__name__}"
                    )
                if qa.get("is_impossible") is True:
                    continue
                query_id = _new_id(
                    record_id(qa.get("id"), path, None, f"{field}.id"), seen, path, f"{field}.id"
                )
                queries["query_id"].append(query_id)
                queries["question"].append(
                    _squad_text(qa.get("question"), path, f"{field}.question")
                )
                answers = _squad_list(qa.get("answers"), path, f"{field}.answers")
                texts = [
                    _squad_text(
                        answer.get("text") if isinstance(answer, dict) else None,
                        path,
                        f"{field}.answers[{n}].text",
                    )
                    for n, answer in enumerate(answers)
                ]
                if not texts:
                    raise CorpusValidationError(
                        path, None, f"{field}.answers", "no gold answer (and not is_impossible)"
                    )
                queries["answers"].append(list(dict.fromkeys(texts)))
                qrels.append((query_id, passage_id, 1))
    if not queries["query_id"]:
        raise CorpusValidationError(path, None, "data", "no answerable questions")
    return (
        pl.DataFrame(passages, schema={"id": pl.String, "text": pl.String, "title": pl.String}),
        pl.DataFrame(queries, schema=QA_QUERY_SCHEMA),
        pl.DataFrame(qrels, schema=QRELS_SCHEMA, orient="row"),
    )


def _new_id(key: str, seen: dict[str, str], path: Path, field: str) -> str:
    if key in seen:
        raise CorpusValidationError(
            path, None, field, f"duplicate id {key!r} (first at {seen[key]})"
        )
    seen[key] = field
    return key


# --- questions with answers over a corpus ---------------------------------------------------------

# The field names accepted for each part of a question record, first present wins (NQ-open:
# "question" / "answer"; BEIR-like: "_id" / "text" / "answers"; others "qid", "query").
QUESTION_ID_FIELDS = ("id", "_id", "qid", "query_id")
QUESTION_TEXT_FIELDS = ("question", "query", "text")
ANSWER_FIELDS = ("answers", "answer")


def _read_qa_dataset(spec: DatasetConfig) -> QADataset:
    questions_path = dataset_folder(spec)
    # Selected here already: judging by answer containment costs time per question.
    queries = _first_queries(read_questions(questions_path), spec.max_queries)
    corpus_path = user_path(spec.corpus)
    corpus = read_corpus(corpus_path)
    if spec.qrels:
        qrels = read_judgements(
            user_path(spec.qrels),
            queries["query_id"],
            corpus["id"],
            str(questions_path),
            str(corpus_path),
        )
    else:
        qrels = answer_qrels(queries, corpus)
    return QADataset(name=spec.name, queries=queries, corpus=corpus, qrels=qrels, utility=None)


def _question_records(path: Path) -> Iterator[tuple[int, dict]]:
    """(1-based line or row, record) of a JSONL or Parquet questions file."""
    suffix = path.suffix.lower()
    if suffix in {".jsonl", ".ndjson"}:
        yield from jsonl_records(path)
    elif suffix == ".parquet":
        yield from enumerate(read_parquet_table(path).iter_rows(named=True), start=1)
    else:
        raise CorpusValidationError(
            path, None, None, "unknown questions format; expected .jsonl or .parquet"
        )


def _first_field(record: dict, names: tuple[str, ...]) -> str | None:
    return next((name for name in names if record.get(name) is not None), None)


def read_questions(path: str | Path) -> pl.DataFrame:
    """Questions with gold answers (the query schema) from JSONL or Parquet: per record an id
    (``id`` / ``_id`` / ``qid`` / ``query_id``; absent: its line or row number), a question
    (``question`` / ``query`` / ``text``) and answers (``answers`` / ``answer``: a list of strings,
    or one string)."""
    path = Path(path)
    rows: dict[str, list] = {"query_id": [], "question": [], "answers": []}
    first_line: dict[str, int] = {}
    for number, record in _question_records(path):
        id_field = _first_field(record, QUESTION_ID_FIELDS)
        query_id = record_id(record[id_field], path, number, id_field) if id_field else str(number)
        if query_id in first_line:
            raise CorpusValidationError(
                path,
                number,
                id_field or "id",
                f"duplicate id {query_id!r} (first seen on line {first_line[query_id]})",
            )
        first_line[query_id] = number
        text_field = _first_field(record, QUESTION_TEXT_FIELDS)
        if text_field is None:
            raise CorpusValidationError(
                path, number, "question", f"missing (one of {', '.join(QUESTION_TEXT_FIELDS)})"
            )
        question = record[text_field]
        if not isinstance(question, str) or not question.strip():
            raise CorpusValidationError(
                path, number, text_field, f"expected a non-empty string, got {question!r}"
            )
        answer_field = _first_field(record, ANSWER_FIELDS)
        if answer_field is None:
            raise CorpusValidationError(
                path, number, "answers", f"missing (one of {', '.join(ANSWER_FIELDS)})"
            )
        answers = record[answer_field]
        answers = [answers] if isinstance(answers, str) else answers
        try:
            answers = gold_answer_list(answers, path, number)
        except CorpusValidationError as err:  # name the field the file used
            raise CorpusValidationError(
                path, number, err.field.replace("answers", answer_field, 1), err.message
            ) from None
        rows["query_id"].append(query_id)
        rows["question"].append(question)
        rows["answers"].append(list(answers))
    if not rows["query_id"]:
        raise CorpusValidationError(path, None, None, "no records")
    return pl.DataFrame(rows, schema=QA_QUERY_SCHEMA)


def answer_qrels(queries: pl.DataFrame, corpus: pl.DataFrame) -> pl.DataFrame:
    """Relevance by answer containment, as DPR judges NQ-open: a passage is relevant (1) to a
    question when it holds one of its gold answers (``has_answer``, token-exact). Candidates come
    from one Aho-Corasick pass of the lowercased answers over the lowercased corpus (polars
    ``extract_many``)."""
    aliases = (
        queries.select("query_id", pl.col("answers").alias("alias"))
        .explode("alias")
        .with_columns(pl.col("alias").str.to_lowercase())
    )
    patterns = aliases["alias"].unique().to_list()
    found = (
        corpus.select(
            pl.col("id").alias("doc_id"),
            pl.col("text")
            .str.to_lowercase()
            .str.extract_many(patterns, overlapping=True)
            .alias("alias"),
        )
        .explode("alias")
        .drop_nulls("alias")
        .unique()
    )
    candidates = aliases.join(found, on="alias").select("query_id", "doc_id").unique()
    texts = dict(corpus.select("id", "text").iter_rows())
    golds = dict(queries.select("query_id", "answers").iter_rows())
    relevant = [has_answer(texts[doc], golds[query]) for query, doc in candidates.iter_rows()]
    return (
        candidates.filter(pl.Series(relevant, dtype=pl.Boolean))
        .with_columns(pl.lit(1, dtype=pl.Int64).alias("relevance"))
        .sort("query_id", "doc_id")
    )


def _read_utility(path: Path, corpus: pl.DataFrame) -> pl.DataFrame:
    """Ground-truth utility: one ``{"query-id", "corpus-id", "utility", "role"?, "hop"?}`` per line,
    every passage in the corpus and every utility a finite number."""
    columns = (
        {"query_id": pl.String, "doc_id": pl.String}
        | _UTILITY_OPTIONAL_FIELDS
        | {"utility": pl.Float64}
    )
    rows: dict[str, list] = {name: [] for name in columns}
    passages = set(corpus["id"].to_list())
    for number, record in jsonl_records(path):
        rows["query_id"].append(record_id(record.get("query-id"), path, number, "query-id"))
        doc_id = record_id(record.get("corpus-id"), path, number, "corpus-id")
        if doc_id not in passages:
            raise CorpusValidationError(
                path, number, "corpus-id", f"id {doc_id!r} is absent from corpus.jsonl"
            )
        rows["doc_id"].append(doc_id)
        rows["utility"].append(
            float(_typed_value(record, "utility", pl.Float64, path, number, required=True))
        )
        for name, dtype in _UTILITY_OPTIONAL_FIELDS.items():
            rows[name].append(_typed_value(record, name, dtype, path, number))
    return pl.DataFrame(rows, schema=columns)
