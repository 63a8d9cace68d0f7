"""Prompt templates by name, after SePer App. D.5 (the FlashRAG prompts of Jin et al., 2024).

Templates are ``str.format`` strings with the fields ``{question}`` and ``{reference}``; the
experiment config names them. ``seper_closed_book`` / ``seper_with_context`` are App. D.5's
prompts verbatim plus an ``Answer:`` cue, for instruction-tuned LLMs. ``closed_book`` /
``with_context`` keep their structure (question, documents, answer cue) without the instruction
sentences: the project's small CPU-trained reader learns the task from the format, and every
prompt token costs training time on CPU.

``utility_<method>`` are the verbalized utility judgments of LLM-specific utility (Zhang et al.,
2025, App. A, Figs. 5–6) for every method of ``metrics.utility.VERBALIZED_METHODS``: the figures
show the prompts with the pseudo-answer (``_answer``); the direct ones leave out the sentences
naming the reference answer. The listwise prompts are a conversation in the paper (the user sends
each passage, the assistant acknowledges it); here they are one prompt holding the user's turns in
order — a chat template wraps it as one user turn — with fields ``{num}`` (passages shown),
``{passages}`` (:func:`format_numbered`) and ``{answer}`` (the pseudo-answer).
"""

from __future__ import annotations

from collections.abc import Sequence

PROMPTS: dict[str, str] = {
    "closed_book": "Question: {question}\nAnswer:",
    "with_context": "Documents:\n{reference}\nQuestion: {question}\nAnswer:",
    "seper_closed_book": (
        "Answer the question based on your own knowledge. Only give me the answer and do not "
        "output any other words.\nQuestion: {question}\nAnswer:"
    ),
    # ConSens §3: the evaluator template, scored with the context empty (P_E) and given (P_C).
    "consens_evaluator": (
        "Consider the following context:\nContext:\n{reference}\nPlease answer the following "
        "question:\n{question}\nAnswer:"
    ),
    # Abstractive context compression (SePer §5.4, RQ3): the generator's greedy, query-focused
    # summary of the passages replaces them in the rag prompt (evaluation/compression.py).
    "compress_abstractive": (
        "Documents:\n{reference}\nSummarize the documents in a few sentences, keeping every fact "
        "needed to answer the question: {question}\nSummary:"
    ),
    # Multi-step RAG, IRCoT-style (Trivedi et al., 2023; SePer App. C.2): the query writer's greedy
    # next query or thought over the passages gathered so far (evaluation/multistep.py).
    "multistep_next_query": (
        "Documents:\n{reference}\nQuestion: {question}\nWhat else should be looked up to answer the "
        "question?\nNext query:"
    ),
    "seper_with_context": (
        "Answer the question based on the given document. Only give me the answer and do not "
        "output any other words. The following are given documents.\n{reference}\n"
        "Question: {question}\nAnswer:"
    ),
}


# Figs. 5–6: the definition of utility every judgment prompt states, and each output format.
_CRITERIA = (
    "Determine if the passage has utility based on two strict criteria:\n"
    "1. Usefulness: The passage should not only be relevant to the question but also be useful in "
    "generating a correct, reasonable, and perfect answer to the question.\n"
    "2. Novelty: Is the useful information new to you? This means it must NOT be part of your "
    "pre-existing knowledge.\n"
)
_POINTWISE_OUTPUT = "Directly output your response. The format of the output is: 'Utility judgment: Yes/No.'"
_LISTWISE_OPENING = "I will provide you with {num} passages, each indicated by number identifier []. "
_REFERENCE_OFFER = "I will also give you a reference answer. "
_SELECTION_TASK = "Select the passages that have utility for yourself in answering the question: {question}.\n"
_RANKING_TASK = (
    "Rank the passages based on the passages' utility for yourself in answering the question: {question}.\n"
)
_SELECTION_OUTPUT = (
    "Directly output the passages you selected that have utility for yourself in answering the "
    "question. The format of the output is: 'My selection:[[i],[j],...].'. Only response the "
    "selection results, do not say any word or explain."
)
_RANKING_OUTPUT = (
    "Directly output the ranked the passages in descending order of utility for yourself in "
    "answering the question. The format of the output is: '[i]>[j]>...'. Only response the ranked "
    "results, do not say any word or explain."
)


def _listwise(task: str, output: str, with_answer: bool) -> str:
    reference = "Reference answer: {answer}\n" if with_answer else ""
    return (
        _LISTWISE_OPENING + (_REFERENCE_OFFER if with_answer else "") + task + "{passages}\n"
        "Question: {question}.\n" + reference + _CRITERIA + output
    )


PROMPTS.update({
    "utility_pointwise": "Question: {question}\nPassage: {passage}\n" + _CRITERIA + _POINTWISE_OUTPUT,
    "utility_pointwise_answer": (
        "Question: {question}\nPassage: {passage}\nThe reference answer: {answer}\n" + _CRITERIA + _POINTWISE_OUTPUT
    ),
    "utility_listwise": _listwise(_SELECTION_TASK, _SELECTION_OUTPUT, with_answer=False),
    "utility_listwise_answer": _listwise(_SELECTION_TASK, _SELECTION_OUTPUT, with_answer=True),
    "utility_ranking": _listwise(_RANKING_TASK, _RANKING_OUTPUT, with_answer=False),
    "utility_ranking_answer": _listwise(_RANKING_TASK, _RANKING_OUTPUT, with_answer=True),
})


def format_numbered(passages: Sequence[tuple[str, str]]) -> str:
    """The ``{passages}`` block of a listwise judgment: one ``[i] text`` line per (title, text)
    passage, numbered from 1 as the judgment names them (the title left out, as in
    :func:`format_reference`)."""
    return "\n".join(f"[{i}] {text}" for i, (_title, text) in enumerate(passages, start=1))


def utility_judgment(method: str, question: str, passages: Sequence[tuple[str, str]], answer: str) -> str:
    """The verbalized utility judgment prompt of ``method`` (``utility_<method>``) over (title,
    text) passages — the one passage of a pointwise judgment, the numbered list of a listwise
    one — with the pseudo-answer ``answer`` (unused by the direct methods)."""
    return render(
        f"utility_{method}", question=question, passage="\n".join(text for _title, text in passages),
        num=str(len(passages)), passages=format_numbered(passages), answer=answer,
    )


def format_reference(passages: Sequence[tuple[str, str]]) -> str:
    """The ``{reference}`` block: one ``Doc i: text`` line per (title, text) passage.

    The title is left out: every synthetic passage opens with its entity's name, and FlashRAG's
    ``(Title: t)`` would add tokens the small reader must learn to skip.
    """
    return "\n".join(f"Doc {i}: {text}" for i, (_title, text) in enumerate(passages, start=1))


def render(name: str, **fields: str) -> str:
    """Fill the template ``name`` with ``fields``; unknown names and missing fields say which."""
    try:
        template = PROMPTS[name]
    except KeyError:
        raise KeyError(f"unknown prompt {name!r}; known prompts: {sorted(PROMPTS)}") from None
    try:
        return template.format(**fields)
    except KeyError as err:
        raise KeyError(f"prompt {name!r} needs the field {err.args[0]!r}") from None


def closed_book(question: str, name: str = "closed_book") -> str:
    """The closed-book prompt ``name`` for ``question``."""
    return render(name, question=question)


def with_context(question: str, passages: Sequence[tuple[str, str]],
                 name: str = "with_context") -> str:
    """The retrieval-augmented prompt ``name`` for ``question`` over (title, text) ``passages``."""
    return render(name, question=question, reference=format_reference(passages))
