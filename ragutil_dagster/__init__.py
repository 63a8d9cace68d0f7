"""ragutil: retrieval utility in RAG, measured with five papers' metrics as Dagster assets."""

__version__ = "0.1.0"
