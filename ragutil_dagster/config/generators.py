"""The ``generators`` section: a generator, the backend-neutral part every backend shares, and the
built-in backends' config models (hf, vllm with its engine, openai with its servers)."""

from __future__ import annotations

import typing
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator

from ragutil_dagster.config.base import ModelConfig, Slug, _Strict
from ragutil_dagster.config.prompts import PromptOverrides
from ragutil_dagster.errors import ConfigError


class EngineConfig(_Strict):
    """vLLM engine settings (``backend: vllm``); one engine per process serves every partition."""

    dtype: str = "auto"
    max_model_len: int | None = Field(default=None, ge=16)
    gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1)
    tensor_parallel_size: int = Field(default=1, ge=1)
    enable_prefix_caching: bool = True
    kv_cache_space_gib: float | None = Field(default=None, gt=0)
    enforce_eager: bool = False


class ServerConfig(_Strict):
    """OpenAI-compatible completions servers (``backend: openai``): one server, a fleet of
    ``vllm serve`` replicas of the same model (requests spread over them, failed ones retried
    on another), or one router in front of them.

    ``served_model`` is the model name the servers serve (default: the generator's ``model``);
    ``api_key_env`` the NAME of the environment variable holding the API key; ``max_concurrency``
    the requests in flight over the whole fleet; ``max_retries`` the retries of one request
    (on other replicas first); ``reprobe_seconds`` how long a failed replica is left out before
    it is probed again."""

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


class GeneratorConfig(ModelConfig):
    """A generator: the model, the backend that runs it and how prompts are formatted.

    ``backend`` names an entry of the backend registry (models/backends.py). Every other key is
    the backend's own: its registered config model, a subclass of this class, declares and
    validates them (``hf``: ``dtype``; ``vllm``: ``engine``; ``openai``: ``server``). ``model``
    names the weights (any form the resolver takes); with ``backend: openai`` it is the local copy
    giving the tokenizer and the identity, or, when none resolves here, the served name."""

    # The backend's keys pass through here; its config model refuses the unknown ones.
    model_config = ConfigDict(extra="allow", frozen=True)

    name: Slug
    backend: Slug = "hf"
    use_chat_template: bool = False
    # This generator's own templates for the roles it names (PromptOverrides); None keeps the
    # fingerprint of a generator without them.
    prompts: PromptOverrides | None = None

    def typed(self, config_model: type[GeneratorConfigT]) -> GeneratorConfigT:
        """This generator as its backend's ``config_model``; a ConfigError lists every key or
        value the backend refuses."""
        try:
            return config_model.model_validate(self.model_dump())
        except ValidationError as err:
            own = sorted(set(config_model.model_fields) - set(GeneratorConfig.model_fields))
            problems = [
                f"{'.'.join(str(part) for part in item['loc'])}: "
                + (
                    f"not a key of backend {self.backend} (its own keys: {', '.join(own) or 'none'})"
                    if item["type"] == "extra_forbidden"
                    else item["msg"].removeprefix("Value error, ")
                )
                for item in err.errors()
            ]
            raise ConfigError(f"generator {self.name!r}: " + "; ".join(problems)) from None


GeneratorConfigT = typing.TypeVar("GeneratorConfigT", bound=GeneratorConfig)


class HFGeneratorConfig(GeneratorConfig):
    """``backend: hf``: transformers in this process. ``dtype``: the weights' (``auto``:
    models/device.default_causal_lm_dtype)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"


class VLLMGeneratorConfig(GeneratorConfig):
    """``backend: vllm``: the vLLM engine in this process (its dtype is ``engine.dtype``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: EngineConfig = EngineConfig()


class OpenAIGeneratorConfig(GeneratorConfig):
    """``backend: openai``: OpenAI-compatible completions servers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server: ServerConfig
