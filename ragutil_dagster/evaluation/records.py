"""Scoring a user's own records without Dagster — the engine of ``ragutil score``.

Each JSONL line is ``{"id", "question", "answers": [gold, …], "contexts": [text or {"id", "text"}, …]}``.
The generator is sampled closed book, with all contexts together (in the given order) and with
each context alone; the result per record is ΔSePer_S/H, SePer with and without the contexts,
per-context ΔSePer, ConSens and EM / F1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from ragutil_dagster.config import ExperimentConfig, GeneratorConfig, PromptConfig
from ragutil_dagster.errors import CorpusValidationError
from ragutil_dagster.evaluation.conditions import PromptBudget, closed_book_prompts, context_prompts
from ragutil_dagster.evaluation.dataset import gold_answer_list
from ragutil_dagster.evaluation.sampling import sample_prompts
from ragutil_dagster.evaluation.scoring import (
    compute_nli,
    document_scores,
    group_scores,
    query_scores,
)
from ragutil_dagster.evaluation.signals import consens_scores
from ragutil_dagster.retrieval.corpus import jsonl_records, record_id


@dataclass(frozen=True)
class Records:
    """The records as the evaluation's tables: queries, contexts as a corpus, and a run that
    ranks each record's contexts in their given order."""

    queries: pl.DataFrame
    corpus: pl.DataFrame
    run: pl.DataFrame
    max_contexts: int


def _text_field(record: dict, field: str, path: Path, line: int) -> str:
    value = record.get(field)
    if value is None:
        raise CorpusValidationError(path, line, field, "missing")
    if not isinstance(value, str):
        raise CorpusValidationError(path, line, field, f"expected a string, got {type(value).__name__}")
    if not value.strip():
        raise CorpusValidationError(path, line, field, "empty")
    return value


def read_records(path: str | Path) -> Records:
    """Read and validate the JSONL; the first problem raises with file, line and field."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    queries: list[tuple] = []
    contexts: list[tuple[str, str, str]] = []
    run: list[tuple] = []
    context_text: dict[str, tuple[str, int]] = {}  # context id → (text, line it first came on)
    first_line: dict[str, int] = {}
    for line, record in jsonl_records(path):
        rid = record_id(record.get("id"), path, line, "id")
        if rid in first_line:
            raise CorpusValidationError(path, line, "id", f"duplicate id {rid!r} (first seen on line {first_line[rid]})")
        first_line[rid] = line
        question = _text_field(record, "question", path, line)
        answers = gold_answer_list(record.get("answers"), path, line)
        items = record.get("contexts")
        if not isinstance(items, list) or not items:
            raise CorpusValidationError(path, line, "contexts", "expected a non-empty list of texts or {id, text} objects")
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
                cid = f"{rid}#{rank}" if given is None else record_id(given, path, line, f"{field}.id")
            else:
                raise CorpusValidationError(path, line, field, f"expected a string or an object, got {type(item).__name__}")
            if not text.strip():
                raise CorpusValidationError(path, line, field, "empty context")
            # A context id names one passage: twice in a record, or with another text, is a mistake.
            if cid in in_record:
                raise CorpusValidationError(path, line, f"{field}.id", f"context id {cid!r} repeated in this record")
            in_record.add(cid)
            if cid not in context_text:
                context_text[cid] = (text, line)
                contexts.append((cid, "", text))
            elif context_text[cid][0] != text:
                raise CorpusValidationError(
                    path, line, f"{field}.text",
                    f"context id {cid!r} has a different text on line {context_text[cid][1]}",
                )
            run.append((rid, rank, cid, float(len(items) - rank + 1), "given"))
        queries.append((rid, question, answers))
    if not queries:
        raise CorpusValidationError(path, None, None, "no records")
    return Records(
        queries=pl.DataFrame(queries, schema={"query_id": pl.String, "question": pl.String, "answers": pl.List(pl.String)}, orient="row"),
        corpus=pl.DataFrame(contexts, schema={"id": pl.String, "title": pl.String, "text": pl.String}, orient="row"),
        run=pl.DataFrame(run, schema={"query_id": pl.String, "rank": pl.Int32, "doc_id": pl.String, "score": pl.Float64, "retriever": pl.String}, orient="row"),
        max_contexts=max(rank for _, rank, *_ in run),
    )


def score_records(
    records: Records,
    experiment: ExperimentConfig,
    generator_spec: GeneratorConfig,
    generator: Any,
    scorer: Any,
    entail: Any,
    prompts: PromptConfig | None = None,
) -> list[dict[str, Any]]:
    """Score every record; one dict per record, in input order."""
    prompts = prompts or experiment.prompts
    no_qrels = pl.DataFrame(schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32})
    budget = PromptBudget.of(generator, experiment.sampling.max_new_tokens)
    prompt_table = pl.concat([
        closed_book_prompts(records.queries, prompts, budget),
        context_prompts(records.queries, records.corpus, records.run, no_qrels, records.max_contexts, prompts, budget),
    ])
    samples = sample_prompts(prompt_table, generator, generator_spec.name, experiment.sampling, experiment.seed)
    nli = compute_nli(samples, records.queries, entail)
    groups = group_scores(samples, records.queries, nli)
    consens = consens_scores(prompt_table, samples, records.queries, scorer)
    per_query = {row["query_id"]: row for row in query_scores(groups, records.queries, consens).iter_rows(named=True)}
    documents = document_scores(groups, records.run, records.max_contexts)
    per_context: dict[str, list[dict[str, Any]]] = {}
    for row in documents.sort("query_id", "rank").iter_rows(named=True):
        per_context.setdefault(row["query_id"], []).append(
            {"id": row["doc_id"], "rank": row["rank"], "delta_seper_s": row["delta_seper_s"], "delta_seper_h": row["delta_seper_h"]}
        )
    out = []
    for qid in records.queries["query_id"]:
        row = per_query[qid]
        out.append({
            "id": qid,
            "delta_seper_s": row["delta_seper_s"],
            "delta_seper_h": row["delta_seper_h"],
            "seper_s_with_context": row["seper_s_rag"],
            "seper_s_without_context": row["seper_s_closed"],
            "seper_h_with_context": row["seper_h_rag"],
            "seper_h_without_context": row["seper_h_closed"],
            "per_context": per_context.get(qid, []),
            "consens": row.get("consens"),
            "em_with_context": row["em_rag"],
            "em_without_context": row["em_closed"],
            "f1_with_context": row["f1_rag"],
            "f1_without_context": row["f1_closed"],
            "answer_with_context": row["answer_rag"],
            "answer_without_context": row["answer_closed"],
        })
    return out
