"""BM25 and dense indexes, fusion, reranking, retrieval runs (the corpus readers and chunking
are in :mod:`ragutil_dagster.data`).

Modules (imported one by one, so that reading a run does not load FAISS or numba):

- :mod:`~ragutil_dagster.retrieval.bm25` — BM25 with bm25s (numba backend), saved with a manifest.
- :mod:`~ragutil_dagster.retrieval.dense` — embeddings + FAISS (flat, IVF, HNSW, IVF-PQ; GPU).
- :mod:`~ragutil_dagster.retrieval.fusion` — reciprocal rank fusion.
- :mod:`~ragutil_dagster.retrieval.rerank` — cross-encoder reranking, top-N → k.
- :mod:`~ragutil_dagster.retrieval.runs` — run tables, TREC files, IR evaluation, answer recall.
"""
