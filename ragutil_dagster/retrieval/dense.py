"""Dense retrieval: passage embeddings searched with FAISS.

Index types (:class:`FaissIndexSpec`): exact ``flat`` inner product (the default), and for
large corpora ``ivf`` (inverted lists, ``nlist`` cells, ``nprobe`` searched), ``hnsw`` (graph,
``hnsw_m`` links, ``ef_search``) and ``ivfpq`` (inverted lists over product-quantised codes of
``pq_m`` bytes at 8 bits — the Wikipedia-scale option; see ``docs/scale.md``), optionally with
exact re-scoring of the top candidates from the stored vectors. When faiss has GPU support
(``faiss-gpu``, the ``[gpu]`` extra) and CUDA is present, training, adding and search run on the
GPU (HNSW has no GPU implementation and stays on the CPU). ``DenseConfig.gpus`` spreads the index
over every visible GPU: ``replicas`` (a full copy on each, queries split between them) or ``shards``
(1/G of the vectors on each, every query sent to all and the top-k merged) — docs/scale.md.

A saved index is a directory: ``embeddings.npy`` (float32 ``(n, dim)``, opened memory-mapped
on load), ``index.faiss`` (FAISS's own file format), ``ids.parquet`` (passage ids in index order)
and ``manifest.json`` (encoder identity, dimension, metric, size, index spec, text settings and
the corpus fingerprint). Loading it with another encoder or corpus raises
:class:`IndexMismatchError`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import faiss
import numpy as np
import polars as pl
from tqdm.auto import tqdm

from ragutil_dagster.config import GpuLayout
from ragutil_dagster.data.corpus import corpus_fingerprint, indexed_texts
from ragutil_dagster.errors import IndexFormatError, IndexMismatchError
from ragutil_dagster.infra.files import atomic_directory, atomic_path
from ragutil_dagster.retrieval.io import check_corpus, read_manifest, write_manifest
from ragutil_dagster.retrieval.runs import run_from_matrix

FORMAT_VERSION = 1
IndexKind = Literal["flat", "ivf", "hnsw", "ivfpq"]
Metric = Literal["ip", "l2"]
Device = Literal["auto", "cpu", "cuda"]


class TextEncoder(Protocol):
    """What dense retrieval needs from an embedding model
    (:class:`ragutil_dagster.models.embedding.Embedder` is one)."""

    @property
    def identity(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


@dataclass(frozen=True)
class FaissIndexSpec:
    """Which FAISS index to build and how to search it."""

    kind: IndexKind = "flat"
    metric: Metric = "ip"
    nlist: int = 1024
    nprobe: int = 16
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 128
    pq_m: int = 64
    rescore: int = 0
    """When > 0, fetch this many candidates per query from the index and re-score them exactly
    against the stored embeddings before keeping k (recovers IVF-PQ's quantisation loss)."""
    train_size: int | None = None
    """Vectors sampled to train IVF centroids / PQ codebooks (default: min(n, max(64 × nlist, 10,000)),
    FAISS's rule of thumb of 30–256 points per centroid for both)."""

    def factory_string(self) -> str:
        """The ``faiss.index_factory`` description of this index."""
        return {
            "flat": "Flat",
            "ivf": f"IVF{self.nlist},Flat",
            "hnsw": f"HNSW{self.hnsw_m},Flat",
            "ivfpq": f"IVF{self.nlist},PQ{self.pq_m}x8",
        }[self.kind]

    def faiss_metric(self) -> int:
        return faiss.METRIC_INNER_PRODUCT if self.metric == "ip" else faiss.METRIC_L2


@dataclass(frozen=True)
class DenseConfig:
    """Dense retrieval settings: the index, how passages and queries become encoder input, the device.

    Prefixes carry model conventions such as E5's ``"query: "`` / ``"passage: "`` or BGE's query
    instruction.
    """

    index: FaissIndexSpec = field(default_factory=FaissIndexSpec)
    include_title: bool = True
    query_prefix: str = ""
    passage_prefix: str = ""
    device: Device = "auto"
    gpus: GpuLayout = "one"
    """``one``: GPU 0 (when ``device`` allows a GPU); ``replicas`` / ``shards``: every visible GPU."""
    block_size: int = 16_384
    """Passages embedded and added to the index per block (bounds memory, drives the progress bar)."""


def gpu_available() -> bool:
    """True when the installed faiss has GPU support and sees a CUDA device."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


RowWriter = Callable[[int, np.ndarray], None]
"""``write(first_row, vectors)``: takes the vectors of consecutive passages from row ``first_row`` on."""


def embed_rows(
    passages: pl.DataFrame,
    encoder: TextEncoder,
    config: DenseConfig,
    first_row: int,
    write: RowWriter,
    label: str = "embed passages",
) -> None:
    """Embed ``passages`` — the corpus's rows from ``first_row`` on — block by block, with a
    progress bar, handing each block's float32 vectors to ``write`` at their corpus rows: the one
    embedding loop of :func:`embed_corpus` and of every shard
    (:mod:`ragutil_dagster.retrieval.embedding_shards`)."""
    blocks = range(0, passages.height, config.block_size)
    for start in tqdm(blocks, desc=label, unit="block", disable=len(blocks) < 2):
        block = passages.slice(start, config.block_size)
        texts = [
            config.passage_prefix + text for text in indexed_texts(block, config.include_title)
        ]
        write(first_row + start, _vectors(encoder.encode(texts), encoder.dim))


def embed_corpus(
    corpus: pl.DataFrame,
    encoder: TextEncoder,
    config: DenseConfig,
    out_path: str | Path | None = None,
) -> np.ndarray:
    """Embed every passage (block by block, with a progress bar) into a float32 ``(n, dim)`` array.

    With ``out_path`` the vectors are streamed into a ``.npy`` file (written atomically) and the
    result is that file opened memory-mapped, so corpora larger than memory can be embedded.
    """
    shape = (corpus.height, encoder.dim)
    if out_path is None:
        embeddings = np.empty(shape, dtype=np.float32)

        def into_memory(first_row: int, vectors: np.ndarray) -> None:
            embeddings[first_row : first_row + len(vectors)] = vectors

        embed_rows(corpus, encoder, config, 0, into_memory)
        return embeddings
    with atomic_path(out_path) as temporary:
        allocate_npy(temporary, shape)
        with npy_row_writer(temporary, shape) as write:
            embed_rows(corpus, encoder, config, 0, write)
    return np.load(out_path, mmap_mode="r", allow_pickle=False)


def allocate_npy(path: str | Path, shape: tuple[int, int]) -> None:
    """Write at ``path`` a float32 ``.npy`` of ``shape`` whose rows are all zero, without writing
    them: the file is sparse until rows are written into it."""
    mapped = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
    mapped.flush()
    del mapped


@contextmanager
def npy_row_writer(path: str | Path, shape: tuple[int, int]) -> Iterator[RowWriter]:
    """A :data:`RowWriter` into the existing float32 ``.npy`` of ``shape`` at ``path``, writing
    each block's bytes in place (``pwrite``), durable (``fsync``) when the block ends.

    Not through a writable memory map: on a network file system (NFS) a page that the rows of two
    writers share is written back whole by each machine, overwriting the other's rows; ``pwrite``
    sends exactly the bytes it is given."""
    mapped = np.load(path, mmap_mode="r", allow_pickle=False)  # reads the header only
    if mapped.dtype != np.float32 or mapped.shape != tuple(shape) or not mapped.flags.c_contiguous:
        raise IndexFormatError(
            f"{path}: holds {mapped.dtype} {mapped.shape}, expected float32 {tuple(shape)}"
        )
    offset, row_bytes = mapped.offset, shape[1] * 4
    del mapped
    descriptor = os.open(path, os.O_WRONLY)

    def write(first_row: int, vectors: np.ndarray) -> None:
        if first_row < 0 or first_row + len(vectors) > shape[0]:
            raise IndexError(
                f"rows {first_row}..{first_row + len(vectors)} outside the {shape[0]} rows of {path}"
            )
        data = memoryview(
            np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1).view(np.uint8)
        )
        position = offset + first_row * row_bytes
        while data:  # pwrite may write less than asked
            written = os.pwrite(descriptor, data, position)
            data, position = data[written:], position + written

    try:
        yield write
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _vectors(array: Any, dim: int) -> np.ndarray:
    vectors = np.ascontiguousarray(np.asarray(array, dtype=np.float32))
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        raise ValueError(f"encoder returned shape {vectors.shape}, expected (n, {dim})")
    return vectors


def build_faiss_index(
    embeddings: np.ndarray,
    spec: FaissIndexSpec,
    block_size: int = 16_384,
    device: Device = "cpu",
    seed: int = 0,
    gpus: GpuLayout = "one",
) -> Any:
    """Build a FAISS index over ``embeddings``, adding block by block (IVF kinds are trained first
    on a random sample). On a GPU (see :func:`_to_device`) the empty index is moved there first,
    so k-means training and list assignment — the expensive parts at scale — run on the GPU. With
    ``gpus`` ``replicas`` or ``shards`` the trained, still empty index is then spread over every
    GPU and the vectors are added there (FAISS's own multi-GPU recipe: train once, add to all)."""
    count, dim = embeddings.shape
    if spec.kind == "ivfpq" and dim % spec.pq_m:
        raise ValueError(
            f"ivfpq needs pq_m to divide the dimension: {spec.pq_m} does not divide {dim}"
        )
    index = faiss.index_factory(dim, spec.factory_string(), spec.faiss_metric())
    if spec.kind == "hnsw":
        index.hnsw.efConstruction = spec.ef_construction
    if spec.kind == "ivfpq":
        # Polysemous codes only serve Hamming-distance filtering, which we never use; training them
        # costs several times the PQ codebooks themselves.
        index.do_polysemous_training = False
    _check_gpus(spec, device, gpus)
    index = _to_device(index, spec, device)
    if not index.is_trained:
        if count < spec.nlist:
            raise ValueError(
                f"{spec.kind} with nlist={spec.nlist} needs at least that many vectors, got {count}"
            )
        sample_size = min(count, spec.train_size or max(64 * spec.nlist, 10_000))
        sample = np.sort(np.random.default_rng(seed).choice(count, size=sample_size, replace=False))
        index.train(np.ascontiguousarray(embeddings[sample], dtype=np.float32))
    index = _across_gpus(index, spec, gpus)
    blocks = range(0, count, block_size)
    for start in tqdm(
        blocks, desc=f"add to {spec.kind} index", unit="block", disable=len(blocks) < 4
    ):
        index.add(np.ascontiguousarray(embeddings[start : start + block_size], dtype=np.float32))
    _set_search_parameters(index, spec)
    return index


def _on_gpu(index: Any) -> bool:
    """A GPU index, or the replicas / shards :func:`_across_gpus` spreads over several."""
    if not hasattr(faiss, "GpuIndex"):
        return False
    return isinstance(index, (faiss.GpuIndex, faiss.IndexReplicas, faiss.IndexShards))


def _set_search_parameters(index: Any, spec: FaissIndexSpec) -> None:
    space = faiss.GpuParameterSpace() if _on_gpu(index) else faiss.ParameterSpace()
    if spec.kind in ("ivf", "ivfpq"):
        space.set_index_parameter(index, "nprobe", spec.nprobe)
    elif spec.kind == "hnsw":
        space.set_index_parameter(index, "efSearch", spec.ef_search)


def _to_device(index: Any, spec: FaissIndexSpec, device: Device) -> Any:
    """``index`` itself, or its GPU clone when ``device`` is ``cuda`` (or ``auto`` and faiss has a GPU)."""
    if device == "cpu" or spec.kind == "hnsw":  # FAISS has no GPU HNSW
        return index
    if not gpu_available():
        if device == "cuda":
            raise RuntimeError(
                "device='cuda' but faiss has no GPU support or sees no CUDA device; "
                "install the [gpu] extra (faiss-gpu) on a CUDA machine, or use device='cpu'"
            )
        return index
    options = faiss.GpuClonerOptions()
    options.useFloat16 = (
        spec.kind == "ivfpq"
    )  # GPU IVF-PQ needs fp16 lookup tables above 48 bytes per code
    return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index, options)


def _check_gpus(spec: FaissIndexSpec, device: Device, gpus: GpuLayout) -> None:
    """Several GPUs need faiss's GPU build, CUDA devices and a GPU index kind; say which is missing."""
    if gpus == "one":
        return
    if device == "cpu" or spec.kind == "hnsw":
        why = "device='cpu'" if device == "cpu" else "FAISS has no GPU HNSW"
        raise ValueError(f"gpus={gpus!r} spreads the index over GPUs, but {why}; use gpus='one'")
    if not gpu_available():
        raise RuntimeError(
            f"gpus={gpus!r} but faiss has no GPU support or sees no CUDA device; install the [gpu] "
            "extra (faiss-gpu) on a CUDA machine, or use gpus='one'"
        )


def _across_gpus(index: Any, spec: FaissIndexSpec, gpus: GpuLayout) -> Any:
    """``index`` (trained; on the CPU or GPU 0) as replicas or shards over every visible GPU."""
    if gpus == "one":
        return index
    options = faiss.GpuMultipleClonerOptions()
    options.shard = gpus == "shards"
    options.useFloat16 = spec.kind == "ivfpq"
    cpu_index = faiss.index_gpu_to_cpu(index) if _on_gpu(index) else index
    return faiss.index_cpu_to_all_gpus(cpu_index, options)


class DenseRetriever:
    """Passage embeddings, their FAISS index and the encoder that queries them."""

    def __init__(
        self,
        ids: Sequence[str] | pl.Series,
        embeddings: np.ndarray,
        index: Any,
        encoder: TextEncoder | None,
        encoder_identity: str,
        config: DenseConfig,
        fingerprint: str,
    ) -> None:
        """Prefer :meth:`build`, :meth:`from_embeddings` and :meth:`load`; ``index`` may live on
        the CPU or a GPU."""
        self.ids = pl.Series("id", ids, dtype=pl.String())
        self.embeddings = embeddings
        self.index = index
        self.encoder = encoder
        self.encoder_identity = encoder_identity
        self.config = config
        self.fingerprint = fingerprint

    @classmethod
    def build(
        cls,
        corpus: pl.DataFrame,
        encoder: TextEncoder,
        config: DenseConfig | None = None,
        embeddings_path: str | Path | None = None,
        fingerprint: str | None = None,
    ) -> DenseRetriever:
        """Embed ``corpus`` with ``encoder`` and index it. ``embeddings_path`` streams the vectors
        to a memory-mapped ``.npy`` file instead of memory (see :func:`embed_corpus`);
        ``fingerprint``, the corpus's :func:`corpus_fingerprint` when already known, saves hashing it."""
        config = config or DenseConfig()
        embeddings = embed_corpus(corpus, encoder, config, embeddings_path)
        return cls.from_embeddings(
            corpus["id"],
            embeddings,
            encoder.identity,
            fingerprint or corpus_fingerprint(corpus),
            config,
            encoder,
        )

    @classmethod
    def from_embeddings(
        cls,
        ids: Sequence[str] | pl.Series,
        embeddings: np.ndarray,
        encoder_identity: str,
        fingerprint: str,
        config: DenseConfig | None = None,
        encoder: TextEncoder | None = None,
    ) -> DenseRetriever:
        """Index vectors computed elsewhere (one row per id, same order); ``fingerprint`` is the
        :func:`corpus_fingerprint` of the passages they embed."""
        config = config or DenseConfig()
        if embeddings.ndim != 2 or embeddings.shape[0] != len(ids):
            raise ValueError(f"embeddings of shape {embeddings.shape} do not match {len(ids)} ids")
        index = build_faiss_index(
            embeddings, config.index, config.block_size, config.device, gpus=config.gpus
        )
        return cls(ids, embeddings, index, encoder, encoder_identity, config, fingerprint)

    def with_index(self, spec: FaissIndexSpec) -> DenseRetriever:
        """The same passages under another FAISS index type, built from the stored embeddings
        (no re-embedding)."""
        config = replace(self.config, index=spec)
        index = build_faiss_index(
            self.embeddings, spec, config.block_size, config.device, gpus=config.gpus
        )
        return DenseRetriever(
            self.ids,
            self.embeddings,
            index,
            self.encoder,
            self.encoder_identity,
            config,
            self.fingerprint,
        )

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    def search(self, queries: pl.DataFrame, k: int = 10, name: str = "dense") -> pl.DataFrame:
        """Top-``k`` passages per query (table with ``id``, ``text``) as a run table tagged ``name``."""
        if self.encoder is None:
            raise ValueError(
                "this index was loaded without an encoder; pass one to load() to search with text"
            )
        texts = [self.config.query_prefix + text for text in queries["text"].to_list()]
        vectors = _vectors(self.encoder.encode(texts), self.dim)
        return self.search_vectors(queries["id"].to_list(), vectors, k, name)

    def search_vectors(
        self, query_ids: Sequence[str], vectors: np.ndarray, k: int = 10, name: str = "dense"
    ) -> pl.DataFrame:
        """Search with query vectors already computed; scores are inner products (``ip``) or
        negated squared L2 distances (``l2``), so higher is always better."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        queries = _vectors(vectors, self.dim)
        spec = self.config.index
        fetch = min(max(k, spec.rescore), len(self.ids))
        scores, positions = self.index.search(queries, fetch)
        if spec.rescore:
            scores, positions = self._exact_top_k(queries, positions, min(k, fetch))
        elif spec.metric == "l2":
            scores = -scores
        # IVF/HNSW return -1 where fewer than k vectors were reached.
        return run_from_matrix(list(query_ids), self.ids, positions, scores, positions >= 0, name)

    def _exact_top_k(
        self, queries: np.ndarray, positions: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Re-score candidate ``positions`` with the stored vectors and keep the best ``k`` per query."""
        valid = positions >= 0
        candidates = np.zeros(positions.shape + (self.dim,), dtype=np.float32)
        wanted = positions[valid]
        # Reading rows in file order keeps memory-mapped access sequential.
        order = np.argsort(wanted, kind="stable")
        rows = np.empty((len(wanted), self.dim), dtype=np.float32)
        rows[order] = self.embeddings[wanted[order]]
        candidates[valid] = rows
        if self.config.index.metric == "ip":
            exact = np.einsum("qkd,qd->qk", candidates, queries)
        else:
            exact = -np.square(candidates - queries[:, None, :]).sum(axis=2)
        exact[~valid] = -np.inf
        best = np.argsort(-exact, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(exact, best, axis=1), np.take_along_axis(positions, best, axis=1)

    def save(self, directory: str | Path) -> None:
        """Write embeddings, FAISS index, ids and manifest to ``directory`` (replaced atomically)."""
        with atomic_directory(directory) as staging:
            np.save(staging / "embeddings.npy", np.asarray(self.embeddings, dtype=np.float32))
            cpu_index = faiss.index_gpu_to_cpu(self.index) if _on_gpu(self.index) else self.index
            faiss.write_index(cpu_index, str(staging / "index.faiss"))
            self.ids.to_frame().write_parquet(staging / "ids.parquet")
            config = asdict(self.config)
            for machine_setting in ("device", "gpus"):  # of the machine searching, not of the index
                config.pop(machine_setting)
            write_manifest(
                staging,
                {
                    "kind": "dense",
                    "format_version": FORMAT_VERSION,
                    "encoder_identity": self.encoder_identity,
                    "dim": self.dim,
                    "metric": self.config.index.metric,
                    "size": len(self.ids),
                    "config": config,
                    "corpus_fingerprint": self.fingerprint,
                    "faiss_version": faiss.__version__,
                },
            )

    @classmethod
    def load(
        cls,
        directory: str | Path,
        encoder: TextEncoder | None,
        corpus: pl.DataFrame | Mapping[str, Any] | None = None,
        device: Device = "auto",
        gpus: GpuLayout = "one",
    ) -> DenseRetriever:
        """Load a saved index; embeddings are memory-mapped.

        ``encoder`` must be the model the index was built with (same identity and dimension);
        ``None`` loads it for :meth:`search_vectors` only. With ``corpus`` (the table, or its record
        as the corpus asset wrote it: no hashing), also checks it is the corpus the index was built
        from. ``device`` and ``gpus`` place the index for searching, as in :class:`DenseConfig`.
        """
        directory = Path(directory)
        manifest = read_manifest(directory, "dense", FORMAT_VERSION)
        if encoder is not None:
            if encoder.identity != manifest["encoder_identity"]:
                raise IndexMismatchError(
                    f"{directory}: index built with encoder {manifest['encoder_identity']}, given encoder "
                    f"{encoder.identity}; query with the same model or rebuild the index"
                )
            if encoder.dim != manifest["dim"]:
                raise IndexMismatchError(
                    f"{directory}: index dimension {manifest['dim']}, encoder dimension {encoder.dim}"
                )
        if corpus is not None:
            check_corpus(manifest, corpus, directory)
        embeddings = np.load(directory / "embeddings.npy", mmap_mode="r", allow_pickle=False)
        index = faiss.read_index(str(directory / "index.faiss"))
        ids = pl.read_parquet(directory / "ids.parquet")["id"]
        size, dim = manifest["size"], manifest["dim"]
        if (
            embeddings.shape != (size, dim)
            or index.ntotal != size
            or index.d != dim
            or len(ids) != size
        ):
            raise IndexFormatError(
                f"{directory}: files disagree with the manifest (size {size}, dim {dim}): embeddings "
                f"{embeddings.shape}, index {index.ntotal}×{index.d}, {len(ids)} ids"
            )
        stored = manifest["config"]
        config = DenseConfig(
            **{**stored, "index": FaissIndexSpec(**stored["index"]), "device": device, "gpus": gpus}
        )
        _check_gpus(config.index, device, gpus)
        index = (
            _across_gpus(index, config.index, gpus)
            if gpus != "one"
            else _to_device(index, config.index, device)
        )
        _set_search_parameters(index, config.index)
        return cls(
            ids,
            embeddings,
            index,
            encoder,
            manifest["encoder_identity"],
            config,
            manifest["corpus_fingerprint"],
        )
