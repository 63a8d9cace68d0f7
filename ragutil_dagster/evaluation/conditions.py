"""The prompts of each sampling condition, built from queries, a retrieval run and qrels.

Conditions (DESIGN.md, SePer §3.4, MIRAGE §4.1):

* ``closed_book`` — the question alone (MIRAGE's base setting); sampled once per dataset ×
  generator and shared by every retriever setting;
* ``rag`` — the top-k retrieved passages together, in rank order. This is also MIRAGE's *mixed*
  setting: the retriever's top-k from the pool, relevant and noisy chunks together. A question the
  retriever returned nothing for (a run file's question without a row, ``missing_queries: empty``)
  sees what SePer's eq. 11 gives it with D = ∅: its closed-book prompt, whose closed-book samples
  the generation step reuses (:func:`empty_retrieval_samples`);
* ``per_doc`` — each of the top-k passages alone (per-document ΔSePer, eRAG labels, gold utility);
* ``oracle`` — MIRAGE's oracle setting: one relevant passage, for single-hop queries with a
  positive in the qrels (``prompts.oracle: all_positives``: every positive, multi-hop included);
* ``validity`` — with a ``validity`` section, each positive and sampled negative of the validity
  experiments alone, prompted as ``per_doc`` (evaluation/validity.py).

Two more conditions are scored (teacher-forced), never sampled: ConSens's evaluator template
with the context left empty (``consens_empty``) and with the passages of the ``rag`` prompt
(``consens_context``); for the validity passages also with each passage alone
(``consens_passage``); with ``consens.leave_one_out``, the context with each of its passages
left out in turn (``consens_leave_out``, ConSens §3.3 Experiment 3).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import polars as pl

from ragutil_dagster import prompts as templates
from ragutil_dagster.config import PromptConfig
from ragutil_dagster.errors import PromptTooLongError
from ragutil_dagster.metrics.mirage import oracle_passages
from ragutil_dagster.tables import PROMPT_SCHEMA

VALIDITY_CONDITION = "validity"
CONDITIONS = ("closed_book", "rag", "per_doc", "oracle", VALIDITY_CONDITION)
CONSENS_CONDITIONS = ("consens_empty", "consens_context")
CONSENS_PASSAGE = "consens_passage"
CONSENS_LEAVE_OUT = "consens_leave_out"
# LLM-specific utility's greedy-only conditions (evaluation/verbalized.py): the utility candidates
# together (the pseudo-answer), one candidate alone beyond the top k, and per verbalized method
# ``judge_<method>`` (its judgments) and ``rag_<method>`` (RAG with the passages it chose); across
# generators, ``gold_<generator>`` (with that generator's gold-utility passages).
UTILITY_PSEUDO_ANSWER = "candidates"
UTILITY_PER_CANDIDATE = "per_candidate"


def utility_judge_condition(method: str) -> str:
    return f"judge_{method}"


def utility_rag_condition(method: str) -> str:
    return f"rag_{method}"


def utility_gold_condition(generator: str) -> str:
    """The condition of an answer with ``generator``'s gold-utility passages (evaluation/transfer.py)."""
    return f"gold_{generator}"


@dataclass(frozen=True)
class PromptBudget:
    """The most tokens a prompt may have (context length minus ``max_new_tokens``), and how the
    generator counts a prompt's tokens."""

    max_tokens: int
    count_tokens: Callable[[Sequence[str]], list[int]]

    @classmethod
    def of(cls, generator: object, max_new_tokens: int) -> PromptBudget | None:
        """The budget of a generator exposing ``context_length`` and ``count_prompt_tokens``;
        None when its context is unbounded."""
        length = generator.context_length
        return (
            None if length is None else cls(length - max_new_tokens, generator.count_prompt_tokens)
        )

    def fits(self, prompt: str) -> bool:
        # Every whitespace-separated word is at least one token (BPE, WordPiece and SentencePiece
        # all split at whitespace first): far too many words is known without tokenizing.
        if len(prompt.split()) > self.max_tokens:
            return False
        return self.count_tokens([prompt])[0] <= self.max_tokens


