"""The content-addressed generation cache: no request samples twice; bad entries are redone."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
import sqlalchemy as sa

from ragutil_dagster.models.cache import (
    ENTRIES_TABLE,
    SQLITE_FILE,
    CachedGenerator,
    GenerationCache,
)
from ragutil_dagster.models.generation import Sample
from ragutil_dagster.models.hf_backend import HFGenerator
from ragutil_dagster.sampling import SamplingParams

PROMPTS = [
    "Question: who wrote Hamlet? Answer:",
    "The Nile is",
    "Question: who wrote Hamlet? Answer:",
]


class CountingGenerator:
    """Wraps a generator and records which prompts reach it."""

    def __init__(self, inner: HFGenerator) -> None:
        self.inner = inner
        self.calls: list[list[str]] = []

    @property
    def identity(self) -> str:
        return self.inner.identity

    @property
    def settings(self) -> dict[str, object]:
        return self.inner.settings

    def sample(self, prompts, params):
        self.calls.append(list(prompts))
        return self.inner.sample(prompts, params)


@pytest.fixture(scope="module")
def hf(tiny_models) -> HFGenerator:
    return HFGenerator(str(tiny_models.causal_lm), device="cpu", show_progress=False)


@pytest.fixture()
def cached(hf: HFGenerator, tmp_path: Path) -> CachedGenerator:
    return CachedGenerator(CountingGenerator(hf), GenerationCache(tmp_path / "gen"))


def test_same_request_never_samples_twice(cached: CachedGenerator, hf: HFGenerator) -> None:
    first = cached.sample(PROMPTS, SamplingParams(n=3, max_new_tokens=6, seed=1))
    # The repeated prompt went once; prompts go shortest first (the canonical checkpoint order).
    assert cached.generator.calls == [[PROMPTS[1], PROMPTS[0]]]
    assert first[0] == first[2]
    direct = hf.sample(PROMPTS, SamplingParams(n=3, max_new_tokens=6, seed=1))
    assert [[s.token_ids for s in per] for per in first] == [
        [s.token_ids for s in per] for per in direct
    ]
    again = cached.sample(PROMPTS, SamplingParams(n=3, max_new_tokens=6, seed=1))
    assert again == first and len(cached.generator.calls) == 1
    assert (cached.stats.hits, cached.stats.misses) == (2, 2)


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 2},
        {"n": 4},
        {"temperature": 0.5},
        {"top_p": 0.9},
        {"top_k": 3},
        {"max_new_tokens": 7},
        {"stop": ["\n"]},
        {"first_index": 3},
    ],
)
def test_any_parameter_change_is_a_new_request(cached: CachedGenerator, change: dict) -> None:
    base = {"n": 3, "max_new_tokens": 6, "seed": 1}
    cached.sample(PROMPTS[:1], SamplingParams(**base))
    cached.sample(PROMPTS[:1], SamplingParams(**{**base, **change}))
    assert len(cached.generator.calls) == 2


def test_key_covers_generator_settings() -> None:
    params = SamplingParams(n=2)
    a = GenerationCache.key({"identity": "x", "chat_template": False}, "p", params)
    assert a == GenerationCache.key({"chat_template": False, "identity": "x"}, "p", params)
    assert a != GenerationCache.key({"identity": "x", "chat_template": True}, "p", params)
    assert a != GenerationCache.key({"identity": "y", "chat_template": False}, "p", params)


def _key(cached: CachedGenerator, prompt: str, **params) -> str:
    return GenerationCache.key(cached.settings, prompt, SamplingParams(**params))


def _stored(cache: GenerationCache, key: str) -> bytes:
    """The raw stored entry of ``key`` (compressed canonical JSON), as the database holds it."""
    with cache.engine.connect() as db:
        return db.execute(
            sa.text(f"SELECT entry FROM {ENTRIES_TABLE} WHERE request = :k"), {"k": key}
        ).scalar_one()


def _overwrite(cache: GenerationCache, key: str, raw: bytes) -> None:
    with cache.engine.begin() as db:
        db.execute(
            sa.text(f"UPDATE {ENTRIES_TABLE} SET entry = :e WHERE request = :k"),
            {"e": raw, "k": key},
        )


@pytest.mark.parametrize("damage", ["truncate", "tamper", "drop_sample", "not_json", "empty"])
def test_corrupt_or_partial_entries_are_recomputed(cached: CachedGenerator, damage: str) -> None:
    params = {"n": 2, "max_new_tokens": 5, "seed": 3}
    good = cached.sample(PROMPTS[:1], SamplingParams(**params))
    key = _key(cached, PROMPTS[0], **params)
    raw = _stored(cached.cache, key)
    entry = json.loads(zlib.decompress(raw))
    if damage == "truncate":
        damaged = raw[: len(raw) // 2]
    elif damage == "tamper":
        entry["samples"][0]["token_logprobs"][0] += 1.0
        damaged = zlib.compress(json.dumps(entry).encode())
    elif damage == "drop_sample":
        entry["samples"] = entry["samples"][:1]
        damaged = zlib.compress(json.dumps(entry).encode())
    elif damage == "not_json":
        damaged = zlib.compress(b"\x00\xff garbage")
    else:
        damaged = b""
    _overwrite(cached.cache, key, damaged)
    assert cached.cache.get_many([key], 2) == {}
    redone = cached.sample(PROMPTS[:1], SamplingParams(**params))
    assert redone == good and len(cached.generator.calls) == 2
    assert cached.cache.get_many([key], 2) == {key: good[0]}  # the entry was rewritten whole


def test_one_row_per_distinct_request_in_one_file(cached: CachedGenerator, tmp_path: Path) -> None:
    cached.sample(PROMPTS, SamplingParams(n=2, max_new_tokens=4))
    assert len(cached.cache) == 2
    # One SQLite database (with its WAL files and setup lock), not a file per prompt.
    files = {p.name for p in (tmp_path / "gen").iterdir()}
    assert files <= {SQLITE_FILE, f"{SQLITE_FILE}-wal", f"{SQLITE_FILE}-shm", f"{SQLITE_FILE}.lock"}


class CrashingGenerator(CountingGenerator):
    """Fails on its ``crash_on``-th call, as a worker killed mid-run."""

    def __init__(self, inner: HFGenerator, crash_on: int) -> None:
        super().__init__(inner)
        self.crash_on = crash_on

    def sample(self, prompts, params):
        if len(self.calls) + 1 == self.crash_on:
            raise RuntimeError("worker died")
        return super().sample(prompts, params)


def test_a_crash_mid_call_keeps_the_finished_checkpoints(hf: HFGenerator, tmp_path: Path) -> None:
    prompts = [f"Question: what is item {i}? Answer:" for i in range(7)]
    cache = GenerationCache(tmp_path / "gen")
    crashing = CachedGenerator(CrashingGenerator(hf, crash_on=3), cache, checkpoint_prompts=3)
    with pytest.raises(RuntimeError, match="worker died"):
        crashing.sample(prompts, SamplingParams(n=2, max_new_tokens=4, seed=3))
    assert crashing.generator.calls == [prompts[:3], prompts[3:6]]  # two checkpoints stored

    resumed = CachedGenerator(CountingGenerator(hf), cache, checkpoint_prompts=3)
    got = resumed.sample(prompts, SamplingParams(n=2, max_new_tokens=4, seed=3))
    assert resumed.generator.calls == [prompts[6:]]  # only what was missing
    # Bit-identical to an uninterrupted run: the same checkpoints, batched with the same mates.
    fresh = CachedGenerator(
        CountingGenerator(hf), GenerationCache(tmp_path / "other"), checkpoint_prompts=3
    )
    assert got == fresh.sample(prompts, SamplingParams(n=2, max_new_tokens=4, seed=3))


def test_a_stored_entry_is_never_replaced(cached: CachedGenerator) -> None:
    first = cached.sample(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=4, seed=5))
    key = GenerationCache.key(cached.settings, PROMPTS[0], SamplingParams(2, 1.0, 1.0, 0, 4, (), 5))
    before = _stored(cached.cache, key)
    # The checkpoint holding both prompts is sampled whole (other batch-mates than the first
    # call's, so float results may differ in the last bits), but the stored entry wins.
    both = cached.sample(PROMPTS[:2], SamplingParams(n=2, max_new_tokens=4, seed=5))
    assert cached.generator.calls[-1] == [PROMPTS[1], PROMPTS[0]]
    assert both[0] == first[0] and _stored(cached.cache, key) == before
    assert (cached.stats.hits, cached.stats.misses) == (1, 2)


class FakeGenerator:
    """Samples without a model: each worker's samples carry its own tag, so the test can tell
    whose entry a reader got."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    @property
    def identity(self) -> str:
        return "fake"

    @property
    def settings(self) -> dict[str, object]:
        return {"identity": "fake"}

    def sample(self, prompts, params):
        return [
            [Sample(f"{self.tag}:{prompt}:{i}", (i,), (-0.5,), "stop", 3) for i in range(params.n)]
            for prompt in prompts
        ]


