"""The generation cache at scale: ``--entries`` requests of SePer's shape (n = 10 samples of 32
tokens each) written in checkpoints of 64 prompts, then one checkpoint's lookup timed at random
keys, with the store's size on disk (SQLite) — what one file per prompt would have cost in files.

    python bench/generation_cache.py [--entries 200000] [--location DIR-or-URL]

Prints a table; writes nothing but the store (default: a temporary directory, removed after).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from ragutil_dagster.models.cache import GenerationCache
from ragutil_dagster.models.generation import Sample
from ragutil_dagster.sampling import SamplingParams
from ragutil_dagster.tables import markdown_table

CHECKPOINT = 64


def samples(rng: random.Random, n: int = 10, tokens: int = 32) -> list[Sample]:
    return [
        Sample(
            " ".join(f"w{rng.randrange(5000)}" for _ in range(tokens)),
            tuple(rng.randrange(50000) for _ in range(tokens)),
            tuple(-rng.random() * 5 for _ in range(tokens)),
            "length",
            300,
        )
        for _ in range(n)
    ]


def run(entries: int, location: str) -> list[dict[str, object]]:
    rng = random.Random(0)
    cache = GenerationCache(location)
    params = SamplingParams(n=10, max_new_tokens=32)
    keys = [
        GenerationCache.key({"identity": "bench"}, f"prompt {i}", params) for i in range(entries)
    ]
    body = samples(rng)  # one body for all: the cost measured is the store's, not the generator's
    start = time.perf_counter()
    for i in range(0, entries, CHECKPOINT):
        cache.put_many({key: body for key in keys[i : i + CHECKPOINT]})
    write = time.perf_counter() - start
    lookups = []
    for _ in range(20):
        chosen = rng.sample(keys, CHECKPOINT)
        start = time.perf_counter()
        found = cache.get_many(chosen, 10)
        lookups.append(time.perf_counter() - start)
        assert len(found) == CHECKPOINT
    rows = [
        {"figure": "entries", "value": len(cache)},
        {"figure": "write, entries/s (checkpoints of 64)", "value": round(entries / write)},
        {
            "figure": "lookup of a 64-prompt checkpoint, median ms",
            "value": round(sorted(lookups)[10] * 1000, 1),
        },
    ]
    database = Path(location) / "generations.sqlite"
    if database.is_file():
        rows.append(
            {
                "figure": "SQLite file, bytes per entry",
                "value": round(database.stat().st_size / entries),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument(
        "--location", help="directory or database URL (default: a temporary directory)"
    )
    args = parser.parse_args()
    if args.location:
        print(markdown_table(run(args.entries, args.location)))
        return
    with tempfile.TemporaryDirectory() as directory:
        print(markdown_table(run(args.entries, directory)))


if __name__ == "__main__":
    main()
