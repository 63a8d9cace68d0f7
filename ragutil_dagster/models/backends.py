"""The registry of generator backends: the one place a backend (``backend: hf | vllm | openai``)
is named, with the config model of its keys, its generator factory and its token-scorer factory.

The model loader resource, the ``ragutil`` CLI (checking a config's generators before anything
runs), the contract tests and bench read :data:`BACKENDS`; nothing else dispatches on a backend's
name. A factory imports its backend when called, so vLLM (and its engine) loads only in processes
that use it. Adding a backend: its module (generator, token scorer, config model) and one
:class:`Backend` in :data:`BACKENDS` (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ragutil_dagster.config import (
    ExperimentConfig,
    GeneratorConfig,
    HFGeneratorConfig,
    OpenAIGeneratorConfig,
    VLLMGeneratorConfig,
)
from ragutil_dagster.errors import ConfigError, ModelUnavailableError
from ragutil_dagster.models.identity import ModelRef
from ragutil_dagster.models.resolver import resolve

if TYPE_CHECKING:  # the generation module imports torch; a factory imports it when called
    from ragutil_dagster.models.generation import Generator

# Metrics the generations asset computes from teacher-forced log-probs of the generator (a
# server backend checks at start that it can give them).
TOKEN_SCORED_METRICS = ("consens", "utility_likelihood")


@dataclass(frozen=True)
class Placement:
    """How the model loader resource runs a backend: ``device`` (None: CUDA when present), sequences
    per decoding batch, and whether the backend shows its own progress bars."""

    device: str | None
    batch_rows: int
    show_progress: bool


@dataclass(frozen=True)
class Backend:
    """A generator backend as the registry knows it.

    ``config``: the subclass of :class:`GeneratorConfig` declaring the backend's own keys;
    ``generator(config, local_copy, placement)``: the :class:`Generator`, where ``local_copy`` is
    the configured model resolved on this machine (None only when ``needs_local_copy`` is False:
    a server can run a model this machine has no copy of); ``scorer(generator, placement)``: the
    token scorer on that generator's own weights and prompt formatting (``score``,
    ``score_ids``, ``supports_attention``), never a second copy of the model;
    ``runtime_metadata(generator)``: how this process runs it (e.g. a CPU engine's threads and
    cores), as text metadata for the generations asset."""

    name: str
    config: type[GeneratorConfig]
    generator: Callable[[Any, ModelRef | None, Placement], Generator]
    scorer: Callable[[Any, Placement], Any]
    needs_local_copy: bool = True
    runtime_metadata: Callable[[Any], dict[str, str]] = lambda _generator: {}


def _hf_generator(
    config: HFGeneratorConfig, local_copy: ModelRef, placement: Placement
) -> Generator:
    from ragutil_dagster.models.hf_backend import HFGenerator

    return HFGenerator(
        local_copy,
        device=placement.device,
        dtype=config.dtype,
        use_chat_template=config.use_chat_template,
        trust_remote_code=config.trust_remote_code,
        max_batch_rows=placement.batch_rows,
        show_progress=placement.show_progress,
    )


def _hf_scorer(generator: Any, placement: Placement) -> Any:
    from ragutil_dagster.models.token_scoring import TokenScorer

    return TokenScorer(generator.lm, show_progress=placement.show_progress)


def _vllm_generator(
    config: VLLMGeneratorConfig, local_copy: ModelRef, placement: Placement
) -> Generator:
    from ragutil_dagster.models.vllm_backend import VLLMGenerator

    return VLLMGenerator(
        local_copy,
        use_chat_template=config.use_chat_template,
        trust_remote_code=config.trust_remote_code,
        show_progress=placement.show_progress,
        **config.engine.model_dump(),
    )


def _vllm_scorer(generator: Any, placement: Placement) -> Any:
    from ragutil_dagster.models.vllm_backend import VLLMTokenScorer

    return VLLMTokenScorer(generator, show_progress=placement.show_progress)


def _vllm_runtime_metadata(_generator: Any) -> dict[str, str]:
    from ragutil_dagster.models.vllm_backend import engine_placement

    return engine_placement()


def _openai_generator(
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


def _openai_scorer(generator: Any, placement: Placement) -> Any:
    from ragutil_dagster.models.openai_backend import OpenAITokenScorer

    return OpenAITokenScorer(generator, show_progress=placement.show_progress)


BACKENDS: dict[str, Backend] = {
    backend.name: backend
    for backend in (
        Backend("hf", HFGeneratorConfig, _hf_generator, _hf_scorer),
        Backend(
            "vllm",
            VLLMGeneratorConfig,
            _vllm_generator,
            _vllm_scorer,
            runtime_metadata=_vllm_runtime_metadata,
        ),
        Backend(
            "openai",
            OpenAIGeneratorConfig,
            _openai_generator,
            _openai_scorer,
            needs_local_copy=False,
        ),
    )
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
