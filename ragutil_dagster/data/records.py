"""The records ``ragutil score`` reads: one JSONL line per question,
``{"id", "question", "answers": [gold, …], "contexts": [text or {"id", "text"}, …]}``, validated
line by line and turned into the evaluation's tables."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ragutil_dagster.data.corpus import jsonl_records, record_id
from ragutil_dagster.data.qa import gold_answer_list
from ragutil_dagster.errors import CorpusValidationError
from ragutil_dagster.tables import CORPUS_SCHEMA, QA_QUERY_SCHEMA, RUN_SCHEMA


@dataclass(frozen=True)
class Records:
    """The records as the evaluation's tables: queries, contexts as a corpus, and a run that
    ranks each record's contexts in their given order."""

    queries: pl.DataFrame
    corpus: pl.DataFrame
    run: pl.DataFrame


def _text_field(record: dict, field: str, path: Path, line: int) -> str:
    value = record.get(field)
    if value is None:
        raise CorpusValidationError(path, line, field, "missing")
    if not isinstance(value, str):
        raise CorpusValidationError(
            path, line, field, f"expected a string, got {type(value).__name__}"
        )
    if not value.strip():
        raise CorpusValidationError(path, line, field, "empty")
    return value


def read_records(path: str | Path) -> Records:
    """Read and validate the JSONL; the first problem raises with file, line and field."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    queries: list[dict] = []
    contexts: list[dict] = []
    run: list[dict] = []
    context_text: dict[str, tuple[str, int]] = {}  # context id → (text, line it first came on)
    first_line: dict[str, int] = {}
    for line, record in jsonl_records(path):
        rid = record_id(record.get("id"), path, line, "id")
        if rid in first_line:
            raise CorpusValidationError(
                path, line, "id", f"duplicate id {rid!r} (first seen on line {first_line[rid]})"
            )
        first_line[rid] = line
        question = _text_field(record, "question", path, line)
        answers = gold_answer_list(record.get("answers"), path, line)
        items = record.get("contexts")
        if not isinstance(items, list) or not items:
            raise CorpusValidationError(
                path, line, "contexts", "expected a non-empty list of texts or {id, text} objects"
            )
        in_record: set[str] = set()
        for rank, item in enumerate(items, start=1):
            field = f"contexts[{rank - 1}]"
            if isinstance(item, str):
                cid, text = f"{rid}#{rank}", item
            elif isinstance(item, dict):
                if "text" not in item:
                    raise CorpusValidationError(path, line, f"{field}.text", "missing")
                text = _text_field(item, "text", path, line)
                given = item.get("id")
                cid = (
                    f"{rid}#{rank}"
                    if given is None
                    else record_id(given, path, line, f"{field}.id")
                )
            else:
                raise CorpusValidationError(
                    path, line, field, f"expected a string or an object, got {type(item).__name__}"
                )
            if not text.strip():
                raise CorpusValidationError(path, line, field, "empty context")
            # A context id names one passage: twice in a record, or with another text, is a mistake.
            if cid in in_record:
                raise CorpusValidationError(
                    path, line, f"{field}.id", f"context id {cid!r} repeated in this record"
                )
            in_record.add(cid)
            if cid not in context_text:
                context_text[cid] = (text, line)
                contexts.append({"id": cid, "text": text, "title": ""})
            elif context_text[cid][0] != text:
                raise CorpusValidationError(
                    path,
                    line,
                    f"{field}.text",
                    f"context id {cid!r} has a different text on line {context_text[cid][1]}",
                )
            run.append(
                {
                    "query_id": rid,
                    "rank": rank,
                    "doc_id": cid,
                    "score": float(len(items) - rank + 1),
                    "retriever": "given",
                }
            )
        queries.append({"query_id": rid, "question": question, "answers": answers})
    if not queries:
        raise CorpusValidationError(path, None, None, "no records")
    return Records(
        queries=pl.DataFrame(queries, schema=QA_QUERY_SCHEMA),
        corpus=pl.DataFrame(contexts, schema=CORPUS_SCHEMA),
        run=pl.DataFrame(run, schema=RUN_SCHEMA),
    )
