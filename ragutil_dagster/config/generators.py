"""The ``generators`` section: a generator, the backend-neutral part every backend shares. Each
backend's own keys are declared by its config model, beside the backend in ``models/`` (e.g.
``models/vllm_backend_config.py``), and checked by :meth:`GeneratorConfig.typed`."""

from __future__ import annotations

import typing

from pydantic import ConfigDict, ValidationError

from ragutil_dagster.config.base import ModelConfig, Slug
from ragutil_dagster.config.prompts import PromptOverrides
from ragutil_dagster.errors import ConfigError


class GeneratorConfig(ModelConfig):
    """A generator: the model, the backend that runs it and how prompts are formatted.

    ``backend`` names an entry of the backend registry (models/backends.py). Every other key is
    the backend's own: its config model, a subclass of this class in the backend's module
    (``models/<name>_backend_config.py``), declares and validates them (``hf``: ``dtype``;
    ``vllm``: ``engine``; ``openai``: ``server``). ``model`` names the weights (any form the
    resolver takes); with ``backend: openai`` it is the local copy giving the tokenizer and the
    identity, or, when none resolves here, the served name."""

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
