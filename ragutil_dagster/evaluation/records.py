"""Scoring a user's own records without Dagster — the engine of ``ragutil score``.

Each JSONL line is ``{"id", "question", "answers": [gold, …], "contexts": [text or {"id", "text"}, …]}``.
The generator is sampled closed book, with all contexts together (in the given order) and with
each context alone; the result per record is ΔSePer_S/H, SePer with and without the contexts,
per-context ΔSePer, ConSens and EM / F1; with ``consens.leave_one_out`` each context's ConSens
attribution too (the drop of ConSens without it, ConSens §3.3).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from ragutil_dagster.config import ExperimentConfig, GeneratorConfig, PromptConfig
from ragutil_dagster.data.records import Records
from ragutil_dagster.evaluation.conditions import (
    PromptBudget,
    closed_book_prompts,
    consens_prompts,
    context_prompts,
)
from ragutil_dagster.evaluation.sampling import sample_prompts
from ragutil_dagster.evaluation.scoring import (
    compute_nli,
    document_scores,
    group_scores,
    query_scores,
)
from ragutil_dagster.evaluation.signals import consens_scores
from ragutil_dagster.tables import QRELS_SCHEMA


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
    no_qrels = pl.DataFrame(schema=QRELS_SCHEMA)
    budget = PromptBudget.of(generator, experiment.sampling.max_new_tokens)
    with_context = context_prompts(
        records.queries, records.corpus, records.run, no_qrels, records.max_contexts, prompts, budget
    )
    prompt_table = pl.concat([closed_book_prompts(records.queries, prompts, budget), with_context])
    samples = sample_prompts(prompt_table, generator, generator_spec.name, experiment.sampling, experiment.seed)
    scored_prompts = pl.concat([
        prompt_table,
        consens_prompts(
            records.queries, with_context, records.corpus, prompts, budget, experiment.consens.leave_one_out
        ),
    ])
    nli = compute_nli(samples, records.queries, entail)
    groups = group_scores(samples, records.queries, nli)
    consens = consens_scores(scored_prompts, samples, records.queries, scorer)
    per_query = {
        row["query_id"]: row for row in query_scores(groups, records.queries, consens.per_query).iter_rows(named=True)
    }
    documents = document_scores(groups, records.queries, records.run, records.max_contexts)
    attribution = {(qid, doc): a for qid, doc, _, a in consens.leave_one_out.iter_rows()}
    per_context: dict[str, list[dict[str, Any]]] = {}
    for row in documents.sort("query_id", "rank").iter_rows(named=True):
        scores = {
            "id": row["doc_id"], "rank": row["rank"],
            "delta_seper_s": row["delta_seper_s"], "delta_seper_h": row["delta_seper_h"],
        }
        if experiment.consens.leave_one_out:
            scores["consens_attribution"] = attribution.get((row["query_id"], row["doc_id"]))
        per_context.setdefault(row["query_id"], []).append(scores)
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