@dataclass(frozen=True)
class FittedPrompt:
    prompt: str
    doc_ids: list[str]
    passages_dropped: int
    last_passage_chars: int | None


def _too_long(qid: str, question: str, budget: PromptBudget) -> PromptTooLongError:
    tokens = budget.count_tokens([question])[0]
    return PromptTooLongError(
        f"query {qid!r}: the question alone ({tokens} tokens) leaves no room for any passage "
        f"within the generator's prompt budget of {budget.max_tokens} tokens (context length "
        f"minus max_new_tokens); shorten the question or lower sampling.max_new_tokens"
    )


def fit_context_prompt(
    qid: str,
    question: str,
    docs: Sequence[tuple[str, str, str]],
    template: templates.Template | str,
    budget: PromptBudget | None,
) -> FittedPrompt:
    """The ``template`` prompt over ``docs`` — (doc_id, title, text) in rank order — fitted to
    ``budget``: drop passages from the end, then cut the last one's text at a word boundary."""
    return fit_passages(
        qid,
        question,
        docs,
        lambda passages: templates.with_context(question, passages, template),
        budget,
    )


def fit_passages(
    qid: str,
    question: str,
    docs: Sequence[tuple[str, str, str]],
    render_passages: Callable[[list[tuple[str, str]]], str],
    budget: PromptBudget | None,
) -> FittedPrompt:
    """The prompt ``render_passages`` makes of (title, text) passages, over ``docs`` fitted to
    ``budget`` as :func:`fit_context_prompt` fits them."""

    def render(kept: Sequence[tuple[str, str, str]], text: str | None = None) -> str:
        passages = [(title, body) for _, title, body in kept]
        if text is not None:
            passages[-1] = (passages[-1][0], text)
        return render_passages(passages)

    prompt = render(docs)
    if budget is None or budget.fits(prompt):
        return FittedPrompt(prompt, [d for d, _, _ in docs], 0, None)
    if not docs:
        raise _too_long(qid, question, budget)
    kept = list(docs)
    while len(kept) > 1:
        kept.pop()
        prompt = render(kept)
        if budget.fits(prompt):
            return FittedPrompt(prompt, [d for d, _, _ in kept], len(docs) - len(kept), None)
    text = kept[0][2]
    word_ends = [m.end() for m in re.finditer(r"\S+", text)]

    def fits(words: int) -> bool:
        return budget.fits(render(kept, text[: word_ends[words - 1]] if words else ""))

    if not fits(0):
        raise _too_long(qid, question, budget)
    # The most whole words that fit. Galloping up from 0 first: as every word is at least one
    # token, no probe is longer than twice the budget, even for a 10 MB passage.
    fitting, failing = 0, 1
    while failing <= len(word_ends) and fits(failing):
        fitting, failing = failing, 2 * failing
    failing = min(failing, len(word_ends) + 1)
    while failing - fitting > 1:
        middle = (fitting + failing) // 2
        fitting, failing = (middle, failing) if fits(middle) else (fitting, middle)
    cut = word_ends[fitting - 1] if fitting else 0
    return FittedPrompt(render(kept, text[:cut]), [kept[0][0]], len(docs) - 1, cut)


def oracle_contexts(qrels: pl.DataFrame, queries: pl.DataFrame, rule: str) -> dict[str, list[str]]:
    """The passages of each query's oracle prompt: MIRAGE's one relevant chunk of a single-hop
    query (``mirage``, :func:`~ragutil_dagster.metrics.mirage.oracle_passages`), or every
    positive of the qrels (``all_positives``). Queries without any get no oracle prompt."""
    if rule == "mirage":
        chosen = oracle_passages(qrels, queries).filter(pl.col("excluded").is_null())
        return {qid: [doc] for qid, doc in chosen.select("query_id", "doc_id").iter_rows()}
    return {
        qid: docs
        for qid, docs in qrels.filter(pl.col("relevance") > 0)
        .sort("query_id", "doc_id")
        .group_by("query_id", maintain_order=True)
        .agg(pl.col("doc_id"))
        .iter_rows()
    }


def _passages(corpus: pl.DataFrame) -> dict[str, tuple[str, str, str]]:
    return {
        doc_id: (doc_id, title or "", text)
        for doc_id, title, text in corpus.select("id", "title", "text").iter_rows()
    }


