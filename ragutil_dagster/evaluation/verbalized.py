"""LLM-specific utility as the paper runs it (Zhang et al., 2025 §3.3–3.4): the generator judges
the utility of each query's candidates — the setting's top ``utility.candidates`` passages, whatever
the RAG k — and answers with the passages it selected.

Every decoding is greedy (temperature 0, as the paper sets it for all LLMs), in three rounds:

1. the pseudo-answer a: the generator's answer over all the candidates together (condition
   ``candidates``; §3.4: "generated based on the top-20 retrieval results"), and its answer with
   each candidate alone beyond the top k (``per_candidate``; gold utility needs has_answer with
   every candidate alone, eq. 1, and the ``per_doc`` condition already holds the top k);
2. the verbalized judgments of ``utility.methods`` (prompts of App. A, ``prompts.utility_*``;
   ``judge_<method>``), parsed by ``metrics.utility`` — pointwise: one prompt per candidate,
   listwise: one per query — and, teacher-forced, likelihood and attention utility of every
   candidate for a (``signals.passage_utility``);
3. RAG with each method's passages (``rag_<method>``; Table 3 for selections, Table 7's top k for
   rankings). An empty selection has no prompt: its answer is the closed-book one (scoring).

A judgment not in the requested format counts in ``unparseable`` and selects nothing, as the
authors' code reads it; an unparseable ranking keeps the retrieval order. Scoring
(``evaluation.utility_scores``) judges the answers against the gold ones and ``evaluation.summary``
aggregates them.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ragutil_dagster import prompts as templates
from ragutil_dagster.config import ExperimentConfig
from ragutil_dagster.errors import UnparseableOutputError
from ragutil_dagster.evaluation.conditions import (
    UTILITY_PER_CANDIDATE,
    UTILITY_PSEUDO_ANSWER,
    PromptBudget,
    closed_book_prompts,
    fit_context_prompt,
    fit_passages,
    prompt_row,
    utility_judge_condition,
    utility_rag_condition,
)
from ragutil_dagster.evaluation.prompt_sampling import decode_prompts
from ragutil_dagster.evaluation.signals import passage_utility
from ragutil_dagster.metrics.utility import (
    SELECTION_METHODS,
    complete_ranking,
    parse_pointwise,
    parse_ranking,
    parse_selection,
)
from ragutil_dagster.models.generation import Generator
from ragutil_dagster.models.token_scoring import TokenScorer
from ragutil_dagster.sampling import SamplingParams
from ragutil_dagster.tables import DECODING_GREEDY, PROMPT_SCHEMA, UTILITY_JUDGMENT_SCHEMA

POINTWISE_MAX_NEW_TOKENS = 16
"""Room for ``Utility judgment: Yes.`` and a little slack."""


def is_pointwise(method: str) -> bool:
    return method.startswith("pointwise")


def judgment_max_new_tokens(method: str, passages: int) -> int:
    """The tokens a judgment may generate: ``Utility judgment: Yes.`` (pointwise), or
    ``My selection:`` / nothing and one ``[[i]],`` or ``[i] >`` per passage (listwise), with
    slack for spacing and numbers split into digit tokens."""
    return POINTWISE_MAX_NEW_TOKENS if is_pointwise(method) else 8 + 6 * passages


@dataclass(frozen=True)
class UtilityRun:
    """What the generator produced: every prompt (decoded or scored), the greedy generation rows,
    one judgment row per query and method (``UTILITY_JUDGMENT_SCHEMA``), the likelihood /
    attention utility of every candidate (``SIGNAL_SCHEMA``)."""

    prompts: pl.DataFrame
    generations: pl.DataFrame
    judgments: pl.DataFrame
    signals: pl.DataFrame


def candidate_lists(candidates: pl.DataFrame) -> dict[str, list[str]]:
    """Each query's candidates in rank order."""
    return dict(
        candidates.sort("query_id", "rank")
        .group_by("query_id", maintain_order=True)
        .agg("doc_id")
        .iter_rows()
    )


