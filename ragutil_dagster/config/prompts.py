"""The ``prompts`` section: every role's template (built-in, inline, ``file:`` or prompt registry),
checked against the role's placeholders, and a generator's own overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, ConfigDict, PlainSerializer, ValidationInfo

from ragutil_dagster.config.base import _Strict
from ragutil_dagster.errors import ModelRegistryError
from ragutil_dagster.infra.files import user_path
from ragutil_dagster.infra.prompt_registry import PREFIX as REGISTRY_PREFIX
from ragutil_dagster.infra.prompt_registry import registered_template
from ragutil_dagster.prompts import PROMPTS, ROLES, Template, builtin, check_role

FILE_PREFIX = "file:"
INLINE_SOURCE = "inline"


def _template(value: object, info: ValidationInfo) -> Template:
    """A prompt role's value as a :class:`~ragutil_dagster.prompts.Template`, checked against the
    role's placeholders: a built-in's name, an inline template, ``file:<path>`` (relative to the
    config file's folder) or a prompt-registry URI; or an already resolved template (a dump's
    ``{source, text[, version]}``, which is never read again)."""
    role = info.field_name
    if isinstance(value, Template):
        template = value
    elif isinstance(value, dict):
        unknown = sorted(set(value) - {"source", "text", "version"})
        if (
            unknown
            or not isinstance(value.get("source"), str)
            or not isinstance(value.get("text"), str)
        ):
            raise ValueError(
                "a template is a built-in's name, the template text itself, file:<path> or "
                "prompts:/<name>/<version>; a mapping must be {source, text[, version]}"
            )
        template = Template(value["source"], value["text"], value.get("version"))
    elif isinstance(value, str):
        template = _template_of(value, (info.context or {}).get("config_dir"))
    else:
        raise ValueError(f"a template is text, got {type(value).__name__}")
    check_role(role, template.text)
    return template


def _template_of(spec: str, config_dir: Path | None) -> Template:
    if spec in PROMPTS:
        return builtin(spec)
    if spec.startswith(FILE_PREFIX):
        path = user_path(spec.removeprefix(FILE_PREFIX))
        if not path.is_absolute() and config_dir is not None:
            path = Path(config_dir) / path
        try:
            # One final newline is the file's end, not the prompt's: editors add it, and a prompt
            # ending in a newline would make the answer's first token a stop string.
            return Template(spec, path.read_text(encoding="utf-8").removesuffix("\n"))
        except FileNotFoundError:
            raise ValueError(f"{spec}: no such file ({path})") from None
        except UnicodeDecodeError as err:
            raise ValueError(f"{spec}: not UTF-8 text ({err.reason} at byte {err.start})") from None
        except OSError as err:
            raise ValueError(f"{spec}: cannot be read ({err.strerror})") from None
    if spec.startswith(REGISTRY_PREFIX):
        try:
            registered = registered_template(spec)
        except ModelRegistryError as err:
            raise ValueError(str(err)) from None
        return Template(spec, registered.text, registered.version)
    if "{" in spec:
        return Template(INLINE_SOURCE, spec)
    raise ValueError(
        f"unknown prompt {spec!r}: name a built-in template ({', '.join(sorted(PROMPTS))}), write the "
        f"template itself with its placeholders, or give {FILE_PREFIX}<path> or "
        f"{REGISTRY_PREFIX}<name>/<version> ({REGISTRY_PREFIX}<name>@<alias>)"
    )


def _dump_template(template: Template) -> str | dict:
    """A built-in as its name (the config's fingerprint is what it was before user templates), any
    other template with its text, so that a changed text is a new fingerprint."""
    if template.builtin:
        return template.source
    dumped: dict = {"source": template.source, "text": template.text}
    if template.version is not None:
        dumped["version"] = template.version
    return dumped


TemplateField = Annotated[Template, BeforeValidator(_template), PlainSerializer(_dump_template)]


class PromptOverrides(_Strict):
    """A generator's own templates (``generators[i].prompts``): each role given here replaces the
    experiment's ``prompts.<role>`` for that generator only — a base model's few-shot prompts
    beside an instruct model's chat prompts. Values as in :class:`PromptConfig`. Every role but
    ``multistep``: the query writer's rounds belong to a setting, shared by every generator, so
    its prompt is the experiment's."""

    closed_book: TemplateField | None = None
    with_context: TemplateField | None = None
    consens: TemplateField | None = None
    compression: TemplateField | None = None
    utility_pointwise: TemplateField | None = None
    utility_pointwise_answer: TemplateField | None = None
    utility_listwise: TemplateField | None = None
    utility_listwise_answer: TemplateField | None = None
    utility_ranking: TemplateField | None = None
    utility_ranking_answer: TemplateField | None = None


class PromptConfig(PromptOverrides):
    """The prompt template of every role (``prompts.ROLES``: closed book, with context, the ConSens
    evaluator, the abstractive compressor, the multi-step query writer and each verbalized utility
    judgment). A value is a built-in template's name (``prompts.PROMPTS``), the template text
    itself (a ``str.format`` string using the role's placeholders), ``file:<path>`` (a text file;
    a relative path is read from the config file's folder) or a version of MLflow's prompt
    registry, ``prompts:/<name>/<version>`` or ``prompts:/<name>@<alias>`` (its ``{{ x }}``
    placeholders become ``{x}``). A role left out takes its built-in default
    (:meth:`template`). ``consens`` is the evaluator template ConSens scores the pseudo-answer
    under (§3: the context left empty for P_E, the rag passages for P_C); null scores it under
    the generation prompts instead (closed book and rag — ragutil's earlier rule). ``oracle``
    chooses the passages of the oracle condition: ``mirage`` — MIRAGE's oracle, one relevant
    chunk, single-hop questions only (§4.1); ``all_positives`` — every positive of the qrels,
    multi-hop questions included (ragutil's earlier rule)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    closed_book: TemplateField = "closed_book"
    with_context: TemplateField = "with_context"
    consens: TemplateField | None = "consens_evaluator"
    multistep: TemplateField | None = None
    oracle: Literal["mirage", "all_positives"] = "mirage"

    def template(self, role: str) -> Template:
        """The template of ``role``: the one configured, else the role's built-in default
        (``consens`` null is the caller's rule, not a template: asked for, it is an error)."""
        value = getattr(self, role)
        if value is None and role == "consens":
            raise ValueError("prompts.consens is null: ConSens scores under the generation prompts")
        return value if value is not None else builtin(ROLES[role].default)

    def overridden(self, overrides: PromptOverrides | None) -> PromptConfig:
        """These prompts with a generator's ``overrides`` in place of the roles it sets."""
        if overrides is None:
            return self
        return self.model_copy(
            update={
                role: value
                for role in PromptOverrides.model_fields
                if (value := getattr(overrides, role)) is not None
            }
        )

    def labels(self) -> dict[str, str]:
        """Each role set away from its built-in default → its template's label (source)."""
        return {
            role: self.template(role).label
            for role in ROLES
            if getattr(self, role) is not None and getattr(self, role).source != ROLES[role].default
        }
