"""Multi-step RAG, IRCoT-style (Trivedi et al., 2023; SePer Fig. 1–2, App. C.2 / Table 12): the
rounds of retrieval a multi-step setting's context is gathered in, inside its retrieval step.

Round 1 is the plain setting's top k for the question. Before each later round the query writer
(a generator of the config, greedy decoding) reads the question and the passages gathered so far
under the prompt of role ``multistep`` (default: the built-in ``multistep_next_query``) — fitted to its context as a rag prompt is,
passages dropped from the end — and writes the next query or thought; its first line is searched
(the question again when it is blank), and the round's top k not gathered yet join the context,
in their rank order after the earlier rounds', at most ``max_passages`` in all. Round t's setting
shows the generator the passages of rounds 1..t, so every metric scores it as any setting, and
ΔSePer after round t minus after round t − 1 is the utility round t added (:func:`round_gains`).

Every function here is deterministic: the same ranking and greedy writer give the same rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from ragutil_dagster import prompts as templates
from ragutil_dagster.evaluation.conditions import PromptBudget, fit_passages
from ragutil_dagster.metrics.stats import bootstrap_mean_ci, bootstrap_paired_diff_ci
from ragutil_dagster.tables import MULTISTEP_QUERY_SCHEMA, RUN_SCHEMA

Ranked = list[tuple[str, float]]
"""(doc_id, score) of one query's ranking, best first."""

Search = Callable[[dict[str, str]], dict[str, Ranked]]
"""The top k of each query text (query id → text), by the setting's retriever (and reranker)."""

Write = Callable[[list[str]], list[str]]
"""The query writer's greedy continuation of each prompt."""


def gather(context: Ranked, found: Ranked, max_passages: int | None) -> Ranked:
    """``context`` followed by the passages of ``found`` it does not hold yet, in their order, cut
    to ``max_passages`` (None: no cap)."""
    held = {doc for doc, _ in context}
    added = [(doc, score) for doc, score in found if doc not in held]
    gathered = [*context, *added]
    return gathered if max_passages is None else gathered[:max_passages]


def written_query(text: str, question: str) -> str:
    """The query a round searches: the writer's first non-blank line, or ``question`` when it wrote
    nothing (a blank query would match nothing, and the round would add nothing by accident)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else question


def next_query_prompt(
    qid: str,
    question: str,
    context: Sequence[tuple[str, str]],
    budget: PromptBudget | None,
    template: templates.Template | str = "multistep_next_query",
) -> str:
    """The writer's prompt (``template``) over ``context`` ((doc_id, text) gathered so far), fitted
    to ``budget`` as a rag prompt is (later passages dropped first, then the last one cut)."""
    docs = [(doc, "", text) for doc, text in context]
    return fit_passages(
        qid,
        question,
        docs,
        lambda passages: templates.render(
            template, question=question, reference=templates.format_reference(passages)
        ),
        budget,
    ).prompt


@dataclass(frozen=True)
class Rounds:
    """Every query's gathered context after the last round, and what each round searched."""

    contexts: dict[str, Ranked]
    queries: pl.DataFrame
    """MULTISTEP_QUERY_SCHEMA: per query and round, the text searched and the passages it added."""

    def run(self, retriever: str) -> pl.DataFrame:
        """The gathered contexts as a run table (RUN_SCHEMA): rank in gathering order, score
        decreasing with it (passages gathered - rank + 1) — each round's scores are of another
        query, on another scale, and a TREC consumer orders by score."""
        rows = [
            (qid, rank, doc, float(len(context) - rank + 1), retriever)
            for qid, context in self.contexts.items()
            for rank, (doc, _) in enumerate(context, start=1)
        ]
        return pl.DataFrame(rows, schema=RUN_SCHEMA, orient="row")


