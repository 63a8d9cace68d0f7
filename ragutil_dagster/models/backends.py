"""The registry of generator backends: :data:`BACKENDS` collects each backend's entry
(``backend: hf | vllm | openai``), a :class:`~backend_contract.Backend` holding the config model
of its keys, its generator factory and its token-scorer factory.

Each built-in backend declares its entry in a light module beside its implementation
(``hf_backend_config``, ``vllm_backend_config``, ``openai_backend_config``); the entry's factories
import the implementation when called, so vLLM (and its engine) loads only in processes that use
it. The model loader resource, the ``ragutil`` CLI (checking a config's generators before anything
runs), the contract tests and bench read :data:`BACKENDS`; nothing else dispatches on a backend's
name. Adding a backend: one module (config model, generator, token scorer, ``Backend``) and its
entry here (docs/architecture.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragutil_dagster.config import ExperimentConfig, GeneratorConfig
from ragutil_dagster.errors import ConfigError, ModelUnavailableError
from ragutil_dagster.models import hf_backend_config, openai_backend_config, vllm_backend_config
from ragutil_dagster.models.backend_contract import Backend, Placement
from ragutil_dagster.models.identity import ModelRef
from ragutil_dagster.models.resolver import resolve

if TYPE_CHECKING:  # the generation module imports torch
    from ragutil_dagster.models.generation import Generator

BACKENDS: dict[str, Backend] = {
    module.BACKEND.name: module.BACKEND
    for module in (hf_backend_config, vllm_backend_config, openai_backend_config)
}


def registered(spec: GeneratorConfig) -> tuple[Backend, GeneratorConfig]:
    """The backend ``spec`` names and ``spec`` as that backend's config model; a ConfigError
    when no backend has that name or the backend refuses one of the keys."""
    backend = BACKENDS.get(spec.backend)
    if backend is None:
        raise ConfigError(
            f"generator {spec.name!r}: unknown backend {spec.backend!r}; choose one of {', '.join(BACKENDS)}"
        )
    return backend, spec.typed(backend.config)


def check_generators(experiment: ExperimentConfig) -> None:
    """Every generator of ``experiment`` names a registered backend with keys it takes."""
    for spec in experiment.generators:
        registered(spec)


def local_copy(spec: GeneratorConfig, backend: Backend) -> ModelRef | None:
    """``spec``'s model resolved on this machine; None when it does not resolve and the backend
    does without a local copy."""
    try:
        return resolve(spec.model, spec.revision)
    except ModelUnavailableError:
        if backend.needs_local_copy:
            raise
        return None


def runtime_metadata(generator: Generator) -> dict[str, str]:
    """How this process runs ``generator`` (:attr:`Backend.runtime_metadata` of its backend;
    empty for a generator no backend built, e.g. the synthetic world's reader)."""
    backend = BACKENDS.get(generator.settings.get("backend", ""))
    return backend.runtime_metadata(generator) if backend else {}


def build_generator(spec: GeneratorConfig, placement: Placement) -> Generator:
    """The generator ``spec`` configures, built by its backend (no caching: the model loader
    resource keeps one per process)."""
    backend, config = registered(spec)
    return backend.generator(config, local_copy(spec, backend), placement)
