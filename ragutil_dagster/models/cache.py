"""Content-addressed generation cache: the same request never samples twice.

An entry is addressed by the sha256 of everything that determines the samples — the generator's
settings (backend, model identity, dtype, prompt formatting), the prompt, the sampling parameters,
n and the seed — and holds the n samples plus a digest of them. Entries are written atomically
(temp file + rename); an unreadable, truncated, tampered or inconsistent entry is detected on
read, reported, and recomputed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from ragutil_dagster.failpoints import failpoint
from ragutil_dagster.files import atomic_write, cache_root, canonical_json
from ragutil_dagster.models.generation import Generator, Sample
from ragutil_dagster.models.inputs import check_texts
from ragutil_dagster.sampling import SamplingParams
from ragutil_dagster.versions import library_versions

__all__ = ["CacheStats", "CachedGenerator", "GenerationCache"]

log = logging.getLogger(__name__)
_FORMAT = 1
_FINISH = {"stop", "length"}


class GenerationCache:
    """A directory of JSON entries, one per (generator settings, prompt, sampling parameters)."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_root() / "generations"

    @staticmethod
    def key(settings: Mapping[str, object], prompt: str, params: SamplingParams) -> str:
        """sha256 hex address of a request (library versions included: a new torch, transformers
        or vLLM samples anew)."""
        request = {
            "settings": dict(settings),
            "versions": library_versions(),
            "prompt": prompt,
            "params": dataclasses.asdict(params),
        }
        return hashlib.sha256(canonical_json(request)).hexdigest()

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str, n: int) -> list[Sample] | None:
        """The ``n`` stored samples, or None when absent or not a valid, complete entry."""
        path = self.path(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            log.warning("generation cache entry %s unreadable (%s); recomputing", path, err)
            return None
        samples = _parse_entry(raw, key, n)
        if samples is None:
            log.warning("generation cache entry %s is corrupt or partial; recomputing", path)
        return samples

    def put(self, key: str, samples: Sequence[Sample]) -> None:
        """Store samples atomically: readers see the old entry or the whole new one."""
        body = [dataclasses.asdict(s) for s in samples]
        entry = {
            "format": _FORMAT,
            "key": key,
            "samples": body,
            "digest": hashlib.sha256(canonical_json(body)).hexdigest(),
        }
        atomic_write(self.path(key), lambda temporary: temporary.write_bytes(canonical_json(entry)))


def _parse_entry(raw: bytes, key: str, n: int) -> list[Sample] | None:
    """The samples of a well-formed entry for ``key`` holding ``n`` consistent ones, else None."""
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(entry, dict) or entry.get("format") != _FORMAT or entry.get("key") != key:
        return None
    body = entry.get("samples")
    if not isinstance(body, list) or len(body) != n:
        return None
    if entry.get("digest") != hashlib.sha256(canonical_json(body)).hexdigest():
        return None
    samples = []
    for item in body:
        try:
            sample = Sample(
                text=item["text"],
                token_ids=tuple(item["token_ids"]),
                token_logprobs=tuple(item["token_logprobs"]),
                finish_reason=item["finish_reason"],
                prompt_tokens=item["prompt_tokens"],
            )
        except (KeyError, TypeError):
            return None
        if (
            not isinstance(sample.text, str)
            or len(sample.token_ids) != len(sample.token_logprobs)
            or sample.finish_reason not in _FINISH
        ):
            return None
        samples.append(sample)
    return samples


@dataclass
class CacheStats:
    """Prompts served from the cache vs. sampled, over a :class:`CachedGenerator`'s calls."""

    hits: int = 0
    misses: int = 0


class CachedGenerator:
    """A :class:`Generator` that consults a :class:`GenerationCache` before sampling.

    A call's distinct prompts (a repeated prompt is sampled once) are cut into checkpoints of
    ``checkpoint_prompts``; a checkpoint whose entries are all stored is served from the cache,
    any other goes to the wrapped generator and its new entries are stored as soon as it is
    sampled. A process killed mid-call loses at most one checkpoint; the next call samples only
    checkpoints with something missing. A stored entry always wins over a fresh sample of the
    same request, so every reader of a request sees the same samples.
    """

    def __init__(
        self,
        generator: Generator,
        cache: GenerationCache | None = None,
        checkpoint_prompts: int = 64,
        show_progress: bool = False,
    ) -> None:
        if checkpoint_prompts < 1:
            raise ValueError(f"checkpoint_prompts must be at least 1, got {checkpoint_prompts}")
        self.generator = generator
        self.cache = cache if cache is not None else GenerationCache()
        self.checkpoint_prompts = checkpoint_prompts
        self.show_progress = show_progress
        self.stats = CacheStats()

    @property
    def identity(self) -> str:
        return self.generator.identity

    @property
    def settings(self) -> dict[str, object]:
        return self.generator.settings

    @property
    def context_length(self) -> int | None:
        return self.generator.context_length

    def count_prompt_tokens(self, prompts: Sequence[str]) -> list[int]:
        return self.generator.count_prompt_tokens(prompts)

    def sample(self, prompts: Sequence[str], params: SamplingParams) -> list[list[Sample]]:
        """As the wrapped generator's ``sample``, reusing every stored request."""
        prompts = check_texts(prompts, "prompts")
        settings = self.generator.settings
        keys = [GenerationCache.key(settings, p, params) for p in prompts]
        # Checkpoints are fixed slices of the call's distinct prompts in a canonical order, so a
        # resumed call batches every prompt with the same batch-mates as an uninterrupted one:
        # batch composition moves float results in the last bits, and scores stay bit-identical.
        distinct = sorted(dict(zip(keys, prompts)).items(), key=lambda kp: (len(kp[1]), kp[1]))
        size = self.checkpoint_prompts
        checkpoints = [distinct[i:i + size] for i in range(0, len(distinct), size)]
        found: dict[str, list[Sample]] = {}
        with tqdm(total=len(distinct), desc="sampling", unit="prompt",
                  disable=not self.show_progress or not distinct) as bar:
            for checkpoint in checkpoints:
                stored = {key: self.cache.get(key, params.n) for key, _ in checkpoint}
                missing = {key for key, samples in stored.items() if samples is None}
                self.stats.hits += len(checkpoint) - len(missing)
                self.stats.misses += len(missing)
                if not missing:
                    found.update(stored)
                    bar.update(len(checkpoint))
                    continue
                # A checkpoint with missing entries is sampled whole, for the same batch-mates as
                # an uninterrupted run; entries already stored are kept, never replaced — another
                # partition may have read them (prompts shared between settings), and a re-run
                # must read the same values.
                fresh = self.generator.sample([prompt for _, prompt in checkpoint], params)
                for (key, _), samples in zip(checkpoint, fresh, strict=True):
                    if key in missing:
                        self.cache.put(key, samples)
                    found[key] = stored[key] or samples
                bar.update(len(checkpoint))
                failpoint("sampling")
        return [list(found[key]) for key in keys]