def run_rounds(
    questions: dict[str, str],
    first: dict[str, Ranked],
    texts: Callable[[str], str],
    search: Search,
    write: Write,
    steps: int,
    max_passages: int | None,
    budget: PromptBudget | None,
    template: templates.Template | str = "multistep_next_query",
) -> Rounds:
    """Rounds 2..``steps`` after ``first`` (round 1's top k per query): each writes one
    ``template`` prompt per query, searches the written queries together and gathers what they
    find. ``texts``: a passage's text by id."""
    contexts = {qid: gather([], first.get(qid, []), max_passages) for qid in questions}
    rows = [(qid, 1, question, len(contexts[qid])) for qid, question in questions.items()]
    for step in range(2, steps + 1):
        order = list(questions)
        prompts = [
            next_query_prompt(
                qid,
                questions[qid],
                [(doc, texts(doc)) for doc, _ in contexts[qid]],
                budget,
                template,
            )
            for qid in order
        ]
        written = {
            qid: written_query(text, questions[qid])
            for qid, text in zip(order, write(prompts), strict=True)
        }
        found = search(written)
        for qid in order:
            before = len(contexts[qid])
            contexts[qid] = gather(contexts[qid], found.get(qid, []), max_passages)
            rows.append((qid, step, written[qid], len(contexts[qid]) - before))
    return Rounds(contexts, pl.DataFrame(rows, schema=MULTISTEP_QUERY_SCHEMA, orient="row"))


ROUND_TABLE_SCHEMA = {
    "step": pl.Int64,
    "queries": pl.Int64,
    "delta_seper_s": pl.Float64,
    "delta_seper_s_low": pl.Float64,
    "delta_seper_s_high": pl.Float64,
    "gain_s": pl.Float64,
    "gain_s_low": pl.Float64,
    "gain_s_high": pl.Float64,
    "delta_seper_h": pl.Float64,
    "gain_h": pl.Float64,
    "context_tokens": pl.Float64,
}


def round_gains(per_round: Sequence[pl.DataFrame], seed: int = 0) -> pl.DataFrame:
    """One row per round of a chain (``per_round[t - 1]``: round t's per-query scores, with
    ``query_id``, ``delta_seper_s``, ``delta_seper_h`` and, where counted, ``context_tokens_after``):
    mean ΔSePer_S with its bootstrap 95% interval, the gain over the round
    before (the mean paired per-query difference, its paired bootstrap interval; over the queries
    both rounds scored), ΔSePer_H and its gain, mean context tokens. Round 1 has no gain."""
    rows = []
    for step, scores in enumerate(per_round, start=1):
        values = scores["delta_seper_s"].drop_nulls().to_numpy()
        row: dict[str, object] = {"step": step, "queries": int(values.size)}
        interval = bootstrap_mean_ci(values, seed=seed) if values.size >= 2 else None
        row.update(
            delta_seper_s=float(values.mean()) if values.size else None,
            delta_seper_s_low=interval.low if interval else None,
            delta_seper_s_high=interval.high if interval else None,
            delta_seper_h=_mean(scores["delta_seper_h"]),
            context_tokens=_mean(scores["context_tokens_after"])
            if "context_tokens_after" in scores.columns
            else None,
        )
        if step > 1:
            row.update(
                _gain(per_round[step - 2], scores, "delta_seper_s", seed, with_interval=True)
            )
            row.update(
                _gain(per_round[step - 2], scores, "delta_seper_h", seed, with_interval=False)
            )
        rows.append(row)
    return (
        pl.DataFrame(rows, schema=ROUND_TABLE_SCHEMA, orient="row")
        if rows
        else pl.DataFrame(schema=ROUND_TABLE_SCHEMA)
    )


def _mean(column: pl.Series) -> float | None:
    values = column.drop_nulls()
    return float(values.mean()) if values.len() else None


def _gain(
    before: pl.DataFrame, after: pl.DataFrame, column: str, seed: int, with_interval: bool
) -> dict[str, float | None]:
    kernel = column.removeprefix("delta_seper_")
    joined = (
        after.select("query_id", pl.col(column).alias("after"))
        .join(before.select("query_id", pl.col(column).alias("before")), on="query_id")
        .drop_nulls()
    )
    after_values, before_values = joined["after"].to_numpy(), joined["before"].to_numpy()
    gain: dict[str, float | None] = {
        f"gain_{kernel}": float(np.mean(after_values - before_values)) if joined.height else None
    }
    if with_interval:
        interval = (
            bootstrap_paired_diff_ci(after_values, before_values, seed=seed)
            if joined.height >= 2
            else None
        )
        gain[f"gain_{kernel}_low"] = interval.low if interval else None
        gain[f"gain_{kernel}_high"] = interval.high if interval else None
    return gain
