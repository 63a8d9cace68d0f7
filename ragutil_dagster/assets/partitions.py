"""Partitions from the experiment config and the mappings between them.

``dataset`` → ``embedding`` (dense index × shard) → ``index`` (dataset × retriever) → ``setting``
(dataset × retriever × k × reranker, and multi-step rounds); ``run_file`` (dataset × run retriever) → ``setting``;
``dataset × generator`` for closed-book samples; ``setting × generator`` for everything that
depends on both. Mappings are explicit tables built from the config, so the lineage graph's
partition links are exact.
"""

from dataclasses import dataclass

import dagster as dg

from ragutil_dagster.assets.common import model_asset_key
from ragutil_dagster.config import (
    ExperimentConfig,
    Setting,
    index_partition_key,
    parse_index_partition_key,
)


@dataclass(frozen=True)
class Partitions:
    dataset: dg.StaticPartitionsDefinition
    index: dg.StaticPartitionsDefinition
    setting: dg.StaticPartitionsDefinition
    generator: dg.StaticPartitionsDefinition
    dataset_generator: dg.MultiPartitionsDefinition
    setting_generator: dg.MultiPartitionsDefinition
    embedding: dg.StaticPartitionsDefinition | None
    """The embedding shards of every dense index (``world__e5__shard-2-of-8``); None without any."""
    run_file: dg.StaticPartitionsDefinition | None
    """One partition per dataset × run retriever (``world__mine``); None without a run retriever."""
    experiment: ExperimentConfig

    # --- mappings ------------------------------------------------------------------------

    def dataset_to_index(self) -> dg.StaticPartitionMapping:
        return dg.StaticPartitionMapping(
            {
                d.name: [
                    index_partition_key(d.name, r.name)
                    for r in self.experiment.indexed_retrievers()
                ]
                for d in self.experiment.datasets
            }
        )

    def dataset_to_embedding(self) -> dg.StaticPartitionMapping:
        table: dict[str, list[str]] = {}
        for index, shards in self.experiment.embedding_partitions().items():
            table.setdefault(parse_index_partition_key(index)[0], []).extend(shards)
        return dg.StaticPartitionMapping(table)

    def embedding_to_index(self) -> dg.StaticPartitionMapping:
        """Every shard → its index (a BM25 index has none)."""
        return dg.StaticPartitionMapping(
            {
                shard: index
                for index, shards in self.experiment.embedding_partitions().items()
                for shard in shards
            }
        )

    def index_to_setting(self) -> dg.StaticPartitionMapping:
        table: dict[str, list[str]] = {}
        for setting in self.experiment.settings():
            for index in self.experiment.searched_indexes(setting):
                table.setdefault(index, []).append(setting.key)
        return dg.StaticPartitionMapping(table)

    def run_file_to_setting(self) -> dg.StaticPartitionMapping:
        """A run file (dataset × run retriever) → the settings of that dataset and retriever."""
        table: dict[str, list[str]] = {}
        for setting in self.experiment.settings():
            if self.experiment.retriever(setting.retriever).kind == "run":
                table.setdefault(
                    index_partition_key(setting.dataset, setting.retriever), []
                ).append(setting.key)
        return dg.StaticPartitionMapping(table)

    def dataset_to_setting(self) -> dg.StaticPartitionMapping:
        table: dict[str, list[str]] = {}
        for setting in self.experiment.settings():
            table.setdefault(setting.dataset, []).append(setting.key)
        return dg.StaticPartitionMapping(table)

    def hard_negative_index_to_dataset(self) -> dg.StaticPartitionMapping:
        """The BM25 index ranking validity's hard negatives (config.hard_negative_retriever) → its
        dataset."""
        retriever = self.experiment.hard_negative_retriever()
        assert retriever is not None, "no validity negative is hard"
        return dg.StaticPartitionMapping(
            {index_partition_key(d.name, retriever.name): d.name for d in self.experiment.datasets}
        )

    def dataset_generator_to_setting_generator(self) -> dg.MultiPartitionMapping:
        """dataset × generator → setting × generator: datasets to their settings, generator to itself."""
        return dg.MultiPartitionMapping(
            {
                "dataset": dg.DimensionPartitionMapping("setting", self.dataset_to_setting()),
                "generator": dg.DimensionPartitionMapping(
                    "generator", dg.IdentityPartitionMapping()
                ),
            }
        )

    # --- the partition an asset runs in, read through the mappings above ----------------------

    def setting_of(self, context: dg.AssetExecutionContext) -> Setting:
        """The configured setting of the current partition: a ``setting`` partition, or the
        setting dimension of a setting × generator one."""
        key = context.partition_key
        return self.experiment.setting(
            key.keys_by_dimension["setting"] if isinstance(key, dg.MultiPartitionKey) else key
        )

    def closed_book_partition(self, key: str) -> str:
        """The dataset × generator partition of the closed-book samples that setting × generator
        partition ``key`` reads: :meth:`dataset_generator_to_setting_generator`, inverted by Dagster."""
        upstream = self.dataset_generator_to_setting_generator().get_upstream_mapped_partitions_result_for_partitions(
            self.setting_generator.subset_with_partition_keys([str(key)]),
            self.setting_generator,
            self.dataset_generator,
        )
        (partition,) = upstream.partitions_subset.get_partition_keys()
        return str(partition)

    def dense_retrievers(self) -> dg.StaticPartitionsDefinition | None:
        """One partition per dense retriever (its embedder), or None without any."""
        names = [r.name for r in self.experiment.retrievers if r.kind == "dense"]
        return dg.StaticPartitionsDefinition(names) if names else None

    def model_dependencies(self, kind: str, per_embedding_shard: bool = False) -> list[dg.AssetDep]:
        """The dependency of an asset reading the configured models of ``kind`` on their
        identities, partition to partition: a generator's identity → its partitions, an
        embedder's → the indexes of its retriever (``per_embedding_shard``: their embedding
        shards); the NLI model and the reranker serve all."""
        key = model_asset_key(kind)
        if kind == "generator":
            return [
                dg.AssetDep(
                    key, partition_mapping=dg.MultiToSingleDimensionPartitionMapping("generator")
                )
            ]
        if kind == "embedder":
            table: dict[str, list[str]] = {}
            for index, shards in self.experiment.embedding_partitions().items():
                table.setdefault(parse_index_partition_key(index)[1], []).extend(
                    shards if per_embedding_shard else [index]
                )
            return (
                [dg.AssetDep(key, partition_mapping=dg.StaticPartitionMapping(table))]
                if table
                else []
            )
        if kind == "reranker" and self.experiment.reranker is None:
            return []
        return [dg.AssetDep(key)]

    def query_writer_dependencies(self) -> list[dg.AssetDep]:
        """The dependency of the multi-step rounds' settings on their query writer's identity (a
        generator's partition of ``model/generator``); none without ``multistep``."""
        rounds = [s.key for s in self.experiment.settings() if s.step is not None]
        if not rounds:
            return []
        writer = self.experiment.query_writer().name
        return [
            dg.AssetDep(
                model_asset_key("generator"),
                partition_mapping=dg.StaticPartitionMapping({writer: rounds}),
            )
        ]


