"""Teacher-forced scores behind the generation cache: the same (prompt, continuation) is never
scored twice by the same model.

A scorer's results depend on the prompt, the continuation (and for attention, the passages'
spans) and the model as its generator formats prompts, so an entry is addressed by the sha256 of
those, the generator's settings and the library versions — as the generation cache addresses
samples — and stored in its database (table ``ragutil_scores``). Settings that share candidates
(one retriever at several k) then score each utility candidate once, and a re-run scores nothing.
As for samples, the first entry stored for a request wins, for every reader alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from ragutil_dagster.infra.files import canonical_json
from ragutil_dagster.infra.versions import library_versions
from ragutil_dagster.models.cache import GenerationCache
from ragutil_dagster.models.token_scoring import ScoredContinuation

__all__ = ["CachedScorer"]

T = TypeVar("T")


class CachedScorer:
    """A token scorer (``score``, ``passage_attention``) that consults ``cache`` first.

    ``settings`` are what besides the inputs determines the scores: the generator's settings
    (backend, model identity, dtype, prompt formatting), whose weights and formatting the scorer
    shares."""

    def __init__(self, scorer: Any, settings: Mapping[str, object], cache: GenerationCache) -> None:
        self.scorer = scorer
        self.cache = cache
        self._settings = {"scorer": type(scorer).__name__, **settings}

    @property
    def identity(self) -> str:
        return self.scorer.identity

    @property
    def supports_attention(self) -> bool:
        return self.scorer.supports_attention

    @property
    def attention_unavailable(self) -> str:
        return self.scorer.attention_unavailable

    def score(
        self, prompts: Sequence[str], continuations: Sequence[str]
    ) -> list[ScoredContinuation]:
        """As the wrapped scorer's ``score``, reusing every stored pair."""
        requests = [
            (self._key("score", prompt, continuation), (prompt, continuation))
            for prompt, continuation in zip(prompts, continuations, strict=True)
        ]
        return self._cached(
            requests,
            lambda todo: self.scorer.score([p for p, _ in todo], [c for _, c in todo]),
            _scored_json,
            _scored_from_json,
        )

    def passage_attention(
        self,
        prompts: Sequence[str],
        continuations: Sequence[str],
        passage_spans: Sequence[Sequence[tuple[int, int]]],
    ) -> list[np.ndarray]:
        """As the wrapped scorer's ``passage_attention``, reusing every stored request."""
        requests = [
            (
                self._key("attention", prompt, continuation, [list(span) for span in spans]),
                (prompt, continuation, spans),
            )
            for prompt, continuation, spans in zip(
                prompts, continuations, passage_spans, strict=True
            )
        ]
        return self._cached(
            requests,
            lambda todo: self.scorer.passage_attention(
                [p for p, _, _ in todo], [c for _, c, _ in todo], [s for _, _, s in todo]
            ),
            lambda masses: [float(m) for m in masses],
            _masses_from_json,
        )

    def _key(self, kind: str, prompt: str, continuation: str, spans: object = None) -> str:
        request = {
            "kind": kind,
            "settings": self._settings,
            "versions": library_versions(),
            "prompt": prompt,
            "continuation": continuation,
            **({"spans": spans} if spans is not None else {}),
        }
        return hashlib.sha256(canonical_json(request)).hexdigest()

    def _cached(
        self,
        requests: list[tuple[str, Any]],
        compute: Callable[[list[Any]], Sequence[T]],
        to_json: Callable[[T], object],
        from_json: Callable[[object], T | None],
    ) -> list[T]:
        keys = [key for key, _ in requests]
        found = self.cache.get_scores(keys, from_json)
        missing = {key: inputs for key, inputs in requests if key not in found}
        if missing:
            fresh = dict(zip(missing, compute(list(missing.values())), strict=True))
            self.cache.put_scores({key: to_json(value) for key, value in fresh.items()})
            # Another worker may have stored some of them first: its scores win.
            stored = self.cache.get_scores(list(missing), from_json)
            found.update({key: stored.get(key, value) for key, value in fresh.items()})
        return [found[key] for key in keys]


def _scored_json(scored: ScoredContinuation) -> dict[str, object]:
    return {
        "token_ids": list(scored.token_ids),
        "tokens": list(scored.tokens),
        "word_ids": list(scored.word_ids),
        "token_logprobs": [float(v) for v in scored.token_logprobs],
        "prompt_tokens": scored.prompt_tokens,
    }


def _scored_from_json(body: object) -> ScoredContinuation | None:
    try:
        scored = ScoredContinuation(
            token_ids=tuple(body["token_ids"]),
            tokens=tuple(body["tokens"]),
            word_ids=tuple(body["word_ids"]),
            token_logprobs=tuple(body["token_logprobs"]),
            prompt_tokens=body["prompt_tokens"],
        )
    except (KeyError, TypeError):
        return None
    lengths = {len(scored.token_ids), len(scored.tokens), len(scored.word_ids)}
    return scored if lengths == {len(scored.token_logprobs)} else None


def _masses_from_json(body: object) -> np.ndarray | None:
    if not isinstance(body, list):
        return None
    try:
        return np.asarray(body, dtype=np.float64)
    except (TypeError, ValueError):
        return None
