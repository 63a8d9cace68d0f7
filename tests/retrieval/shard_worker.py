"""One process of tests/retrieval/test_embedding_shards.py: fill one embedding shard with the hash
encoder, or race to create one file; print what it did as JSON.

Usage: shard_worker.py READY_FILE GO_FILE fill CORPUS ROOT SHARD SHARDS BLOCK_SIZE
       shard_worker.py READY_FILE GO_FILE create TARGET
The worker imports everything, creates READY_FILE and waits for GO_FILE, so the contenders start
together."""

import json
import os
import sys
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).parent))
from conftest import HashEncoder  # noqa: E402  (the tests' own encoder, beside this file)

from ragutil_dagster.data.corpus import corpus_fingerprint  # noqa: E402
from ragutil_dagster.infra.files import create_once  # noqa: E402
from ragutil_dagster.retrieval.dense import DenseConfig  # noqa: E402
from ragutil_dagster.retrieval.embedding_shards import ShardedEmbeddings  # noqa: E402

ready, go, action, *arguments = sys.argv[1:]
Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.01)
if action == "fill":
    corpus_path, root, shard, shards, block_size = arguments
    corpus, encoder, config = (
        pl.read_parquet(corpus_path),
        HashEncoder(),
        DenseConfig(block_size=int(block_size)),
    )
    embeddings = ShardedEmbeddings.under(
        root,
        "world__hash",
        corpus_fingerprint(corpus),
        corpus.height,
        encoder.identity,
        config,
        int(shards),
    )
    shard_range = embeddings.rows_of(int(shard))
    rows = embeddings.fill(
        int(shard), corpus.slice(shard_range.start, len(shard_range)), encoder, config
    )
    print(json.dumps({"rows": [rows.start, rows.stop]}))
else:
    (target,) = arguments

    def slow_write(temporary: Path) -> None:
        temporary.write_text(f"{os.getpid()}\n")
        time.sleep(0.3)  # long enough for every contender to be writing at once

    print(json.dumps({"pid": os.getpid(), "created": create_once(target, slow_write)}))
