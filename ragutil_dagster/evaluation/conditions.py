"""The prompts of each sampling condition, built from queries, a retrieval run and qrels.

Conditions (DESIGN.md, SePer §3.4, MIRAGE §4.1):

* ``closed_book`` — the question alone (MIRAGE's base setting); sampled once per dataset ×
  generator and shared by every retriever setting;
* ``rag`` — the top-k retrieved passages together, in rank order. This is also MIRAGE's *mixed*
  setting: the retriever's top-k from the pool, relevant and noisy chunks together;
* ``per_doc`` — each of the top-k passages alone (per-document ΔSePer, eRAG labels, gold utility);
* ``oracle`` — the dataset's positive passages only (MIRAGE's oracle setting), for queries with
  positives in the qrels.
"""

from __future__ import annotations

import polars as pl

from ragutil_dagster import prompts as templates
from ragutil_dagster.config import PromptConfig

CONDITIONS = ("closed_book", "rag", "per_doc", "oracle")
PROMPT_SCHEMA = {
    "query_id": pl.String,
    "condition": pl.String,
    "doc_id": pl.String,
    "doc_ids": pl.List(pl.String),
    "prompt": pl.String,
}


def closed_book_prompts(queries: pl.DataFrame, prompts: PromptConfig) -> pl.DataFrame:
    """One closed-book prompt per query."""
    return pl.DataFrame(
        {
            "query_id": queries["query_id"],
            "condition": ["closed_book"] * queries.height,
            "doc_id": [None] * queries.height,
            "doc_ids": [[] for _ in range(queries.height)],
            "prompt": [templates.closed_book(q, prompts.closed_book) for q in queries["question"]],
        },
        schema=PROMPT_SCHEMA,
    )


def context_prompts(
    queries: pl.DataFrame,
    corpus: pl.DataFrame,
    run: pl.DataFrame,
    qrels: pl.DataFrame,
    k: int,
    prompts: PromptConfig,
) -> pl.DataFrame:
    """The ``rag``, ``per_doc`` and ``oracle`` prompts of every query for a top-``k`` run."""
    passages = {
        doc_id: (title or "", text)
        for doc_id, title, text in corpus.select("id", "title", "text").iter_rows()
    }
    top = run.filter(pl.col("rank") <= k).sort("query_id", "rank")
    ranked = {qid: docs for qid, docs in top.group_by("query_id").agg(pl.col("doc_id")).iter_rows()}
    positives = {
        qid: docs
        for qid, docs in qrels.filter(pl.col("relevance") > 0)
        .sort("query_id", "doc_id")
        .group_by("query_id", maintain_order=True)
        .agg(pl.col("doc_id"))
        .iter_rows()
    }
    rows: list[tuple] = []

    def add(qid: str, condition: str, doc_id: str | None, docs: list[str], question: str) -> None:
        prompt = templates.with_context(question, [passages[d] for d in docs], prompts.with_context)
        rows.append((qid, condition, doc_id, docs, prompt))

    for qid, question in queries.select("query_id", "question").iter_rows():
        docs = ranked.get(qid, [])
        if not docs:
            raise ValueError(f"query {qid!r} has no retrieved passage in the run")
        add(qid, "rag", None, docs, question)
        for doc in docs:
            add(qid, "per_doc", doc, [doc], question)
        if qid in positives:
            add(qid, "oracle", None, positives[qid], question)
    return pl.DataFrame(rows, schema=PROMPT_SCHEMA, orient="row")