def compressed_contexts(contexts: pl.DataFrame | None) -> dict[str, tuple[list[str], list[str]]]:
    """Per query of a compressed setting's contexts (``CONTEXT_SCHEMA``, evaluation/compression.py):
    the passages it draws on and the texts its rag prompt shows; empty for an uncompressed one."""
    if contexts is None:
        return {}
    return {
        qid: (doc_ids, texts)
        for qid, doc_ids, texts in contexts.select("query_id", "doc_ids", "passages").iter_rows()
    }


def fit_compressed_prompt(
    qid: str,
    question: str,
    shown: tuple[list[str], list[str]],
    template: templates.Template | str,
    budget: PromptBudget | None,
) -> FittedPrompt:
    """The ``template`` prompt over a compressed context's texts, fitted to ``budget`` as
    :func:`fit_context_prompt` fits passages; its ``doc_ids`` are the passages the context draws on."""
    doc_ids, texts = shown
    fitted = fit_context_prompt(
        qid, question, [(str(i), "", text) for i, text in enumerate(texts)], template, budget
    )
    return FittedPrompt(
        fitted.prompt, list(doc_ids), fitted.passages_dropped, fitted.last_passage_chars
    )


def prompt_row(qid: str, condition: str, doc_id: str | None, fitted: FittedPrompt) -> dict:
    return {
        "query_id": qid,
        "condition": condition,
        "doc_id": doc_id,
        "doc_ids": fitted.doc_ids,
        "prompt": fitted.prompt,
        "passages_dropped": fitted.passages_dropped,
        "last_passage_chars": fitted.last_passage_chars,
    }


