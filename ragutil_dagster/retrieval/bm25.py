"""Lexical retrieval: BM25 through bm25s with its numba backend, saved in bm25s's own format.

A saved index is a directory holding ``bm25s/`` (bm25s's sparse score matrix and vocabulary),
``ids.parquet`` (passage ids in index order) and ``manifest.json`` (parameters, size, corpus
fingerprint). Loading against a different corpus raises :class:`IndexMismatchError`.

bm25s is imported when an index is built or loaded, not with this module: bm25s imports numba,
whose llvmlite library object breaks vLLM 0.32's kernel scan in every process that has it
(``'_lib_fn_wrapper' object has no attribute 'get'`` at engine start). vLLM's engine processes
are spawned and re-import the calling script's top-level imports, so a script that merely
imports this module at its top could not start an in-process vLLM engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import Stemmer

from ragutil_dagster.data.corpus import corpus_fingerprint, indexed_texts
from ragutil_dagster.errors import IndexFormatError
from ragutil_dagster.infra.files import atomic_directory
from ragutil_dagster.retrieval.io import check_corpus, read_manifest, write_manifest
from ragutil_dagster.retrieval.runs import run_from_matrix

if TYPE_CHECKING:
    import bm25s


def _bm25s() -> Any:
    """bm25s, imported on first use (see the module doc)."""
    import bm25s

    return bm25s


FORMAT_VERSION = 1


@dataclass(frozen=True)
class BM25Config:
    """BM25 parameters and text processing.

    Defaults k1=0.9, b=0.4 are Anserini's / Pyserini's, the BM25 that FlashRAG (SePer's toolkit)
    and DPR's baselines use; ``method="lucene"`` is Lucene's BM25 variant.
    """

    k1: float = 0.9
    b: float = 0.4
    method: str = "lucene"
    stopwords: str = "en"
    stemmer: str | None = "english"
    include_title: bool = True


class BM25Retriever:
    """A BM25 index over a passage table, searchable with a query table."""

    def __init__(
        self, model: bm25s.BM25, ids: pl.Series, config: BM25Config, fingerprint: str
    ) -> None:
        self._model = model
        self.ids = ids.rename("id")
        self.config = config
        self.fingerprint = fingerprint
        self._stemmer = Stemmer.Stemmer(config.stemmer) if config.stemmer else None

    def _tokenize(self, texts: list[str], show_progress: bool) -> list[list[str]]:
        return _bm25s().tokenize(
            texts,
            stopwords=self.config.stopwords,
            stemmer=self._stemmer,
            return_ids=False,
            show_progress=show_progress,
        )

    @classmethod
    def build(
        cls, corpus: pl.DataFrame, config: BM25Config | None = None, fingerprint: str | None = None
    ) -> BM25Retriever:
        """Index every passage of ``corpus`` (schema of :mod:`~ragutil_dagster.data.corpus`);
        ``fingerprint``, its :func:`corpus_fingerprint` when already known, saves hashing it."""
        config = config or BM25Config()
        model = _bm25s().BM25(k1=config.k1, b=config.b, method=config.method, backend="numba")
        retriever = cls(model, corpus["id"], config, fingerprint or corpus_fingerprint(corpus))
        show = corpus.height >= 10_000
        model.index(
            retriever._tokenize(indexed_texts(corpus, config.include_title), show),
            show_progress=show,
        )
        return retriever

    def __len__(self) -> int:
        return len(self.ids)

    def search(self, queries: pl.DataFrame, k: int = 10, name: str = "bm25") -> pl.DataFrame:
        """Top-``k`` passages per query (table with ``id``, ``text``) as a run table tagged ``name``.

        Passages sharing no term with the query (score 0) are left out, so a query can get fewer
        than ``k`` rows.
        """
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        show = queries.height >= 10_000
        tokens = self._tokenize(queries["text"].to_list(), show)
        documents, scores = self._model.retrieve(
            tokens, k=min(k, len(self.ids)), show_progress=show, n_threads=0
        )
        return run_from_matrix(
            queries["id"].to_list(), self.ids, documents, scores, scores > 0, name
        )

    def save(self, directory: str | Path) -> None:
        """Write the index to ``directory`` (replaced atomically if it exists)."""
        with atomic_directory(directory) as staging:
            self._model.save(str(staging / "bm25s"), show_progress=False)
            self.ids.to_frame().write_parquet(staging / "ids.parquet")
            write_manifest(
                staging,
                {
                    "kind": "bm25",
                    "format_version": FORMAT_VERSION,
                    "config": asdict(self.config),
                    "size": len(self.ids),
                    "corpus_fingerprint": self.fingerprint,
                    "bm25s_version": _bm25s().__version__,
                },
            )

    @classmethod
    def load(
        cls,
        directory: str | Path,
        corpus: pl.DataFrame | Mapping[str, Any] | None = None,
        mmap: bool = False,
    ) -> BM25Retriever:
        """Load a saved index. With ``corpus`` (the table, or its record), check it is the corpus
        the index was built from (:func:`~ragutil_dagster.retrieval.io.check_corpus`).

        ``mmap=True`` memory-maps bm25s's score arrays instead of reading them into memory.
        """
        directory = Path(directory)
        manifest = read_manifest(directory, "bm25", FORMAT_VERSION)
        if corpus is not None:
            check_corpus(manifest, corpus, directory)
        ids = pl.read_parquet(directory / "ids.parquet")["id"]
        if len(ids) != manifest["size"]:
            raise IndexFormatError(
                f"{directory}: ids.parquet has {len(ids)} ids, manifest says {manifest['size']}"
            )
        model = _bm25s().BM25.load(
            str(directory / "bm25s"),
            mmap=mmap,
            allow_pickle=False,
            show_progress=False,
            verbosity=0,
        )
        # bm25s's saved parameters do not include the backend; restore the numba one.
        model.backend = "numba"
        return cls(model, ids, BM25Config(**manifest["config"]), manifest["corpus_fingerprint"])