def judge_utility(
    queries: pl.DataFrame,
    passages: pl.DataFrame,
    candidates: pl.DataFrame,
    k: int,
    generator: Generator,
    generator_name: str,
    scorer: TokenScorer,
    experiment: ExperimentConfig,
) -> UtilityRun:
    """The three rounds of the module doc for every query of ``queries`` over its
    ``candidates`` (a run table), with the passages' text from ``passages`` (corpus schema). A
    query without candidates (a run file's question without a row, ``missing_queries: empty``)
    has nothing to judge: it has no prompt, judgment or signal."""
    texts = {
        doc: (doc, title or "", text)
        for doc, title, text in passages.select("id", "title", "text").iter_rows()
    }
    ranked = candidate_lists(candidates)
    queries = queries.filter(pl.col("query_id").is_in(list(ranked)))
    questions = dict(queries.select("query_id", "question").iter_rows())
    greedy = experiment.sampling.greedy_params(experiment.seed)
    answer_budget = PromptBudget.of(generator, experiment.sampling.max_new_tokens)
    prompts = experiment.prompts_for(generator_name)
    template = prompts.with_context

    def decode(table: pl.DataFrame, params: SamplingParams) -> pl.DataFrame:
        return decode_prompts(table, generator, generator_name, DECODING_GREEDY, params)

    # Round 1: the pseudo-answer, and each candidate alone (decoded beyond the top k only).
    def answer_prompt(
        qid: str, condition: str, doc_id: str | None, docs: list[tuple[str, str, str]]
    ) -> dict:
        return prompt_row(
            qid,
            condition,
            doc_id,
            fit_context_prompt(qid, questions[qid], docs, template, answer_budget),
        )

    together, alone = [], []
    for qid in questions:
        docs = [texts[d] for d in ranked[qid]]
        together.append(answer_prompt(qid, UTILITY_PSEUDO_ANSWER, None, docs))
        alone.extend(
            (rank, answer_prompt(qid, UTILITY_PER_CANDIDATE, doc[0], [doc]))
            for rank, doc in enumerate(docs, 1)
        )
    together_table = pl.DataFrame(together, schema=PROMPT_SCHEMA)
    alone_table = pl.DataFrame([row for _, row in alone], schema=PROMPT_SCHEMA)
    beyond_k = pl.DataFrame([row for rank, row in alone if rank > k], schema=PROMPT_SCHEMA)
    first = decode(pl.concat([together_table, beyond_k]), greedy)
    pseudo = dict(
        first.filter(pl.col("condition") == UTILITY_PSEUDO_ANSWER)
        .select("query_id", "text")
        .iter_rows()
    )

    closed = closed_book_prompts(queries, prompts, answer_budget)
    signals = passage_utility(
        pl.concat([closed, alone_table, together_table]),
        pseudo,
        passages,
        scorer,
        alone=UTILITY_PER_CANDIDATE,
        together=UTILITY_PSEUDO_ANSWER,
    )

    # Round 2: the judgments, each method with the room its output needs.
    judgment_prompts, judgment_rows, judgments = [], [], []
    for method in experiment.utility.methods:
        max_new_tokens = judgment_max_new_tokens(method, max(len(docs) for docs in ranked.values()))
        budget = PromptBudget.of(generator, max_new_tokens)
        table = pl.DataFrame(
            [
                row
                for qid, question in questions.items()
                for row in _judgment_prompts(
                    method,
                    prompts.template(f"utility_{method}"),
                    qid,
                    question,
                    [texts[d] for d in ranked[qid]],
                    pseudo[qid],
                    budget,
                )
            ],
            schema=PROMPT_SCHEMA,
        )
        params = SamplingParams(
            n=1, temperature=0.0, max_new_tokens=max_new_tokens, seed=experiment.seed
        )
        decoded = decode(table, params)
        judgment_prompts.append(table)
        judgment_rows.append(decoded)
        judgments.extend(_parse(method, table, decoded, ranked, k))
    judgment_table = pl.DataFrame(judgments, schema=UTILITY_JUDGMENT_SCHEMA)

    # Round 3: RAG with each method's passages (none for an empty selection).
    rag_table = pl.DataFrame(
        [
            answer_prompt(qid, utility_rag_condition(method), None, [texts[d] for d in docs])
            for qid, method, docs in judgment_table.select(
                "query_id", "method", "rag_doc_ids"
            ).iter_rows()
            if docs
        ],
        schema=PROMPT_SCHEMA,
    )
    return UtilityRun(
        prompts=pl.concat([closed, together_table, alone_table, *judgment_prompts, rag_table]),
        generations=pl.concat([first, *judgment_rows, decode(rag_table, greedy)]),
        judgments=judgment_table,
        signals=signals,
    )


