"""One module per node of the lineage graph (DESIGN.md); :func:`build_assets` wires them for a config."""

import dagster as dg

from ragutil_dagster.assets import (
    closed_book_generations,
    dataset,
    entailment_clusters,
    generations,
    index,
    metric_scores,
    model_identities,
    passage_embeddings,
    reports,
    retrieval_run,
    run_files,
    utility_judgments,
    utility_transfer,
    validity,
    validity_passages,
)
from ragutil_dagster.assets.partitions import Partitions, build_partitions
from ragutil_dagster.config import ExperimentConfig

NODES = (
    dataset,
    index,
    retrieval_run,
    closed_book_generations,
    generations,
    utility_judgments,
    entailment_clusters,
    metric_scores,
    utility_transfer,
    reports,
)


def build_assets(
    experiment: ExperimentConfig,
) -> tuple[Partitions, list[dg.AssetsDefinition | dg.SourceAsset]]:
    """The graph of one config: the model identities and run files it reads (none without a run
    retriever), the passage embeddings of its dense indexes (none without one), one definition per
    node, then the validity experiments (none without a ``validity`` section)."""
    parts = build_partitions(experiment)
    return parts, [
        *model_identities.build(parts),
        *run_files.build(parts),
        *passage_embeddings.build(parts),
        *(node.build(parts) for node in NODES),
        *validity_passages.build(parts),
        *validity.build(parts),
    ]
