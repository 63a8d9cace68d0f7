"""The partition keys a config implies: an index's (dataset × retriever), an embedding shard's and a
setting's (:class:`Setting`). Parts join with :data:`KEY_SEPARATOR`, which no name contains."""

from __future__ import annotations

import re
from dataclasses import dataclass

KEY_SEPARATOR = "__"
"""Joins the parts of a partition key (``dataset__retriever``, ``dataset__retriever__k5``)."""


def index_partition_key(dataset: str, retriever: str) -> str:
    """The dataset × retriever partition key of an index."""
    return f"{dataset}{KEY_SEPARATOR}{retriever}"


def parse_index_partition_key(key: str) -> tuple[str, str]:
    """(dataset, retriever) of an index partition key."""
    dataset, retriever = key.split(KEY_SEPARATOR)
    return dataset, retriever


def embedding_shard_name(shard: int, shards: int) -> str:
    """The name of shard ``shard`` (1-based) of ``shards``: ``shard-2-of-8``."""
    return f"shard-{shard}-of-{shards}"


_EMBEDDING_SHARD = re.compile(r"shard-(\d+)-of-(\d+)")


def embedding_partition_key(index_key: str, shard: int, shards: int) -> str:
    """The partition key of one embedding shard of an index: ``world__e5__shard-2-of-8``."""
    return f"{index_key}{KEY_SEPARATOR}{embedding_shard_name(shard, shards)}"


def parse_embedding_partition_key(key: str) -> tuple[str, int, int]:
    """(index key, shard, shards) of an embedding shard's partition key."""
    index_key, _, last = key.rpartition(KEY_SEPARATOR)
    found = _EMBEDDING_SHARD.fullmatch(last)
    if not found or index_key.count(KEY_SEPARATOR) != 1:
        raise ValueError(
            f"not an embedding shard's partition key: {key!r} (expected dataset__retriever__shard-<i>-of-<n>)"
        )
    return index_key, int(found[1]), int(found[2])


@dataclass(frozen=True)
class Setting:
    """dataset × retriever × k (× reranker) (× compressor | multi-step round): one static partition key."""

    dataset: str
    retriever: str
    k: int
    reranker: str | None = None
    compressor: str | None = None
    """The name of the compressor shortening its rag context (``CompressorConfig.key``), or None."""
    step: int | None = None
    """The multi-step round (2, 3, …) whose gathered passages are its context; None: one round."""

    @property
    def key(self) -> str:
        """Its partition key; a key is turned back into its setting by looking it up among the
        configured ones (``ExperimentConfig.setting``), never by parsing. An uncompressed setting's
        key is the one it had before compression existed."""
        parts = [self.dataset, self.retriever, f"k{self.k}"]
        return KEY_SEPARATOR.join(
            parts + [name for name in (self.reranker, self.compressor, self.round_name) if name]
        )

    @property
    def round_name(self) -> str | None:
        """``step-<t>`` for multi-step round t, the last part of its key; None for one round."""
        return f"step-{self.step}" if self.step is not None else None