def _judgment_prompts(
    method: str,
    template: templates.Template,
    qid: str,
    question: str,
    docs: list[tuple[str, str, str]],
    answer: str,
    budget: PromptBudget | None,
) -> list[dict]:
    """The prompt rows of ``method`` (its ``template``) for one query: one per candidate
    (pointwise, ``doc_id`` set) or one over all of them (listwise, ``doc_ids`` the candidates kept
    to fit the budget)."""
    condition = utility_judge_condition(method)

    def render(passages: list[tuple[str, str]]) -> str:
        return templates.utility_judgment(method, question, passages, answer, template)

    if is_pointwise(method):
        return [
            prompt_row(qid, condition, doc[0], fit_passages(qid, question, [doc], render, budget))
            for doc in docs
        ]
    return [prompt_row(qid, condition, None, fit_passages(qid, question, docs, render, budget))]


def _parse(
    method: str, prompts: pl.DataFrame, decoded: pl.DataFrame, ranked: dict[str, list[str]], k: int
) -> list[dict]:
    """One judgment row per query of ``method`` from its decoded prompts."""
    shown = {
        (qid, doc): docs
        for qid, doc, docs in prompts.select("query_id", "doc_id", "doc_ids").iter_rows()
    }
    outputs: dict[str, list[tuple[str | None, str]]] = {}
    for qid, doc, text in decoded.select("query_id", "doc_id", "text").iter_rows():
        outputs.setdefault(qid, []).append((doc, text))
    rows = []
    for qid, answers in outputs.items():
        candidates = ranked[qid]
        seen = [(shown[(qid, doc)], text) for doc, text in answers]
        named, failed = _read(method, seen)
        visible = {d for docs, _ in seen for d in docs}
        if method in SELECTION_METHODS:
            chosen = set(named)
            selected, ranking = [d for d in candidates if d in chosen], None
            rag = selected
        else:  # a ranking: the candidates a prompt could not show follow, in rank order
            ranking = named + [d for d in candidates if d not in set(named)]
            selected, rag = None, ranking[:k]
        rows.append(
            {
                "query_id": qid,
                "method": method,
                "shown": [d for d in candidates if d in visible],
                "selected": selected,
                "ranking": ranking,
                "rag_doc_ids": rag,
                "judgments": len(answers),
                "unparseable": failed,
            }
        )
    return rows


def _read(method: str, answers: list[tuple[list[str], str]]) -> tuple[list[str], int]:
    """The passages (doc ids) a method's answers name — selected, or all of them ranked best
    first — and how many answers were unparseable. Each answer comes with the passages its
    prompt showed, numbered from 1."""
    named: list[str] = []
    failed = 0
    for docs, text in answers:
        try:
            if is_pointwise(method):
                named.extend(docs if parse_pointwise(text) else [])
            elif method in SELECTION_METHODS:
                named.extend(docs[n - 1] for n in parse_selection(text, len(docs)))
            else:
                named.extend(
                    docs[n - 1] for n in complete_ranking(parse_ranking(text, len(docs)), len(docs))
                )
        except UnparseableOutputError:
            failed += 1
    return named, failed


def parse_failures(judgments: pl.DataFrame) -> pl.DataFrame:
    """Per method: judgments, unparseable answers and their share (the parse-failure rate), and
    the mean number of passages selected (selection methods)."""
    return (
        judgments.group_by("method", maintain_order=True)
        .agg(
            pl.col("judgments").sum(),
            pl.col("unparseable").sum(),
            pl.col("selected").list.len().mean().alias("mean_selected"),
        )
        .with_columns((pl.col("unparseable") / pl.col("judgments")).alias("parse_failure_rate"))
    )
