"""What a ``passage_embeddings`` shard step reads of the corpus table: its rows only
(``ArtifactStore.read_table(rows=)``, the Parquet row groups holding them) against the whole table
sliced afterwards, as the step did before. A corpus of ``--passages`` synthetic 100-word passages is
published once; each way then runs ``--repeats`` times, each in a fresh process, whose peak RSS and
read time are recorded (the process's imports alone are measured too).

    python bench/shard_read.py [--passages 1000000] [--shards 8] [--repeats 2]

Prints a table and writes bench/results/shard_read.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from ragutil_dagster.resources import ArtifactStore
from ragutil_dagster.retrieval.embedding_shards import shard_rows
from ragutil_dagster.tables import markdown_table

RESULTS = Path(__file__).with_name("results") / "shard_read.json"


def publish_corpus(home: Path, passages: int) -> int:
    """A corpus of ``passages`` passages of 100 random words; returns its Parquet row groups."""
    rng = np.random.default_rng(0)
    words = np.array([f"w{i}" for i in range(5000)])
    frame = pl.DataFrame(
        {
            "passage_id": [f"p{i}" for i in range(passages)],
            "title": [f"title {i}" for i in range(passages)],
            "text": [" ".join(words[rng.integers(0, len(words), 100)]) for _ in range(passages)],
        }
    )
    store = ArtifactStore(home=str(home))
    store.write_table("corpus", "bench", frame)
    return store._objects.read(
        "corpus/bench/table.parquet", lambda handle: pq.ParquetFile(handle).num_row_groups
    )


def read_once(home: str, way: str, passages: int, shards: int) -> dict[str, float]:
    """In this process: one shard's rows read ``way`` (``rows``, ``whole`` or ``imports``)."""
    store = ArtifactStore(home=home)
    rows = shard_rows(1, shards, passages)
    start = time.perf_counter()
    if way == "rows":
        frame = store.read_table("corpus", "bench", rows=rows)
    elif way == "whole":
        frame = store.read_table("corpus", "bench").slice(rows.start, len(rows))
    else:
        frame = pl.DataFrame({"passage_id": [str(i) for i in rows]})
    seconds = time.perf_counter() - start
    assert frame.height == len(rows)
    return {"seconds": seconds, "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float:
    """This process's peak RSS since its exec (``VmHWM``; ``ru_maxrss`` would carry the forking
    parent's peak across the exec)."""
    status = Path("/proc/self/status").read_text()
    return (
        int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])
        / 1024
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", nargs=2, metavar=("HOME", "WAY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(read_once(*args.child, args.passages, args.shards)))
        return
    with tempfile.TemporaryDirectory() as home:
        groups = publish_corpus(Path(home), args.passages)
        rows = []
        for way in ("imports", "whole", "rows"):
            runs = [
                json.loads(
                    subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--child",
                            home,
                            way,
                            "--passages",
                            str(args.passages),
                            "--shards",
                            str(args.shards),
                        ],
                        check=True,
                        capture_output=True,
                        text=True,
                    ).stdout
                )
                for _ in range(args.repeats)
            ]
            rows.append(
                {
                    "read": way,
                    "seconds": min(r["seconds"] for r in runs),
                    "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
                }
            )
    workload = {
        "passages": args.passages,
        "shards": args.shards,
        "row_groups": groups,
        "repeats": args.repeats,
    }
    print(markdown_table(rows))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"workload": workload, "rows": rows}, indent=2))
    print(f"{workload}; written to {RESULTS}")


if __name__ == "__main__":
    main()
