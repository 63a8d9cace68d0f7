"""What every config section is built from: the slug a name must be (names become parts of
partition keys), a model name, the strict base model refusing unknown keys, and ``ModelConfig``
(a model by name and revision)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

# Names join into partition keys with KEY_SEPARATOR ("__"), so a name never contains it.
SLUG = r"^[a-z0-9]+(?:[-_][a-z0-9]+)*$"
Slug = Annotated[str, Field(pattern=SLUG, max_length=40)]


def _nonblank_model_name(name: str) -> str:
    if not name.strip():
        raise ValueError(
            "empty model name; give a Hugging Face id, a local directory, embedded:<name> "
            "or models:/<name>/<version>"
        )
    return name


ModelName = Annotated[str, AfterValidator(_nonblank_model_name)]


class _Strict(BaseModel):
    # Unknown keys are errors: a typo ("temprature") must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
    """A model named by HF id, local directory, or ``embedded:<name>`` for the project's own."""

    model: ModelName
    revision: str | None = None
    trust_remote_code: bool = False
