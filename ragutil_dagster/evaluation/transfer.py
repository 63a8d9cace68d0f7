"""LLM-specific utility across LLMs (Zhang et al., 2025 §4–5): which context helps *this* LLM, and
whether one LLM's gold-utility passages help another.

For one generator of a setting:

* Table 1 — has_answer of its greedy answer with no passage (``none``), the setting's top k
  (``top_k``, the rag condition), all utility candidates (``candidates``: the paper's C, the
  pseudo-answer's prompt), the human-annotated passage (``human``: MIRAGE's oracle prompt, queries
  with one only) and its own gold-utility passages G_q(C) (``gold:<generator>``);
* the transfer (§4.2, Figure 2) — its answer with every other generator's gold-utility passages
  (``gold:<other>``);
* the overlap of its gold sets with every other generator's (§5, Figure 3;
  :func:`~ragutil_dagster.metrics.utility.gold_overlap`).

A gold set is G_q over the setting's utility candidates (eq. 2, ``candidate_scores``), shown
together in rank order with the generator's own ``with_context`` prompt. An empty set is no
context: its answer is the closed-book one — a known query (answered closed book) keeps its
correct answer, as the paper's G_q column does. The paper's G_q(U) (candidates ∪ human passages)
is not computed: the candidates are the retriever's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import polars as pl

from ragutil_dagster.config import PromptConfig
from ragutil_dagster.evaluation.conditions import (
    UTILITY_PSEUDO_ANSWER,
    PromptBudget,
    fit_context_prompt,
    prompt_row,
    utility_gold_condition,
)
from ragutil_dagster.metrics import answers as answer_metrics
from ragutil_dagster.metrics.utility import gold_overlap
from ragutil_dagster.tables import (
    DECODING_GREEDY,
    PROMPT_SCHEMA,
    UTILITY_OVERLAP_SCHEMA,
    UTILITY_TRANSFER_SCHEMA,
)

TABLE_ONE_CONTEXTS = ("none", "top_k", "candidates", "human")
"""Table 1's contexts before the gold-utility ones, in the paper's column order."""
_GROUP_CONTEXTS = {"closed_book": "none", "rag": "top_k", "oracle": "human"}


def gold_context(generator: str) -> str:
    """Table 1's context of ``generator``'s gold-utility passages."""
    return f"gold:{generator}"


def gold_sets(candidate_scores: pl.DataFrame) -> dict[str, list[str]]:
    """Each query's gold-utility passages (eq. 2) in rank order, from a ``candidate_scores`` table
    (``CANDIDATE_SCHEMA``); a query with none maps to ``[]``."""
    ranked = candidate_scores.sort("query_id", "rank")
    gold: dict[str, list[str]] = {qid: [] for qid in ranked["query_id"].unique(maintain_order=True)}
    for qid, doc in ranked.filter(pl.col("gold_utility")).select("query_id", "doc_id").iter_rows():
        gold[qid].append(doc)
    return gold


def transfer_prompts(
    queries: pl.DataFrame,
    passages: pl.DataFrame,
    gold_by_generator: Mapping[str, Mapping[str, list[str]]],
    prompts: PromptConfig,
    budget: PromptBudget | None,
) -> pl.DataFrame:
    """The ``with_context`` prompt of every query with every generator's non-empty gold set
    (condition ``gold_<generator>``, ``PROMPT_SCHEMA``)."""
    texts = {
        doc: (doc, title or "", text)
        for doc, title, text in passages.select("id", "title", "text").iter_rows()
    }
    questions = dict(queries.select("query_id", "question").iter_rows())
    rows = [
        prompt_row(
            qid,
            utility_gold_condition(source),
            None,
            fit_context_prompt(
                qid, questions[qid], [texts[d] for d in docs], prompts.with_context, budget
            ),
        )
        for source, gold in gold_by_generator.items()
        for qid, docs in gold.items()
        if docs and qid in questions
    ]
    return pl.DataFrame(rows, schema=PROMPT_SCHEMA)


def transfer_table(
    queries: pl.DataFrame,
    groups: pl.DataFrame,
    utility_generations: pl.DataFrame,
    gold_by_generator: Mapping[str, Mapping[str, list[str]]],
    decoded: pl.DataFrame,
) -> pl.DataFrame:
    """Per query and Table 1 context (``UTILITY_TRANSFER_SCHEMA``): the passages shown, the greedy
    answer and its has_answer. ``groups`` are the generator's group scores (closed book, rag,
    oracle), ``utility_generations`` its utility step's rows (the pseudo-answer), ``decoded`` its
    greedy answers to :func:`transfer_prompts`. Only queries with every context are kept, so the
    columns of Table 1 average over the same questions."""
    golds = dict(queries.select("query_id", "answers").iter_rows())
    rows: list[dict] = []
    for condition, context in _GROUP_CONTEXTS.items():
        for qid, answer, has in (
            groups.filter(pl.col("condition") == condition)
            .select("query_id", "answer", "answer_has")
            .iter_rows()
        ):
            rows.append(
                {
                    "query_id": qid,
                    "context": context,
                    "passages": None,
                    "answer": answer,
                    "has_answer": has,
                }
            )
    pseudo = utility_generations.filter(
        (pl.col("decoding") == DECODING_GREEDY) & (pl.col("condition") == UTILITY_PSEUDO_ANSWER)
    )
    for qid, text in pseudo.select("query_id", "text").iter_rows():
        rows.append(
            {
                "query_id": qid,
                "context": "candidates",
                "passages": None,
                "answer": text,
                "has_answer": answer_metrics.has_answer(text, golds[qid]),
            }
        )
    with_gold = {
        (qid, condition): text
        for qid, condition, text in decoded.select("query_id", "condition", "text").iter_rows()
    }
    closed = {row["query_id"]: row for row in rows if row["context"] == "none"}
    for source, gold in gold_by_generator.items():
        for qid, docs in gold.items():
            if qid not in closed:
                continue
            answer = (
                with_gold[(qid, utility_gold_condition(source))] if docs else closed[qid]["answer"]
            )
            has = (
                answer_metrics.has_answer(answer, golds[qid]) if docs else closed[qid]["has_answer"]
            )
            rows.append(
                {
                    "query_id": qid,
                    "context": gold_context(source),
                    "passages": len(docs),
                    "answer": answer,
                    "has_answer": has,
                }
            )
    contexts = [*TABLE_ONE_CONTEXTS, *(gold_context(s) for s in gold_by_generator)]
    table = pl.DataFrame(rows, schema=UTILITY_TRANSFER_SCHEMA)
    complete = (
        table.group_by("query_id")
        .agg(pl.col("context").n_unique())
        .filter(pl.col("context") == len(contexts))
    )
    order = pl.col("context").replace_strict(
        {c: i for i, c in enumerate(contexts)}, return_dtype=pl.Int32
    )
    return table.filter(pl.col("query_id").is_in(complete["query_id"].implode())).sort(
        "query_id", order
    )


def overlap_table(
    generator: str, gold_by_generator: Mapping[str, Mapping[str, list[str]]]
) -> pl.DataFrame:
    """The overlap of ``generator``'s gold sets with every other generator's
    (``UTILITY_OVERLAP_SCHEMA``; one row per other generator)."""
    own = {qid: set(docs) for qid, docs in gold_by_generator[generator].items()}
    rows = []
    for other, gold in gold_by_generator.items():
        if other == generator:
            continue
        theirs = {qid: set(docs) for qid, docs in gold.items()}
        ours, back = gold_overlap(own, theirs), gold_overlap(theirs, own)
        rows.append(
            {
                "other": other,
                "jaccard": ours.jaccard,
                "mean_shared": ours.mean_shared,
                "useful_only_to_this": ours.useful_only_to_a,
                "useful_only_to_other": back.useful_only_to_a,
                "gold_passages_this": ours.n_passages_a,
                "gold_passages_other": back.n_passages_a,
                "queries": ours.n_queries,
            }
        )
    return pl.DataFrame(rows, schema=UTILITY_OVERLAP_SCHEMA)


def transfer_metrics(table: pl.DataFrame, overlap: pl.DataFrame) -> dict[str, float]:
    """The figures as flat metric names: ``utility_table1_has_answer_<context>`` (``gold:x`` →
    ``gold_x``) and the questions they average over, ``utility_overlap_<statistic>_<other>``."""
    out: dict[str, float] = {}
    for (context,), rows in table.group_by("context", maintain_order=True):
        name = str(context).replace(":", "_")
        out[f"utility_table1_has_answer_{name}"] = float(rows["has_answer"].mean())
        if rows["passages"].null_count() < rows.height:
            out[f"utility_table1_passages_{name}"] = float(rows["passages"].mean())
    out["utility_table1_questions"] = float(table["query_id"].n_unique())
    for row in overlap.iter_rows(named=True):
        for statistic in (
            "jaccard",
            "mean_shared",
            "useful_only_to_this",
            "useful_only_to_other",
            "queries",
        ):
            if row[statistic] is not None and not math.isnan(row[statistic]):
                out[f"utility_overlap_{statistic}_{row['other']}"] = float(row[statistic])
    return out