def consens_prompts(
    queries: pl.DataFrame,
    context_prompt_table: pl.DataFrame,
    corpus: pl.DataFrame,
    prompts: PromptConfig,
    budget: PromptBudget | None = None,
    leave_one_out: bool = False,
    contexts: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """ConSens §3's evaluator prompts (``prompts.consens``) of every query with a ``rag`` prompt
    in ``context_prompt_table``: ``consens_empty``, the context left empty (P_E), and
    ``consens_context``, the passages that rag prompt showed (P_C) — a compressed setting's
    compressed context (``contexts``) — fitted to ``budget`` like every context prompt; none when
    ``prompts.consens`` is null (P_C is then the rag prompt). With ``leave_one_out``, also the
    :func:`leave_out_prompts` of the P_C prompts."""
    passages = _passages(corpus)
    questions = dict(queries.select("query_id", "question").iter_rows())
    compressed = compressed_contexts(contexts)
    rows = []
    rag = context_prompt_table.filter(pl.col("condition") == "rag")
    if prompts.consens is not None:
        for qid, doc_ids in rag.select("query_id", "doc_ids").iter_rows():
            rows.append(
                prompt_row(
                    qid,
                    CONSENS_CONDITIONS[0],
                    None,
                    fit_context_prompt(qid, questions[qid], [], prompts.consens, budget),
                )
            )
            if qid in compressed:
                fitted = fit_compressed_prompt(
                    qid, questions[qid], compressed[qid], prompts.consens, budget
                )
            else:
                fitted = fit_context_prompt(
                    qid, questions[qid], [passages[d] for d in doc_ids], prompts.consens, budget
                )
            rows.append(prompt_row(qid, CONSENS_CONDITIONS[1], None, fitted))
    table = pl.DataFrame(rows, schema=PROMPT_SCHEMA)
    if not leave_one_out:
        return table
    if prompts.consens is None:
        return leave_out_prompts(queries, rag, corpus, prompts.with_context, budget)
    shown = table.filter(pl.col("condition") == CONSENS_CONDITIONS[1])
    return pl.concat([table, leave_out_prompts(queries, shown, corpus, prompts.consens, budget)])


def leave_out_prompts(
    queries: pl.DataFrame,
    context_prompt_table: pl.DataFrame,
    corpus: pl.DataFrame,
    template: templates.Template | str,
    budget: PromptBudget | None = None,
) -> pl.DataFrame:
    """ConSens §3.3 (Experiment 3): for every prompt of ``context_prompt_table`` showing two or
    more passages and each passage d it shows, the ``template`` prompt over the same passages
    without d (condition ``consens_leave_out``, ``doc_id`` = d) — a last passage cut to fit keeps
    its cut — fitted to ``budget``. A prompt showing one passage has none: without it the context
    is the empty one P_E is scored under."""
    texts = _passages(corpus)
    questions = dict(queries.select("query_id", "question").iter_rows())
    rows = []
    for qid, doc_ids, cut in context_prompt_table.select(
        "query_id", "doc_ids", "last_passage_chars"
    ).iter_rows():
        shown = [texts[d] for d in doc_ids]
        if cut is not None:
            doc_id, title, text = shown[-1]
            shown[-1] = (doc_id, title, text[:cut])
        if len(shown) < 2:
            continue
        for position, doc_id in enumerate(doc_ids):
            rest = shown[:position] + shown[position + 1 :]
            fitted = fit_context_prompt(qid, questions[qid], rest, template, budget)
            rows.append(prompt_row(qid, CONSENS_LEAVE_OUT, doc_id, fitted))
    return pl.DataFrame(rows, schema=PROMPT_SCHEMA)


def closed_book_prompts(
    queries: pl.DataFrame, prompts: PromptConfig, budget: PromptBudget | None = None
) -> pl.DataFrame:
    """One closed-book prompt per query; a question over the ``budget`` is an error."""
    texts = [templates.closed_book(q, prompts.closed_book) for q in queries["question"]]
    if budget is not None and texts:
        for qid, question, tokens in zip(
            queries["query_id"], queries["question"], budget.count_tokens(texts)
        ):
            if tokens > budget.max_tokens:
                raise _too_long(qid, question, budget)
    return pl.DataFrame(
        {
            "query_id": queries["query_id"],
            "condition": ["closed_book"] * queries.height,
            "doc_id": [None] * queries.height,
            "doc_ids": [[] for _ in range(queries.height)],
            "prompt": texts,
            "passages_dropped": [0] * queries.height,
            "last_passage_chars": [None] * queries.height,
        },
        schema=PROMPT_SCHEMA,
    )


def queries_without_passages(queries: pl.DataFrame, run: pl.DataFrame) -> list[str]:
    """The queries of ``queries`` that ``run`` shows no passage for, in query order."""
    return queries.filter(~pl.col("query_id").is_in(run["query_id"].implode()))[
        "query_id"
    ].to_list()


def context_prompts(
    queries: pl.DataFrame,
    corpus: pl.DataFrame,
    run: pl.DataFrame,
    qrels: pl.DataFrame,
    prompts: PromptConfig,
    budget: PromptBudget | None = None,
    contexts: pl.DataFrame | None = None,
    empty_retrieval: bool = False,
) -> pl.DataFrame:
    """The ``rag``, ``per_doc`` and ``oracle`` prompts of every query for ``run`` — the passages
    shown, already cut to the setting's top k (``retrieval_run``) — each fitted to ``budget``
    (see the module doc). A compressed setting's ``rag`` prompts show its compressed ``contexts``
    (``CONTEXT_SCHEMA``); ``per_doc`` and ``oracle`` show the passages as retrieved.

    A query without any passage in ``run`` is an error, unless ``empty_retrieval`` (a run file's
    ``missing_queries: empty``): its ``rag`` prompt is then its closed-book prompt — no template
    around an empty context, which would measure the template — and it has no ``per_doc`` one."""
    passages = _passages(corpus)
    compressed = compressed_contexts(contexts)
    ranked = {
        qid: docs
        for qid, docs in run.sort("query_id", "rank")
        .group_by("query_id")
        .agg(pl.col("doc_id"))
        .iter_rows()
    }
    positives = oracle_contexts(qrels, queries, prompts.oracle)
    without = queries_without_passages(queries, run)
    if without and not empty_retrieval:
        raise ValueError(f"query {without[0]!r} has no retrieved passage in the run")
    closed_book = closed_book_prompts(
        queries.filter(pl.col("query_id").is_in(without)), prompts, budget
    )
    closed_book_rag = {
        row["query_id"]: row
        for row in closed_book.with_columns(pl.lit("rag").alias("condition")).to_dicts()
    }
    rows: list[dict] = []

    def add(qid: str, condition: str, doc_id: str | None, docs: list[str], question: str) -> None:
        fitted = fit_context_prompt(
            qid, question, [passages[d] for d in docs], prompts.with_context, budget
        )
        rows.append(prompt_row(qid, condition, doc_id, fitted))

    for qid, question in queries.select("query_id", "question").iter_rows():
        docs = ranked.get(qid, [])
        if qid in closed_book_rag:
            rows.append(closed_book_rag[qid])
        elif qid in compressed:
            rows.append(
                prompt_row(
                    qid,
                    "rag",
                    None,
                    fit_compressed_prompt(
                        qid, question, compressed[qid], prompts.with_context, budget
                    ),
                )
            )
        else:
            add(qid, "rag", None, docs, question)
        for doc in docs:
            add(qid, "per_doc", doc, [doc], question)
        if qid in positives:
            add(qid, "oracle", None, positives[qid], question)
    return pl.DataFrame(rows, schema=PROMPT_SCHEMA)


def empty_retrieval_samples(
    closed_book_samples: pl.DataFrame, query_ids: Sequence[str]
) -> pl.DataFrame:
    """The ``rag`` samples of queries the retriever returned nothing for: their closed-book
    samples, relabelled. Their rag prompt is the closed-book prompt (:func:`context_prompts`), so
    these are its samples, not drawn again — SePer(q, ∅) on both sides of eq. 11: ΔSePer is
    exactly 0, and MIRAGE's mixed answer is the closed-book one."""
    return closed_book_samples.filter(pl.col("query_id").is_in(list(query_ids))).with_columns(
        pl.lit("rag").alias("condition")
    )


def validity_prompts(
    queries: pl.DataFrame,
    corpus: pl.DataFrame,
    passages: pl.DataFrame,
    prompts: PromptConfig,
    budget: PromptBudget | None = None,
) -> pl.DataFrame:
    """One ``validity`` prompt per validity passage (``passages``: ``VALIDITY_PASSAGE_SCHEMA``),
    the passage alone as a ``per_doc`` prompt shows it, fitted to ``budget``."""
    texts = _passages(corpus)
    questions = dict(queries.select("query_id", "question").iter_rows())
    rows = [
        prompt_row(
            qid,
            VALIDITY_CONDITION,
            doc,
            fit_context_prompt(qid, questions[qid], [texts[doc]], prompts.with_context, budget),
        )
        for qid, doc in passages.select("query_id", "doc_id").iter_rows()
    ]
    return pl.DataFrame(rows, schema=PROMPT_SCHEMA)


def consens_passage_prompts(
    queries: pl.DataFrame,
    alone_prompts: pl.DataFrame,
    corpus: pl.DataFrame,
    prompts: PromptConfig,
    budget: PromptBudget | None = None,
) -> pl.DataFrame:
    """ConSens §3's evaluator prompts (``prompts.consens``) for passages shown alone
    (``alone_prompts``: rows with a ``doc_id``, e.g. the validity prompts): per query the context
    left empty (``consens_empty``, P_E), and each passage as the context (``consens_passage``,
    P_C), fitted to ``budget``. No rows when ``prompts.consens`` is null."""
    if prompts.consens is None:
        return pl.DataFrame(schema=PROMPT_SCHEMA)
    texts = _passages(corpus)
    questions = dict(queries.select("query_id", "question").iter_rows())
    rows = []
    for qid, docs in (
        alone_prompts.group_by("query_id", maintain_order=True).agg("doc_id").iter_rows()
    ):
        for condition, doc, shown in (
            (CONSENS_CONDITIONS[0], None, []),
            *((CONSENS_PASSAGE, d, [d]) for d in docs),
        ):
            fitted = fit_context_prompt(
                qid, questions[qid], [texts[d] for d in shown], prompts.consens, budget
            )
            rows.append(prompt_row(qid, condition, doc, fitted))
    return pl.DataFrame(rows, schema=PROMPT_SCHEMA)
