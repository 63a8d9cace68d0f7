"""Prompt templates: the built-in ones by name, after SePer App. D.5 (the FlashRAG prompts of Jin
et al., 2024), and the roles a template fills, each with the placeholders it may use.

Templates are ``str.format`` strings. ``seper_closed_book`` / ``seper_with_context`` are App.
D.5's prompts verbatim plus an ``Answer:`` cue, for instruction-tuned LLMs. ``closed_book`` /
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

A user's own template (written in the config, in a file, or a version of MLflow's prompt registry;
``config.PromptConfig``) is a :class:`Template` like a built-in one, checked against its role's
placeholders (:data:`ROLES`) before anything runs.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

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
_POINTWISE_OUTPUT = (
    "Directly output your response. The format of the output is: 'Utility judgment: Yes/No.'"
)
_LISTWISE_OPENING = (
    "I will provide you with {num} passages, each indicated by number identifier []. "
)
_REFERENCE_OFFER = "I will also give you a reference answer. "
_SELECTION_TASK = (
    "Select the passages that have utility for yourself in answering the question: {question}.\n"
)
_RANKING_TASK = "Rank the passages based on the passages' utility for yourself in answering the question: {question}.\n"
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


PROMPTS.update(
    {
        "utility_pointwise": "Question: {question}\nPassage: {passage}\n"
        + _CRITERIA
        + _POINTWISE_OUTPUT,
        "utility_pointwise_answer": (
            "Question: {question}\nPassage: {passage}\nThe reference answer: {answer}\n"
            + _CRITERIA
            + _POINTWISE_OUTPUT
        ),
        "utility_listwise": _listwise(_SELECTION_TASK, _SELECTION_OUTPUT, with_answer=False),
        "utility_listwise_answer": _listwise(_SELECTION_TASK, _SELECTION_OUTPUT, with_answer=True),
        "utility_ranking": _listwise(_RANKING_TASK, _RANKING_OUTPUT, with_answer=False),
        "utility_ranking_answer": _listwise(_RANKING_TASK, _RANKING_OUTPUT, with_answer=True),
    }
)


@dataclass(frozen=True)
class Role:
    """What a prompt role fills in: the placeholders its template must use (``required``) and may
    use (``optional``), and the built-in template it takes unless the config names another."""

    required: frozenset[str]
    default: str
    optional: frozenset[str] = frozenset()

    @property
    def placeholders(self) -> list[str]:
        return sorted(self.required | self.optional)


_QUESTION = frozenset({"question"})
_CONTEXT = frozenset({"question", "reference"})
ROLES: dict[str, Role] = {
    "closed_book": Role(_QUESTION, "closed_book"),
    "with_context": Role(_CONTEXT, "with_context"),
    "consens": Role(_CONTEXT, "consens_evaluator"),
    "compression": Role(_CONTEXT, "compress_abstractive"),
    "multistep": Role(_CONTEXT, "multistep_next_query"),
    "utility_pointwise": Role(frozenset({"question", "passage"}), "utility_pointwise"),
    "utility_pointwise_answer": Role(
        frozenset({"question", "passage", "answer"}), "utility_pointwise_answer"
    ),
    **{
        f"utility_{method}{suffix}": Role(
            frozenset({"question", "passages", *(["answer"] if suffix else [])}),
            f"utility_{method}{suffix}",
            optional=frozenset({"num"}),
        )
        for method in ("listwise", "ranking")
        for suffix in ("", "_answer")
    },
}
"""Every prompt role a config may set (``prompts.<role>``, ``generators[i].prompts.<role>``)."""


@dataclass(frozen=True)
class Template:
    """One prompt template: its ``text`` and where it came from — ``source`` is a built-in's name,
    ``inline`` (written in the config), ``file:<path>`` or a registry URI ``prompts:/<name>/<version>``
    / ``prompts:/<name>@<alias>``; ``version`` is the registry version an alias pointed to."""

    source: str
    text: str
    version: int | None = None

    @property
    def builtin(self) -> bool:
        return PROMPTS.get(self.source) == self.text

    @property
    def label(self) -> str:
        """How reports and MLflow name it: the built-in's name, the file, or the registry version."""
        if self.version is not None and "@" in self.source:
            return f"{self.source} (version {self.version})"
        return self.source


