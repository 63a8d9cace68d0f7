"""The model registry: loads each configured model once per process and hands it to assets.

Models are named as in the experiment config (HF id, local directory, or ``embedded:<name>``).
Loading is memoised per process on everything that changes the loaded object, so the partitions
a worker materialises share one copy of each model's weights.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from dagster import ConfigurableResource

from ragutil_dagster.config import GeneratorConfig, NliConfig
from ragutil_dagster.models.resolver import LEXICAL_NLI, LEXICAL_NLI_IDENTITY, resolve

_loaded: dict[tuple, Any] = {}
# Metrics the generations asset computes from teacher-forced log-probs of the generator.
TOKEN_SCORED_METRICS = ("consens", "utility_likelihood")
_lock = threading.Lock()


def _memo(key: tuple, load) -> Any:
    with _lock:
        if key not in _loaded:
            _loaded[key] = load()
        return _loaded[key]


class ModelRegistry(ConfigurableResource):
    """Device / precision choices and caches for every model the assets use.

    ``device``: ``cuda``, ``cpu`` or empty for automatic (CUDA when present);
    ``nli_cache``: SQLite file caching NLI probabilities per (model identity, pair);
    ``generation_cache``: the content-addressed generation cache (same model identity, prompt,
    sampling parameters, n and seed are never sampled twice): a directory holding its SQLite file
    or a database URL (``$RAGUTIL_GENERATION_CACHE_URL``). Empty: no cache.
    ``checkpoint_prompts``: prompts sampled between two writes to the generation cache (the most
    a killed worker re-samples); ``generation_batch_rows``: sequences per HF decoding batch.
    """

    device: str = ""
    nli_cache: str = ""
    generation_cache: str = ""
    generation_batch_rows: int = 256
    checkpoint_prompts: int = 64
    show_progress: bool = True

    def _device(self) -> str | None:
        return self.device or None

    def identity(self, model: str, revision: str | None = None) -> str:
        """The current identity of a configured model (hub commit or directory fingerprint)."""
        if model == LEXICAL_NLI:
            return LEXICAL_NLI_IDENTITY
        return resolve(model, revision).identity

    def generator(self, spec: GeneratorConfig):
        """The configured generator, behind the generation cache when one is configured."""
        from ragutil_dagster.models.cache import CachedGenerator, GenerationCache

        backend = self._backend(spec)
        if not self.generation_cache:
            return backend
        return _memo(
            ("cached", id(backend), self.generation_cache, self.checkpoint_prompts),
            lambda: CachedGenerator(
                backend, GenerationCache(self.generation_cache), self.checkpoint_prompts,
                show_progress=self.show_progress,
            ),
        )

    def _backend(self, spec: GeneratorConfig):
        from ragutil_dagster.models.generation import HFGenerator

        # Behind the cache one bar spans all checkpoints; the backend's per-call bar stays off.
        show_progress = self.show_progress and not self.generation_cache
        if spec.backend == "openai":
            return self._server_generator(spec, show_progress)
        ref = resolve(spec.model, spec.revision)
        if spec.backend == "vllm":
            from ragutil_dagster.models.vllm_backend import VLLMGenerator

            engine = spec.engine.model_dump()
            return _memo(
                ("vllm", ref.identity, str(ref.path), spec.use_chat_template, tuple(sorted(engine.items()))),
                lambda: VLLMGenerator(
                    ref, use_chat_template=spec.use_chat_template,
                    trust_remote_code=spec.trust_remote_code, show_progress=show_progress, **engine,
                ),
            )
        return _memo(
            ("hf", ref.identity, str(ref.path), self.device, spec.dtype, spec.use_chat_template,
             self.generation_batch_rows),
            lambda: HFGenerator(
                ref, device=self._device(), dtype=spec.dtype, use_chat_template=spec.use_chat_template,
                trust_remote_code=spec.trust_remote_code, max_batch_rows=self.generation_batch_rows,
                show_progress=show_progress,
            ),
        )

    def _server_generator(self, spec: GeneratorConfig, show_progress: bool):
        """The generator behind OpenAI-compatible servers; the local copy of ``model``, when one
        resolves here, gives the tokenizer and the identity (else the servers are asked)."""
        from ragutil_dagster.errors import ModelUnavailableError
        from ragutil_dagster.models.openai_backend import OpenAIGenerator

        server = spec.server
        try:
            ref = resolve(spec.model, spec.revision)
            tokenizer, identity = str(ref.path), ref.identity
        except ModelUnavailableError:
            tokenizer = identity = None
        return _memo(
            ("openai", spec.model_dump_json(), identity),
            lambda: OpenAIGenerator(
                server.base_url, server.served_model or spec.model, identity=identity,
                tokenizer=tokenizer, use_chat_template=spec.use_chat_template,
                api_key_env=server.api_key_env,
                prompt_logprob_metrics=TOKEN_SCORED_METRICS,
                max_concurrency=server.max_concurrency, timeout=server.timeout_seconds,
                max_retries=server.max_retries, reprobe_seconds=server.reprobe_seconds,
                show_progress=show_progress,
            ),
        )

    def scorer(self, spec: GeneratorConfig):
        """A token scorer on the generator's own weights and prompt formatting: the HF model the
        HF backend loaded, the vLLM engine's prompt log-probs, or the servers' echoed log-probs —
        never a second copy of the model beside an engine."""
        from ragutil_dagster.models.generation import HFGenerator

        generator = self._backend(spec)
        if spec.backend == "vllm":
            from ragutil_dagster.models.vllm_backend import VLLMTokenScorer

            return _memo(("scorer", id(generator)), lambda: VLLMTokenScorer(generator))
        if spec.backend == "openai":
            from ragutil_dagster.models.openai_backend import OpenAITokenScorer

            return _memo(("scorer", id(generator)), lambda: OpenAITokenScorer(generator))
        from ragutil_dagster.models.scoring import TokenScorer

        assert isinstance(generator, HFGenerator)
        return _memo(("scorer", id(generator)), lambda: TokenScorer(generator.lm, show_progress=self.show_progress))

    def entailment(self, spec: NliConfig):
        from ragutil_dagster.models.entailment import Entailment, LexicalJudge

        if spec.model == LEXICAL_NLI:
            return _memo(("nli", LEXICAL_NLI_IDENTITY), LexicalJudge)
        ref = resolve(spec.model, spec.revision)
        cache: bool | str = self.nli_cache or False
        return _memo(
            ("nli", ref.identity, str(ref.path), self.device, spec.dtype, cache),
            lambda: Entailment(
                ref, device=self._device(), dtype=spec.dtype, cache=Path(cache) if cache else False,
                trust_remote_code=spec.trust_remote_code, show_progress=self.show_progress,
            ),
        )

    def embedder(self, model: str, revision: str | None = None):
        from ragutil_dagster.models.embedding import Embedder

        ref = resolve(model, revision)
        return _memo(
            ("embedder", ref.identity, str(ref.path), self.device),
            lambda: Embedder(ref, device=self._device(), show_progress=self.show_progress),
        )

    def reranker(self, model: str, revision: str | None = None):
        from ragutil_dagster.models.rerank import CrossEncoderReranker

        ref = resolve(model, revision)
        return _memo(
            ("reranker", ref.identity, str(ref.path), self.device),
            lambda: CrossEncoderReranker(ref, device=self._device()),
        )
