"""The evaluation itself, without Dagster: condition prompts, sampling, NLI, scores and ``ragutil
score`` (the readers of datasets and records are in :mod:`ragutil_dagster.data`).

Assets (``ragutil_dagster.assets``) and the ``ragutil`` CLI are thin layers over these functions,
so a scripted run and a Dagster materialisation compute exactly the same tables.
"""
