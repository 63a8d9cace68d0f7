"""Every reader of user data: corpora (BEIR / JSONL / Parquet / DPR TSV), chunking, QA datasets and
the records `ragutil score` reads."""
