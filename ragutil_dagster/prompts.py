"""Prompt templates by name, after SePer App. D.5 (the FlashRAG prompts of Jin et al., 2024).

Templates are ``str.format`` strings with the fields ``{question}`` and ``{reference}``; the
experiment config names them. ``seper_closed_book`` / ``seper_with_context`` are App. D.5's
prompts verbatim plus an ``Answer:`` cue, for instruction-tuned LLMs. ``closed_book`` /
``with_context`` keep their structure (question, documents, answer cue) without the instruction
sentences: the project's small CPU-trained reader learns the task from the format, and every
prompt token costs training time on CPU.
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
    "seper_with_context": (
        "Answer the question based on the given document. Only give me the answer and do not "
        "output any other words. The following are given documents.\n{reference}\n"
        "Question: {question}\nAnswer:"
    ),
}


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
