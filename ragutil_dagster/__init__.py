"""ragutil: retrieval utility in RAG, measured with five papers' metrics as Dagster assets."""

import os

# Intel MKL (torch's CPU BLAS) may pick kernels by the memory alignment of each array and, on a
# busy machine, use fewer threads than asked; either changes the order of floating-point sums, so
# two identical runs could differ in the last bits of a log-prob (seen under load). Strict
# conditional numerical reproducibility and a fixed thread count make CPU results bit-identical
# run to run. Both must be set before MKL loads, i.e. before torch is imported; values the user
# set are kept.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
os.environ.setdefault("MKL_DYNAMIC", "FALSE")

__version__ = "0.1.0"
