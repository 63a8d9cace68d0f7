"""Corpus ingest and chunking, BM25 and dense indexes, fusion, reranking, retrieval runs."""
