"""Content-addressed generation cache: the same request never samples twice.

An entry is addressed by the sha256 of everything that determines the samples — the generator's
settings (backend, model identity, dtype, prompt formatting), the prompt, the sampling parameters,
n and the seed — and holds the n samples plus a digest of them. Entries are rows of one key–value
table in a database (SQLite in a directory by default; PostgreSQL, shared by many workers and
machines, when ``$RAGUTIL_GENERATION_CACHE_URL`` names one), so millions of prompts are millions
of rows under a primary-key index, not millions of files. A row is written whole in one
transaction, and the first row stored for a key wins; an unreadable, truncated, tampered or
inconsistent entry is detected on read, reported, deleted and recomputed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from tqdm.auto import tqdm

from ragutil_dagster.errors import ConfigError
from ragutil_dagster.infra.databases import database_engine, is_database_uri
from ragutil_dagster.infra.failpoints import failpoint
from ragutil_dagster.infra.files import cache_root, canonical_json
from ragutil_dagster.infra.locks import exclusive_file_lock
from ragutil_dagster.infra.redaction import redact_uri
from ragutil_dagster.infra.versions import library_versions
from ragutil_dagster.models.generation import (
    Generator,
    KeepGoing,
    Sample,
    checked_round_prompts,
    sample_rounds,
    still_drawing,
)
from ragutil_dagster.models.inputs import check_texts
from ragutil_dagster.sampling import SamplingParams

__all__ = ["ENTRIES_TABLE", "SCORES_TABLE", "CacheStats", "CachedGenerator", "GenerationCache"]

T = TypeVar("T")

log = logging.getLogger(__name__)
_FORMAT = 1
_FINISH = {"stop", "length"}
SQLITE_FILE = "generations.sqlite"
ENTRIES_TABLE = "ragutil_generations"
# Keys per SELECT: well under every database's limit on bound parameters.
_CHUNK = 500
_metadata = sa.MetaData()
_entries = sa.Table(
    ENTRIES_TABLE,
    _metadata,
    sa.Column("request", sa.String(64), primary_key=True),
    sa.Column("entry", sa.LargeBinary, nullable=False),  # zlib-compressed canonical JSON
    sqlite_with_rowid=False,
)
SCORES_TABLE = "ragutil_scores"
# Teacher-forced scores (models/scoring_cache.py) beside the samples, in the same database.
_scores = sa.Table(
    SCORES_TABLE,
    _metadata,
    sa.Column("request", sa.String(64), primary_key=True),
    sa.Column("entry", sa.LargeBinary, nullable=False),
    sqlite_with_rowid=False,
)
_INSERTS = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


class GenerationCache:
    """The cache at ``location``: a SQLAlchemy database URL (``sqlite:///…``, ``postgresql://…``)
    or a directory holding the embedded SQLite file (default: the user's ragutil cache)."""

    def __init__(self, location: str | Path | None = None) -> None:
        location = str(location) if location is not None else str(cache_root() / "generations")
        if is_database_uri(location):
            self.url = location
        else:
            path = Path(location).expanduser() / SQLITE_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            self.url = f"sqlite:///{path}"
            # WAL lets workers read while one writes; switching a fresh file to it needs an
            # exclusive lock SQLite does not wait for, so processes set it up one at a time.
            with exclusive_file_lock(path.with_name(path.name + ".lock")):
                with sa.create_engine(self.url).connect() as db:
                    db.exec_driver_sql("PRAGMA journal_mode=WAL")
        self.engine = database_engine(self.url, _metadata)
        if self.engine.dialect.name not in _INSERTS:
            raise ConfigError(
                f"generation cache {redact_uri(self.url)}: {self.engine.dialect.name} is not supported "
                f"(use sqlite or postgresql)"
            )

    @staticmethod
    def key(settings: Mapping[str, object], prompt: str, params: SamplingParams) -> str:
        """sha256 hex address of a request (library versions included: a new torch, transformers
        or vLLM samples anew)."""
        request = {
            "settings": dict(settings),
            "versions": library_versions(),
            "prompt": prompt,
            "params": _params_key(params),
        }
        return hashlib.sha256(canonical_json(request)).hexdigest()

    def __len__(self) -> int:
        with self.engine.connect() as db:
            return db.execute(sa.select(sa.func.count()).select_from(_entries)).scalar_one()

    def get_many(self, keys: Iterable[str], n: int) -> dict[str, list[Sample]]:
        """The stored samples of those ``keys`` that hold a valid, complete entry of ``n``; an
        invalid entry is deleted (only that exact row: a valid one written meanwhile stays)."""
        return self._get(_entries, "samples", keys, lambda body: _samples(body, n))

    def put_many(self, entries: Mapping[str, Sequence[Sample]]) -> None:
        """Store entries in one transaction; a key already stored keeps its samples (another
        worker's, which readers may already have used)."""
        self._put(
            _entries,
            "samples",
            {key: [dataclasses.asdict(s) for s in samples] for key, samples in entries.items()},
        )

    def get_scores(self, keys: Iterable[str], parse: Callable[[object], T | None]) -> dict[str, T]:
        """The stored teacher-forced scores of those ``keys``, each read by ``parse`` (None: not
        a valid entry, deleted as in :meth:`get_many`)."""
        return self._get(_scores, "scores", keys, parse)

    def put_scores(self, entries: Mapping[str, object]) -> None:
        """Store JSON-able scores as :meth:`put_many` stores samples (the first stored wins)."""
        self._put(_scores, "scores", entries)

    def _get(
        self,
        table: sa.Table,
        field: str,
        keys: Iterable[str],
        parse: Callable[[object], T | None],
    ) -> dict[str, T]:
        keys = list(dict.fromkeys(keys))
        found: dict[str, T] = {}
        damaged: list[tuple[str, bytes]] = []
        with self.engine.connect() as db:
            for start in range(0, len(keys), _CHUNK):
                chunk = keys[start : start + _CHUNK]
                for request, raw in db.execute(
                    sa.select(table.c.request, table.c.entry).where(table.c.request.in_(chunk))
                ):
                    body = _entry_body(raw, request, field)
                    value = None if body is None else parse(body)
                    if value is None:
                        damaged.append((request, raw))
                    else:
                        found[request] = value
        if damaged:
            log.warning(
                "%d %s cache entries in %s are corrupt or partial; recomputing",
                len(damaged),
                "generation" if table is _entries else "scoring",
                redact_uri(self.url),
            )
            with self.engine.begin() as db:
                for request, raw in damaged:
                    db.execute(
                        table.delete().where(table.c.request == request, table.c.entry == raw)
                    )
        return found

    def _put(self, table: sa.Table, field: str, bodies: Mapping[str, object]) -> None:
        # Rows go in key order: two workers inserting overlapping keys then take the unique
        # index's row locks in the same order, and PostgreSQL cannot deadlock them.
        rows = [
            {"request": key, "entry": _entry_bytes(key, field, bodies[key])}
            for key in sorted(bodies)
        ]
        if not rows:
            return
        insert = _INSERTS[self.engine.dialect.name](table).on_conflict_do_nothing()
        with self.engine.begin() as db:
            db.execute(insert, rows)


def _params_key(params: SamplingParams) -> dict[str, object]:
    """The sampling parameters in a request's address; ``first_index`` only when not 0, so that
    requests from a stream's start keep the addresses they had before the field existed."""
    fields = dataclasses.asdict(params)
    if not fields["first_index"]:
        del fields["first_index"]
    return fields


def _entry_bytes(key: str, field: str, body: object) -> bytes:
    entry = {
        "format": _FORMAT,
        "key": key,
        field: body,
        "digest": hashlib.sha256(canonical_json(body)).hexdigest(),
    }
    return zlib.compress(canonical_json(entry))


def _entry_body(raw: bytes, key: str, field: str) -> object | None:
    """The ``field`` of a well-formed, untampered entry for ``key``, else None."""
    try:
        entry = json.loads(zlib.decompress(raw))
    except (zlib.error, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("format") != _FORMAT or entry.get("key") != key:
        return None
    body = entry.get(field)
    if body is None or entry.get("digest") != hashlib.sha256(canonical_json(body)).hexdigest():
        return None
    return body


def _samples(body: object, n: int) -> list[Sample] | None:
    """The ``n`` consistent samples of an entry's body, else None."""
    if not isinstance(body, list) or len(body) != n:
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
        checkpoints = [distinct[i : i + size] for i in range(0, len(distinct), size)]
        found: dict[str, list[Sample]] = {}
        with tqdm(
            total=len(distinct),
            desc="sampling",
            unit="prompt",
            disable=not self.show_progress or not distinct,
        ) as bar:
            for checkpoint in checkpoints:
                stored = self.cache.get_many([key for key, _ in checkpoint], params.n)
                missing = {key for key, _ in checkpoint if key not in stored}
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
                sampled = dict(zip((key for key, _ in checkpoint), fresh, strict=True))
                self.cache.put_many({key: sampled[key] for key in missing})
                # Another worker may have stored some of them first: its samples win, for every
                # reader alike.
                stored.update(self.cache.get_many(missing, params.n))
                found.update({key: stored.get(key, sampled[key]) for key, _ in checkpoint})
                bar.update(len(checkpoint))
                failpoint("sampling")
        return [list(found[key]) for key in keys]

    def sample_rounds(
        self, prompts: Sequence[str], rounds: Sequence[SamplingParams], keep_going: KeepGoing
    ) -> list[list[list[Sample]]]:
        """As :func:`~ragutil_dagster.models.generation.sample_rounds` on the wrapped generator,
        reusing every stored round. Each round of a prompt is its own request (``n`` and
        ``first_index`` of the round), so rounds drawn by calls and by a
        :class:`~ragutil_dagster.models.generation.RoundSampler` share entries. Per checkpoint (as
        :meth:`sample` cuts them), rounds whose requests are all stored are served, the decision
        between rounds is taken on them, and the wrapped generator draws the rest from the first
        round with a request missing, each round stored as it returns."""
        prompts = checked_round_prompts(prompts, rounds)
        settings = self.generator.settings
        ordered = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), prompts[i]))
        size = self.checkpoint_prompts
        drawn: list[list[list[Sample]]] = [[] for _ in prompts]
        with tqdm(
            total=len(prompts),
            desc="sampling in rounds",
            unit="prompt",
            disable=not self.show_progress or not prompts,
        ) as bar:
            for start in range(0, len(ordered), size):
                active, number = ordered[start : start + size], 0
                while active and number < len(rounds):
                    keys = {
                        i: GenerationCache.key(settings, prompts[i], rounds[number]) for i in active
                    }
                    stored = self.cache.get_many(list(keys.values()), rounds[number].n)
                    if len(stored) < len(keys):
                        break
                    self.stats.hits += len(active)
                    for i in active:
                        drawn[i].append(stored[keys[i]])
                    number += 1
                    if number < len(rounds):
                        active = still_drawing(keep_going, active, drawn)
                if active and number < len(rounds):
                    self._draw_rounds(prompts, active, rounds[number:], keep_going, drawn)
                bar.update(len(ordered[start : start + size]))
                failpoint("sampling")
        return drawn

    def _draw_rounds(
        self,
        prompts: list[str],
        active: list[int],
        rounds: Sequence[SamplingParams],
        keep_going: KeepGoing,
        drawn: list[list[list[Sample]]],
    ) -> None:
        """The wrapped generator draws ``rounds`` of the prompts ``active`` (indices of
        ``prompts``, whose earlier rounds are in ``drawn``); each round is stored, a stored entry
        winning over the fresh one as in :meth:`sample`."""
        settings = self.generator.settings
        earlier = {i: [s for got in drawn[i] for s in got] for i in active}

        def decide(positions: list[int], samples: list[list[Sample]]) -> list[bool]:
            chosen = [active[p] for p in positions]
            return keep_going(
                chosen, [earlier[i] + got for i, got in zip(chosen, samples, strict=True)]
            )

        fresh = sample_rounds(self.generator, [prompts[i] for i in active], rounds, decide)
        requests = [
            [
                (GenerationCache.key(settings, prompts[i], params), got)
                for params, got in zip(rounds, per_round)
            ]
            for i, per_round in zip(active, fresh, strict=True)
        ]
        self.cache.put_many({key: got for per_prompt in requests for key, got in per_prompt})
        for number, params in enumerate(rounds):
            keys = [per_prompt[number][0] for per_prompt in requests if len(per_prompt) > number]
            stored = self.cache.get_many(keys, params.n)
            for i, per_prompt in zip(active, requests):
                if len(per_prompt) > number:
                    key, got = per_prompt[number]
                    drawn[i].append(stored.get(key, got))
        self.stats.misses += sum(len(per_round) for per_round in fresh)