WORKER = """
import sys, time
from tests.models.test_generation_cache import FakeGenerator
from ragutil_dagster.models.cache import CachedGenerator, GenerationCache
from ragutil_dagster.sampling import SamplingParams
location, tag, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
cache = GenerationCache(location)
time.sleep(max(0.0, start - time.time()))
got = CachedGenerator(FakeGenerator(tag), cache, checkpoint_prompts=7).sample(
    [f"prompt {i}" for i in range(40)], SamplingParams(n=2, seed=1))
print("|".join(per[0].text for per in got))
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_location(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "shared")
    return request.getfixturevalue("postgres").create_database(
        f"cache_{tmp_path.name[-20:].lower()}"
    )


@pytest.mark.slow
def test_concurrent_workers_share_one_entry_per_request(shared_location: str) -> None:
    """Two processes released together on the same 40 prompts (the first creating the store):
    the database keeps one row per request, and every worker returns the stored samples."""
    import subprocess
    import sys
    import time

    start = time.time() + 6  # after every worker has imported and opened the store
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, shared_location, f"w{i}", str(start)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parents[2],
        )
        for i in range(2)
    ]
    outputs = [worker.communicate(timeout=120)[0].strip() for worker in workers]
    assert all(worker.returncode == 0 for worker in workers)
    assert len(set(outputs)) == 1, "workers returned different samples for one request"
    cache = GenerationCache(shared_location)
    assert len(cache) == 40
    keys = [
        GenerationCache.key({"identity": "fake"}, f"prompt {i}", SamplingParams(n=2, seed=1))
        for i in range(40)
    ]
    stored = cache.get_many(keys, 2)
    assert "|".join(stored[key][0].text for key in keys) == outputs[0]


OPPOSITE_ORDER_WRITER = """
import sys, time
from ragutil_dagster.models.cache import GenerationCache
from ragutil_dagster.models.generation import Sample
location, order, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
cache = GenerationCache(location)
time.sleep(max(0.0, start - time.time()))
for batch in range(15):
    keys = [f"{batch:02d}-{i:04d}" for i in range(300)]
    if order == "descending":
        keys.reverse()
    cache.put_many({key: [Sample(key, (1,), (-0.5,), "stop", 3)] for key in keys})