def builtin(name: str) -> Template:
    """The built-in template ``name``; an unknown name says which exist."""
    if name not in PROMPTS:
        raise KeyError(f"unknown prompt {name!r}; known prompts: {', '.join(sorted(PROMPTS))}")
    return Template(name, PROMPTS[name])


def placeholders(text: str) -> set[str]:
    """The ``{field}`` names of a ``str.format`` template; a malformed one, or a field with an
    attribute, index or format spec (a template fills plain text only), is a ValueError."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as err:
        raise ValueError(
            f"not a valid template ({err}; write a literal brace as {{{{ or }}}})"
        ) from None
    fields = set()
    for _literal, field, spec, conversion in parsed:
        if field is None:
            continue
        if not field.isidentifier() or spec or conversion:
            raise ValueError(
                f"placeholder {{{field}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}} "
                "is not a plain name; write a literal brace as {{ or }}"
            )
        fields.add(field)
    return fields


def check_role(role: str, text: str) -> None:
    """A ValueError naming the placeholders ``role`` allows when ``text`` uses another or lacks
    one the role needs."""
    spec = ROLES[role]
    used = placeholders(text)
    allowed = ", ".join(f"{{{name}}}" for name in spec.placeholders)
    if unknown := sorted(used - spec.required - spec.optional):
        raise ValueError(
            f"the template uses {', '.join(f'{{{n}}}' for n in unknown)}, which role {role} does not "
            f"fill; its placeholders: {allowed}"
        )
    if missing := sorted(spec.required - used):
        raise ValueError(
            f"the template lacks {', '.join(f'{{{n}}}' for n in missing)}, which role {role} needs; "
            f"its placeholders: {allowed}"
        )


def format_numbered(passages: Sequence[tuple[str, str]]) -> str:
    """The ``{passages}`` block of a listwise judgment: one ``[i] text`` line per (title, text)
    passage, numbered from 1 as the judgment names them (the title left out, as in
    :func:`format_reference`)."""
    return "\n".join(f"[{i}] {text}" for i, (_title, text) in enumerate(passages, start=1))


def utility_judgment(
    method: str,
    question: str,
    passages: Sequence[tuple[str, str]],
    answer: str,
    template: Template | None = None,
) -> str:
    """The verbalized utility judgment prompt of ``method`` (``template``, by default the built-in
    ``utility_<method>``) over (title, text) passages — the one passage of a pointwise judgment,
    the numbered list of a listwise one — with the pseudo-answer ``answer`` (unused by the direct
    methods)."""
    return render(
        template or f"utility_{method}",
        question=question,
        passage="\n".join(text for _title, text in passages),
        num=str(len(passages)),
        passages=format_numbered(passages),
        answer=answer,
    )


def format_reference(passages: Sequence[tuple[str, str]]) -> str:
    """The ``{reference}`` block: one ``Doc i: text`` line per (title, text) passage.

    The title is left out: every synthetic passage opens with its entity's name, and FlashRAG's
    ``(Title: t)`` would add tokens the small reader must learn to skip.
    """
    return "\n".join(f"Doc {i}: {text}" for i, (_title, text) in enumerate(passages, start=1))


def render(template: Template | str, **fields: str) -> str:
    """Fill ``template`` (a :class:`Template`, or a built-in's name) with ``fields``."""
    if isinstance(template, str):
        template = builtin(template)
    try:
        return template.text.format(**fields)
    except KeyError as err:
        raise KeyError(f"prompt {template.label!r} needs the field {err.args[0]!r}") from None


def closed_book(question: str, template: Template | str = "closed_book") -> str:
    """The closed-book prompt ``template`` for ``question``."""
    return render(template, question=question)


def with_context(
    question: str, passages: Sequence[tuple[str, str]], template: Template | str = "with_context"
) -> str:
    """The retrieval-augmented prompt ``template`` for ``question`` over (title, text) ``passages``."""
    return render(template, question=question, reference=format_reference(passages))