def build_partitions(experiment: ExperimentConfig) -> Partitions:
    datasets = [d.name for d in experiment.datasets]
    generators = [g.name for g in experiment.generators]
    dataset = dg.StaticPartitionsDefinition(datasets)
    generator = dg.StaticPartitionsDefinition(generators)
    setting = dg.StaticPartitionsDefinition([s.key for s in experiment.settings()])
    shards = [shard for keys in experiment.embedding_partitions().values() for shard in keys]
    return Partitions(
        dataset=dataset,
        index=dg.StaticPartitionsDefinition(
            [
                index_partition_key(d, r.name)
                for d in datasets
                for r in experiment.indexed_retrievers()
            ]
        ),
        setting=setting,
        generator=generator,
        dataset_generator=dg.MultiPartitionsDefinition(
            {"dataset": dataset, "generator": generator}
        ),
        setting_generator=dg.MultiPartitionsDefinition(
            {"setting": setting, "generator": generator}
        ),
        embedding=dg.StaticPartitionsDefinition(shards) if shards else None,
        run_file=dg.StaticPartitionsDefinition(list(runs))
        if (runs := experiment.run_file_partitions())
        else None,
        experiment=experiment,
    )


def dimension(context: dg.AssetExecutionContext, name: str) -> str:
    """One dimension of the current multi-partition key."""
    key = context.partition_key
    assert isinstance(key, dg.MultiPartitionKey), f"expected a multi-partition key, got {key!r}"
    return key.keys_by_dimension[name]
