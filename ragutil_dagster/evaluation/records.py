"""Scoring a user's own records without Dagster — the engine of ``ragutil score``.

Each JSONL line is ``{"id", "question", "answers": [gold, …], "contexts": [text or {"id", "text"}, …]}``.
The generator is sampled closed book, with all contexts together (in the given order) and with
each context alone. The result per record is every per-query metric of the catalogue
(``metrics/catalog.py``: ΔSePer_S/H, SePer, semantic entropy, EM / F1 / has_answer, ConSens, the
contexts' tokens), a
condition's named by what the record gave it (``seper_s_with_context``, ``em_without_context``),
per context its catalogued per-document metrics (ΔSePer_S/H of the context alone), the judged
answer with that context alone and whether it holds a gold answer (``answer``, ``has_answer``:
eRAG's label by has_answer) — with ``consens.leave_one_out`` its ConSens attribution too (the drop
of ConSens without it, ConSens §3.3) —, and the judged answers. With ``sampling.adaptive``, each
record also carries ``sample_fraction``: the samples its prompts drew over N per prompt.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from ragutil_dagster.config import ExperimentConfig, GeneratorConfig, PromptConfig
from ragutil_dagster.data.records import Records
from ragutil_dagster.evaluation import chain
from ragutil_dagster.evaluation.chain import Sampler, sample_prompts_by_config
from ragutil_dagster.evaluation.compression import (
    compress_contexts,
    context_token_count,
    ranked_contexts,
)
from ragutil_dagster.evaluation.conditions import consens_prompts
from ragutil_dagster.evaluation.paper_scores import ERAG_LABEL_COLUMNS
from ragutil_dagster.evaluation.signals import consens_scores
from ragutil_dagster.metrics import catalog
from ragutil_dagster.tables import DECODING_SAMPLE, QRELS_SCHEMA, QUERY_CONDITIONS

# A condition's column suffix → its name in a record's result: with the record's contexts, or none.
RECORD_CONDITIONS = {
    QUERY_CONDITIONS["rag"]: "with_context",
    QUERY_CONDITIONS["closed_book"]: "without_context",
}


def record_key(column: str) -> str:
    """The result key of a per-query column: ``seper_s_rag`` → ``seper_s_with_context``."""
    stem, _, suffix = column.rpartition("_")
    return f"{stem}_{RECORD_CONDITIONS[suffix]}" if stem and suffix in RECORD_CONDITIONS else column


def score_records(
    records: Records,
    experiment: ExperimentConfig,
    generator_spec: GeneratorConfig,
    generator: Any,
    scorer: Any,
    entail: Any,
    prompts: PromptConfig | None = None,
) -> list[dict[str, Any]]:
    """Score every record; one dict per record, in input order. ``prompts``: the templates, by
    default the generator's (``ExperimentConfig.prompts_for``)."""
    templates = prompts or experiment.prompts_for(generator_spec.name)
    sampler = Sampler(
        generator, generator_spec.name, experiment.sampling, experiment.seed, templates
    )
    no_qrels = pl.DataFrame(schema=QRELS_SCHEMA)
    with_context = chain.with_context(
        sampler, records.queries, records.corpus, records.run, no_qrels
    )
    prompt_table = pl.concat([chain.closed_book(sampler, records.queries), with_context])
    samples, _ = sample_prompts_by_config(sampler, prompt_table, records.queries, entail)
    scored_prompts = pl.concat(
        [
            prompt_table,
            consens_prompts(
                records.queries,
                with_context,
                records.corpus,
                templates,
                sampler.budget,
                experiment.consens.leave_one_out,
            ),
        ]
    )
    nli = chain.nli(samples, records.queries, entail)
    consens = consens_scores(scored_prompts, samples, records.queries, scorer)
    questions, contexts = ranked_contexts(records.queries, records.corpus, records.run)
    counted = compress_contexts(
        questions,
        contexts,
        None,
        context_token_count(generator)[0],
        templates.with_context,
    )
    scored = chain.scores(
        samples, records.queries, nli, records.run, consens=consens.per_query, contexts=counted
    )
    metrics = [name for name in catalog.per_query_means() if name in scored.per_query.columns]
    document_metrics = [m.name for m in catalog.entries() if m.per_document]
    answers = [f"answer_{suffix}" for suffix in RECORD_CONDITIONS]
    attribution = {(qid, doc): a for qid, doc, _, a in consens.leave_one_out.iter_rows()}
    alone = {
        (qid, doc): answer
        for qid, doc, answer in scored.groups.filter(pl.col("condition") == "per_doc")
        .select("query_id", "doc_id", "answer")
        .iter_rows()
    }
    per_context: dict[str, list[dict[str, Any]]] = {}
    for row in scored.documents.sort("query_id", "rank").iter_rows(named=True):
        scores = {
            "id": row["doc_id"],
            "rank": row["rank"],
            **{name: row[name] for name in document_metrics},
            "answer": alone[(row["query_id"], row["doc_id"])],
            "has_answer": bool(row[ERAG_LABEL_COLUMNS["has_answer"]]),
        }
        if experiment.consens.leave_one_out:
            scores["consens_attribution"] = attribution.get((row["query_id"], row["doc_id"]))
        per_context.setdefault(row["query_id"], []).append(scores)
    per_query = {row["query_id"]: row for row in scored.per_query.iter_rows(named=True)}
    drawn = (
        record_sample_fractions(samples, experiment.sampling.n)
        if experiment.sampling.adaptive is not None
        else {}
    )
    return [
        {
            "id": qid,
            **{record_key(name): per_query[qid][name] for name in metrics},
            **({"sample_fraction": drawn[qid]} if drawn else {}),
            "per_context": per_context.get(qid, []),
            **{record_key(name): per_query[qid][name] for name in answers},
        }
        for qid in records.queries["query_id"]
    ]


def record_sample_fractions(samples: pl.DataFrame, n_max: int) -> dict[str, float]:
    """Per record: the samples its prompts drew (closed book, all contexts, each context alone)
    over N per prompt — adaptive sampling's cost beside its scores (``sample_fraction``)."""
    per_prompt = (
        samples.filter(pl.col("decoding") == DECODING_SAMPLE)
        .group_by("query_id", "condition", "doc_id")
        .len()
    )
    per_record = per_prompt.group_by("query_id").agg(
        fraction=pl.col("len").sum() / (pl.len() * n_max)
    )
    return dict(per_record.iter_rows())
