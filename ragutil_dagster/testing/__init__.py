"""What the tests and bench build and the pipeline never uses: tiny, randomly initialised local
models (``tiny.py``) standing in for real checkpoints."""
