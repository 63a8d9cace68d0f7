"""Partitions from the experiment config and the mappings between them.

``dataset`` → ``index`` (dataset × retriever) → ``setting`` (dataset × retriever × k × reranker);
``dataset × generator`` for closed-book samples; ``setting × generator`` for everything that
depends on both. Mappings are explicit tables built from the config, so the lineage graph's
partition links are exact.
"""


from dataclasses import dataclass

import dagster as dg

from ragutil_dagster.assets.common import model_asset_key
from ragutil_dagster.config import ExperimentConfig, index_partition_key


@dataclass(frozen=True)
class Partitions:
    dataset: dg.StaticPartitionsDefinition
    index: dg.StaticPartitionsDefinition
    setting: dg.StaticPartitionsDefinition
    generator: dg.StaticPartitionsDefinition
    dataset_generator: dg.MultiPartitionsDefinition
    setting_generator: dg.MultiPartitionsDefinition
    experiment: ExperimentConfig

    # --- mappings ------------------------------------------------------------------------

    def dataset_to_index(self) -> dg.StaticPartitionMapping:
        return dg.StaticPartitionMapping(
            {d.name: [index_partition_key(d.name, r.name) for r in self.experiment.indexed_retrievers()]
             for d in self.experiment.datasets}
        )

    def index_to_setting(self) -> dg.StaticPartitionMapping:
        table: dict[str, list[str]] = {}
        for setting in self.experiment.settings():
            for index in self.experiment.searched_indexes(setting):
                table.setdefault(index, []).append(setting.key)
        return dg.StaticPartitionMapping(table)

    def dataset_to_setting(self) -> dg.StaticPartitionMapping:
        table: dict[str, list[str]] = {}
        for setting in self.experiment.settings():
            table.setdefault(setting.dataset, []).append(setting.key)
        return dg.StaticPartitionMapping(table)

    def dataset_generator_to_setting_generator(self) -> dg.MultiPartitionMapping:
        """dataset × generator → setting × generator: datasets to their settings, generator to itself."""
        return dg.MultiPartitionMapping({
            "dataset": dg.DimensionPartitionMapping("setting", self.dataset_to_setting()),
            "generator": dg.DimensionPartitionMapping("generator", dg.IdentityPartitionMapping()),
        })


    def dense_retrievers(self) -> dg.StaticPartitionsDefinition | None:
        """One partition per dense retriever (its embedder), or None without any."""
        names = [r.name for r in self.experiment.retrievers if r.kind == "dense"]
        return dg.StaticPartitionsDefinition(names) if names else None

    def model_dependencies(self, kind: str) -> list[dg.AssetDep]:
        """The dependency of an asset reading the configured models of ``kind`` on their
        identities, partition to partition: a generator's identity → its partitions, an
        embedder's → the indexes of its retriever; the NLI model and the reranker serve all."""
        key = model_asset_key(kind)
        if kind == "generator":
            return [dg.AssetDep(key, partition_mapping=dg.MultiToSingleDimensionPartitionMapping("generator"))]
        if kind == "embedder":
            dense = self.dense_retrievers()
            if dense is None:
                return []
            table = {
                name: [index_partition_key(d.name, name) for d in self.experiment.datasets]
                for name in dense.get_partition_keys()
            }
            return [dg.AssetDep(key, partition_mapping=dg.StaticPartitionMapping(table))]
        if kind == "reranker" and self.experiment.reranker is None:
            return []
        return [dg.AssetDep(key)]


def build_partitions(experiment: ExperimentConfig) -> Partitions:
    datasets = [d.name for d in experiment.datasets]
    generators = [g.name for g in experiment.generators]
    dataset = dg.StaticPartitionsDefinition(datasets)
    generator = dg.StaticPartitionsDefinition(generators)
    setting = dg.StaticPartitionsDefinition([s.key for s in experiment.settings()])
    return Partitions(
        dataset=dataset,
        index=dg.StaticPartitionsDefinition(
            [index_partition_key(d, r.name) for d in datasets for r in experiment.indexed_retrievers()]
        ),
        setting=setting,
        generator=generator,
        dataset_generator=dg.MultiPartitionsDefinition({"dataset": dataset, "generator": generator}),
        setting_generator=dg.MultiPartitionsDefinition({"setting": setting, "generator": generator}),
        experiment=experiment,
    )


def dimension(context: dg.AssetExecutionContext, name: str) -> str:
    """One dimension of the current multi-partition key."""
    key = context.partition_key
    assert isinstance(key, dg.MultiPartitionKey), f"expected a multi-partition key, got {key!r}"
    return key.keys_by_dimension[name]
