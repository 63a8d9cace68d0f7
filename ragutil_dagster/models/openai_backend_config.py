"""The ``openai`` generator backend's entry (OpenAI-compatible completions servers): its config
models, its factories and its :class:`Backend`. Light: the factories import ``openai_backend``
when called."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ragutil_dagster.config import GeneratorConfig
from ragutil_dagster.models.backend_contract import TOKEN_SCORED_METRICS, Backend, Placement
from ragutil_dagster.models.identity import ModelRef

if TYPE_CHECKING:
    from ragutil_dagster.models.generation import Generator


class ServerConfig(BaseModel):
    """OpenAI-compatible completions servers (``backend: openai``): one server, a fleet of
    ``vllm serve`` replicas of the same model (requests spread over them, failed ones retried
    on another), or one router in front of them.

    ``served_model`` is the model name the servers serve (default: the generator's ``model``);
    ``api_key_env`` the NAME of the environment variable holding the API key; ``max_concurrency``
    the requests in flight over the whole fleet; ``max_retries`` the retries of one request
    (on other replicas first); ``reprobe_seconds`` how long a failed replica is left out before
    it is probed again."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: Annotated[list[str], Field(min_length=1)]
    served_model: str | None = None
    api_key_env: str | None = None
    max_concurrency: int = Field(default=8, ge=1)
    timeout_seconds: float = Field(default=600.0, gt=0)
    max_retries: int = Field(default=4, ge=0)
    reprobe_seconds: float = Field(default=30.0, gt=0)

    @field_validator("base_url", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("base_url")
    @classmethod
    def _each_once(cls, urls: list[str]) -> list[str]:
        stripped = [url.rstrip("/") for url in urls]
        repeated = sorted({url for url in stripped if stripped.count(url) > 1})
        if repeated:
            raise ValueError(f"lists {', '.join(repeated)} more than once")
        return urls


class OpenAIGeneratorConfig(GeneratorConfig):
    """``backend: openai``: OpenAI-compatible completions servers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server: ServerConfig


def _generator(
    config: OpenAIGeneratorConfig, local_copy: ModelRef | None, placement: Placement
) -> Generator:
    """The local copy of ``model``, when one resolves here, gives the tokenizer and the identity
    (else the servers are asked)."""
    from ragutil_dagster.models.openai_backend import OpenAIGenerator

    server = config.server
    return OpenAIGenerator(
        server.base_url,
        server.served_model or config.model,
        identity=local_copy.identity if local_copy else None,
        tokenizer=str(local_copy.path) if local_copy else None,
        use_chat_template=config.use_chat_template,
        api_key_env=server.api_key_env,
        prompt_logprob_metrics=TOKEN_SCORED_METRICS,
        max_concurrency=server.max_concurrency,
        timeout=server.timeout_seconds,
        max_retries=server.max_retries,
        reprobe_seconds=server.reprobe_seconds,
        show_progress=placement.show_progress,
    )


def _scorer(generator: Any, placement: Placement) -> Any:
    from ragutil_dagster.models.openai_backend import OpenAITokenScorer

    return OpenAITokenScorer(generator, show_progress=placement.show_progress)


BACKEND = Backend("openai", OpenAIGeneratorConfig, _generator, _scorer, needs_local_copy=False)