"""


@pytest.mark.slow
def test_writers_of_overlapping_keys_in_opposite_orders_never_deadlock(
    shared_location: str,
) -> None:
    """Callers hand ``put_many`` their entries in any order (a set's order differs between
    processes); two writers of the same keys, one ascending and one descending, both commit."""
    import subprocess
    import sys
    import time

    start = time.time() + 6
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", OPPOSITE_ORDER_WRITER, shared_location, order, str(start)],
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parents[2],
        )
        for order in ("ascending", "descending")
    ]
    errors = [writer.communicate(timeout=120)[1] for writer in writers]
    assert [writer.returncode for writer in writers] == [0, 0], "\n".join(errors)
    assert len(GenerationCache(shared_location)) == 15 * 300


ROUNDS = [
    SamplingParams(n=3, max_new_tokens=6, seed=1),
    SamplingParams(n=2, max_new_tokens=6, seed=1, first_index=3),
]


def test_rounds_are_requests_of_their_own(cached: CachedGenerator, hf: HFGenerator) -> None:
    """Each round of a prompt is stored as its own request: a repeated call draws nothing, and
    rounds already stored (here the first, by a plain call) are served with only the rest drawn,
    the decision between rounds taken on all of a prompt's samples."""
    prompts = [PROMPTS[0], PROMPTS[1]]
    decisions: list[tuple[list[int], list[int]]] = []

    def keep_going(indices: list[int], samples: list[list[Sample]]) -> list[bool]:
        decisions.append((indices, [len(got) for got in samples]))
        return [prompts[i] == PROMPTS[0] for i in indices]

    first_round = cached.sample(prompts, ROUNDS[0])
    cached.generator.calls.clear()
    drawn = cached.sample_rounds(prompts, ROUNDS, keep_going)
    assert cached.generator.calls == [[PROMPTS[0]]]  # the first round served, the second drawn
    assert decisions == [([1, 0], [3, 3])]  # checkpoint order: shortest prompt first
    assert [len(per) for per in drawn] == [2, 1] and drawn[1][0] == first_round[1]
    direct = hf.sample([PROMPTS[0]], SamplingParams(n=5, max_new_tokens=6, seed=1))[0]
    assert [s.token_ids for got in drawn[0] for s in got] == [s.token_ids for s in direct]
    cached.generator.calls.clear()
    assert cached.sample_rounds(prompts, ROUNDS, keep_going) == drawn
    assert cached.generator.calls == [] and decisions[1] == decisions[0]
    assert cached.sample([PROMPTS[0]], ROUNDS[1]) == [drawn[0][1]]
    with pytest.raises(ValueError, match=r"prompts\[1\] repeats prompts\[0\]"):
        cached.sample_rounds([PROMPTS[0], PROMPTS[0]], ROUNDS, keep_going)
