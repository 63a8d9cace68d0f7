"""Sharded embedding: shards filled in any order, or by processes racing each other, give the bytes
of a one-shot embedding; an incomplete or foreign set of shards is refused by name."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from ragutil_dagster.data.corpus import corpus_fingerprint
from ragutil_dagster.errors import IncompleteEmbeddingsError, IndexMismatchError
from ragutil_dagster.retrieval.dense import DenseConfig, embed_corpus
from ragutil_dagster.retrieval.embedding_shards import ShardedEmbeddings, shard_rows

from .conftest import HashEncoder

WORKER = Path(__file__).with_name("shard_worker.py")
# Blocks smaller than a shard and not dividing it: shards start and end inside blocks of a one-shot run.
CONFIG = DenseConfig(block_size=32)


def rows_of(corpus, embeddings: ShardedEmbeddings, shard: int):
    """The passages a shard step reads: its rows of ``corpus``."""
    rows = embeddings.rows_of(shard)
    return corpus.slice(rows.start, len(rows))


def sharded(
    world,
    root: Path,
    shards: int,
    encoder: HashEncoder | None = None,
    fingerprint: str | None = None,
):
    encoder = encoder or HashEncoder()
    return ShardedEmbeddings.under(
        root,
        "world__hash",
        fingerprint or corpus_fingerprint(world.corpus),
        world.corpus.height,
        encoder.identity,
        CONFIG,
        shards,
    )


@pytest.mark.parametrize("rows", [0, 1, 7, 300])
@pytest.mark.parametrize("shards", [1, 2, 3, 8])
def test_shard_rows_cover_the_corpus_in_order(rows: int, shards: int) -> None:
    ranges = [shard_rows(shard, shards, rows) for shard in range(1, shards + 1)]
    assert [row for part in ranges for row in part] == list(range(rows))
    assert max(map(len, ranges)) - min(map(len, ranges)) <= 1
    with pytest.raises(ValueError, match="numbered 1 to"):
        shard_rows(0, shards, rows)


def test_shards_filled_out_of_order_give_the_one_shot_bytes(world, tmp_path: Path) -> None:
    encoder = HashEncoder()
    embeddings = sharded(world, tmp_path, 4)
    for shard in (3, 1, 4, 2):
        rows = embeddings.fill(shard, rows_of(world.corpus, embeddings, shard), encoder, CONFIG)
        assert rows == shard_rows(shard, 4, world.corpus.height)
    finished = embeddings.open()
    assert isinstance(finished, np.memmap) and not finished.flags.writeable
    one_shot = embed_corpus(world.corpus, encoder, CONFIG)
    assert finished.tobytes() == one_shot.tobytes()
    assert (
        embed_corpus(world.corpus, encoder, CONFIG, tmp_path / "one.npy").tobytes()
        == one_shot.tobytes()
    )
    # Filling a shard again rewrites its rows only: still the same bytes.
    embeddings.fill(2, rows_of(world.corpus, embeddings, 2), encoder, CONFIG)
    assert embeddings.open().tobytes() == one_shot.tobytes()


def worker(*arguments: str):
    """The argv of one shard_worker.py process doing ``arguments``, for ``release_together``."""
    return lambda ready, go: [sys.executable, str(WORKER), str(ready), str(go), *arguments]


@pytest.mark.slow
def test_shards_in_processes_started_together_share_one_file(
    world, tmp_path: Path, release_together
) -> None:
    """Three processes released at once: all three race to allocate the file (one wins, the others
    write into it), each writes its rows; the result is the one-shot embedding."""
    corpus = tmp_path / "corpus.parquet"
    world.corpus.write_parquet(corpus)
    root = tmp_path / "scratch"
    results = release_together(
        [worker("fill", str(corpus), str(root), str(shard), "3", "32") for shard in (1, 2, 3)],
        tmp_path,
    )
    assert [result["rows"] for result in results] == [
        [r.start, r.stop]
        for r in (shard_rows(shard, 3, world.corpus.height) for shard in (1, 2, 3))
    ]
    embeddings = sharded(world, root, 3)
    assert (
        embeddings.open().tobytes() == embed_corpus(world.corpus, HashEncoder(), CONFIG).tobytes()
    )
    # One file and the three records: the losers' temporary files are gone.
    assert sorted(p.name for p in embeddings.directory.iterdir()) == [
        "embeddings.npy",
        "shard-1-of-3.json",
        "shard-2-of-3.json",
        "shard-3-of-3.json",
    ]


@pytest.mark.slow
def test_processes_creating_one_file_at_once_leave_exactly_one_whole(
    tmp_path: Path, release_together
) -> None:
    target = tmp_path / "allocated"
    results = release_together([worker("create", str(target))] * 4, tmp_path)
    winners = [result["pid"] for result in results if result["created"]]
    assert len(winners) == 1
    assert target.read_text() == f"{winners[0]}\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".allocated")] == []


def test_a_missing_shard_is_named(world, tmp_path: Path) -> None:
    embeddings = sharded(world, tmp_path, 3)
    for shard in (1, 3):
        embeddings.fill(shard, rows_of(world.corpus, embeddings, shard), HashEncoder(), CONFIG)
    with pytest.raises(
        IncompleteEmbeddingsError, match=r"not embedded: world__hash__shard-2-of-3; materialise"
    ) as error:
        embeddings.open()
    assert "shard-1-of-3" not in str(error.value) and "shard-3-of-3" not in str(error.value)


def test_embeddings_of_another_corpus_or_encoder_are_never_used(world, tmp_path: Path) -> None:
    encoder = HashEncoder()
    embeddings = sharded(world, tmp_path, 2)
    for shard in (1, 2):
        embeddings.fill(shard, rows_of(world.corpus, embeddings, shard), encoder, CONFIG)
    assert embeddings.open().shape == (world.corpus.height, encoder.dim)

    # Another encoder or corpus looks elsewhere and finds nothing of its own.
    for other in (
        sharded(world, tmp_path, 2, encoder=HashEncoder(identity="hash-encoder-v2")),
        sharded(world, tmp_path, 2, fingerprint="sha256:" + "0" * 64),
    ):
        assert other.directory != embeddings.directory
        with pytest.raises(
            IncompleteEmbeddingsError,
            match="not embedded: world__hash__shard-1-of-2, world__hash__shard-2-of-2",
        ):
            other.open()
    # Another number of shards: the same vectors, but its own shards must be recorded.
    with pytest.raises(
        IncompleteEmbeddingsError, match="not embedded: world__hash__shard-1-of-3, .*shard-3-of-3"
    ):
        sharded(world, tmp_path, 3).open()

    # A record left by other inputs in the same place (written by hand here) is refused, not used.
    record = embeddings.directory / "shard-2-of-2.json"
    record.write_text(
        json.dumps({**json.loads(record.read_text()), "encoder_identity": "stale-encoder"})
    )
    with pytest.raises(
        IncompleteEmbeddingsError,
        match=(
            r"embedded for other inputs: world__hash__shard-2-of-2 \(encoder_identity 'stale-encoder', "
            r"expected 'hash-encoder-v1'\)"
        ),
    ):
        embeddings.open()

    # A shard is only filled with the encoder and corpus it was set up for.
    with pytest.raises(
        IndexMismatchError, match="given encoder hash-encoder-v2, expected hash-encoder-v1"
    ):
        embeddings.fill(
            1, rows_of(world.corpus, embeddings, 1), HashEncoder(identity="hash-encoder-v2"), CONFIG
        )
    with pytest.raises(
        IndexMismatchError,
        match=rf"given 10 passages for rows \[0, {world.corpus.height // 2}\) of a corpus of {world.corpus.height}",
    ):
        embeddings.fill(1, world.corpus.head(10), encoder, CONFIG)
