"""The evaluation itself, without Dagster: datasets, condition prompts, sampling, NLI and scores.

Assets (``ragutil_dagster.assets``) and the ``ragutil`` CLI are thin layers over these functions,
so a scripted run and a Dagster materialisation compute exactly the same tables.
"""
