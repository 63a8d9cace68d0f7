"""Prompt templates from MLflow's prompt registry: ``prompts:/<name>/<version>`` or
``prompts:/<name>@<alias>``.

A registered prompt is written in MLflow's ``{{ placeholder }}`` syntax; ragutil's templates are
``str.format`` strings. :func:`registered_template` maps one to the other using the variables
MLflow itself finds in the template (``PromptVersion.variables``): each ``{{ variable }}`` becomes
``{variable}``, and every other brace is doubled so ``str.format`` keeps it as text. An alias is
resolved to the version it points to at the time of the call; the model-identity sensor asks again
(``automation.py``), so moving an alias re-evaluates what depends on the prompt.

The registry is reached by its tracking URI alone (``MLFLOW_TRACKING_URI``, else the home's
embedded store), as registered models are (``models/mlflow_registry.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ragutil_dagster.errors import ModelRegistryError
from ragutil_dagster.infra.databases import (
    MLFLOW_TRACKING_URI_VARIABLE,
    check_reachable,
    default_tracking_uri,
)
from ragutil_dagster.infra.redaction import redact, redact_uri

PREFIX = "prompts:/"
_URI = re.compile(r"^prompts:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[\w-]+))$")


@dataclass(frozen=True)
class RegisteredTemplate:
    """A registry version as a ``str.format`` template."""

    text: str
    version: int


def registry_not_found(err: Exception, *, alias: bool) -> bool:
    """Whether an MLflow registry error says the name or version does not exist (MLflow reports
    an unknown alias of a known name as an invalid parameter, not as a missing resource)."""
    code = getattr(err, "error_code", None)
    return code == "RESOURCE_DOES_NOT_EXIST" or (
        alias and code == "INVALID_PARAMETER_VALUE" and "alias" in str(err)
    )


def registered_template(uri: str, tracking_uri: str | None = None) -> RegisteredTemplate:
    """The text prompt ``uri`` names, in ``str.format`` syntax, with the version it resolved to.

    A malformed URI, a name / version / alias the registry lacks and a chat prompt (a list of
    messages, which a completion prompt cannot be) are each one :class:`ModelRegistryError`.
    """
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    match = _URI.match(uri)
    if match is None:
        raise ModelRegistryError(
            f"prompt {uri!r}: expected prompts:/<name>/<version> or prompts:/<name>@<alias>"
        )
    tracking_uri = tracking_uri or default_tracking_uri()
    # MLflow would retry an unreachable database with backoff for close to an hour.
    check_reachable(
        tracking_uri, "the MLflow prompt registry's database", MLFLOW_TRACKING_URI_VARIABLE
    )
    try:
        # No cache: an alias is asked anew each time, so a moved alias is seen at once.
        prompt = MlflowClient(tracking_uri=tracking_uri).load_prompt(uri, cache_ttl_seconds=0)
    except MlflowException as err:
        registry = redact_uri(tracking_uri)
        first_line = redact(str(err).splitlines()[0])
        if registry_not_found(err, alias=match["alias"] is not None):
            raise ModelRegistryError(
                f"prompt {uri!r} is not in the MLflow prompt registry at {registry} ({first_line}); "
                "register it there (mlflow.genai.register_prompt) or set MLFLOW_TRACKING_URI to the "
                "registry that has it"
            ) from None
        raise ModelRegistryError(
            f"prompt {uri!r}: the MLflow registry at {registry} could not be asked "
            f"({err.error_code}: {first_line}); check that it is reachable and that its "
            "credentials are accepted"
        ) from None
    if not prompt.is_text_prompt:
        raise ModelRegistryError(
            f"prompt {uri!r} (version {prompt.version}) is a chat prompt (a list of messages); ragutil "
            "fills completion prompts: register the template as text (a generator's use_chat_template "
            "wraps it in the model's chat template)"
        )
    return RegisteredTemplate(
        format_syntax(prompt.template, set(prompt.variables)), int(prompt.version)
    )


def format_syntax(template: str, variables: set[str]) -> str:
    """MLflow's ``{{ variable }}`` template as a ``str.format`` one: the variables single-braced,
    every other brace doubled."""
    if not variables:
        return template.replace("{", "{{").replace("}", "}}")
    pattern = re.compile(
        r"\{\{\s*(" + "|".join(re.escape(v) for v in sorted(variables)) + r")\s*\}\}"
    )
    parts = pattern.split(template)
    # re.split with one group alternates text, variable, text, ...
    return "".join(
        "{" + part + "}" if position % 2 else part.replace("{", "{{").replace("}", "}}")
        for position, part in enumerate(parts)
    )
