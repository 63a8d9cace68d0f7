"""The model loader: loads each configured model once per process and hands it to assets.

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
from ragutil_dagster.models.backend_contract import Placement
from ragutil_dagster.models.backends import local_copy, registered
from ragutil_dagster.models.resolver import LEXICAL_NLI, LEXICAL_NLI_IDENTITY, resolve

_loaded: dict[tuple, Any] = {}
_lock = threading.Lock()


def _memo(key: tuple, load) -> Any:
    with _lock:
        if key not in _loaded:
            _loaded[key] = load()
        return _loaded[key]


class ModelLoader(ConfigurableResource):
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

    def _generation_cache(self):
        """One connection per process to the configured generation cache, which holds both the
        samples and the teacher-forced scores."""
        from ragutil_dagster.models.cache import GenerationCache

        location = self.generation_cache
        return _memo(("generation cache", location), lambda: GenerationCache(location))

    def generator(self, spec: GeneratorConfig):
        """The configured generator, behind the generation cache when one is configured."""
        from ragutil_dagster.models.cache import CachedGenerator

        # Behind the cache one bar spans all checkpoints; the backend's per-call bar stays off.
        backend = self._backend(
            spec, show_progress=self.show_progress and not self.generation_cache
        )
        if not self.generation_cache:
            return backend
        cache = self._generation_cache()  # not inside the lambda: _memo's lock is not re-entrant
        return _memo(
            ("cached", id(backend), self.generation_cache, self.checkpoint_prompts),
            lambda: CachedGenerator(
                backend,
                cache,
                self.checkpoint_prompts,
                show_progress=self.show_progress,
            ),
        )

    def _placement(self, show_progress: bool) -> Placement:
        return Placement(self._device(), self.generation_batch_rows, show_progress)

    def _backend(self, spec: GeneratorConfig, show_progress: bool):
        """The generator as the backend registry builds it, once per process for the same config,
        local copy and placement."""
        backend, config = registered(spec)
        ref = local_copy(spec, backend)
        placement = self._placement(show_progress)
        copy = (ref.identity, str(ref.path)) if ref else None
        return _memo(
            ("generator", config.model_dump_json(), copy, placement),
            lambda: backend.generator(config, ref, placement),
        )

    def scorer(self, spec: GeneratorConfig):
        """A token scorer on the generator's own weights and prompt formatting, as its backend
        builds it (models/backends.py) — never a second copy of the model beside an engine —,
        behind the generation cache's scores when a generation cache is configured."""
        from ragutil_dagster.models.scoring_cache import CachedScorer

        backend, _ = registered(spec)
        generator = self._backend(
            spec, show_progress=self.show_progress and not self.generation_cache
        )
        scorer = _memo(
            ("scorer", id(generator)),
            lambda: backend.scorer(generator, self._placement(self.show_progress)),
        )
        if not self.generation_cache:
            return scorer
        cache = self._generation_cache()
        return _memo(
            ("cached scorer", id(scorer), self.generation_cache),
            lambda: CachedScorer(scorer, generator.settings, cache),
        )

    def entailment(self, spec: NliConfig):
        """The configured answer judge: the NLI model (or the lexical judge), behind the content
        check when ``answer_check`` asks for it."""
        from ragutil_dagster.models.entailment import ContentCheckedJudge

        judge = self._judge(spec)
        if spec.answer_check == "content":
            return _memo(("checked", id(judge)), lambda: ContentCheckedJudge(judge))
        return judge

    def _judge(self, spec: NliConfig):
        from ragutil_dagster.models.entailment import Entailment, LexicalJudge

        if spec.model == LEXICAL_NLI:
            return _memo(("nli", LEXICAL_NLI_IDENTITY), LexicalJudge)
        ref = resolve(spec.model, spec.revision)
        cache: bool | str = self.nli_cache or False
        return _memo(
            ("nli", ref.identity, str(ref.path), self.device, spec.dtype, cache),
            lambda: Entailment(
                ref,
                device=self._device(),
                dtype=spec.dtype,
                cache=Path(cache) if cache else False,
                trust_remote_code=spec.trust_remote_code,
                show_progress=self.show_progress,
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

    def bertscorer(self, model: str, layer: int | None = None):
        """The encoder of SePer Table 2's BERTScore row (models/bertscore.py)."""
        from ragutil_dagster.models.bertscore import BertScorer

        ref = resolve(model)
        return _memo(
            ("bertscore", ref.identity, str(ref.path), layer, self.device),
            lambda: BertScorer(ref, layer=layer, device=self._device()),
        )
