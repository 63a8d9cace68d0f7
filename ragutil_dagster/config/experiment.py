"""The whole experiment config: its sections, their cross-checks, the settings and partitions of
the grid, and the fingerprints of the config and of the slice one partition reads."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from ragutil_dagster.config.base import Slug, _Strict
from ragutil_dagster.config.data import DatasetConfig, RerankerConfig, RetrieverConfig
from ragutil_dagster.config.generators import GeneratorConfig
from ragutil_dagster.config.partition_keys import (
    Setting,
    embedding_partition_key,
    index_partition_key,
)
from ragutil_dagster.config.prompts import PromptConfig
from ragutil_dagster.config.sampling import SamplingConfig
from ragutil_dagster.config.sections import (
    CompressorConfig,
    ConsensConfig,
    ERAGConfig,
    MultistepConfig,
    NliConfig,
    UtilityConfig,
    ValidityConfig,
)
from ragutil_dagster.infra.files import stable_hash, user_path


class ExperimentConfig(_Strict):
    """One evaluation grid: every dataset × retriever × k (× reranker) (× compressor, beside the
    uncompressed setting) × generator."""

    name: Slug
    seed: int = 0
    # Resamples of the bootstrap intervals around rank correlations (eRAG Table 1).
    bootstrap_resamples: int = Field(1000, ge=20)
    datasets: list[DatasetConfig] = Field(min_length=1)
    retrievers: list[RetrieverConfig] = Field(min_length=1)
    k: list[int] = Field(min_length=1)
    reranker: RerankerConfig | None = None
    generators: list[GeneratorConfig] = Field(min_length=1)
    nli: NliConfig
    sampling: SamplingConfig = SamplingConfig()
    prompts: PromptConfig = PromptConfig()
    consens: ConsensConfig = ConsensConfig()
    erag: ERAGConfig = ERAGConfig()
    utility: UtilityConfig = UtilityConfig()
    # Off unless given (``validity: {}`` takes the defaults): it samples every positive and
    # negative alone, N + 1 generations each.
    validity: ValidityConfig | None = None
    # Context compressors: each adds a compressed setting beside every uncompressed one. None (not
    # an empty list) when absent, so a config without compression keeps its fingerprint.
    compression: list[CompressorConfig] | None = None
    # Multi-step RAG: rounds 2..steps of each chained setting as settings of their own. None when
    # absent, so a config without it keeps its fingerprint.
    multistep: MultistepConfig | None = None

    @field_validator("k")
    @classmethod
    def _positive_distinct_k(cls, values: list[int]) -> list[int]:
        if any(v < 1 for v in values) or len(set(values)) != len(values):
            raise ValueError(f"k values must be distinct positive integers, got {values}")
        return sorted(values)

    @model_validator(mode="after")
    def _unique_names(self) -> ExperimentConfig:
        for what, names in (
            ("dataset", [d.name for d in self.datasets]),
            ("retriever", [r.name for r in self.retrievers]),
            ("generator", [g.name for g in self.generators]),
        ):
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                raise ValueError(f"{what} names must be unique; repeated: {repeated}")
        datasets = {d.name for d in self.datasets}
        for retriever in self.retrievers:
            if isinstance(retriever.path, dict) and set(retriever.path) != datasets:
                raise ValueError(
                    f"run retriever {retriever.name!r} names run files for datasets {sorted(retriever.path)}; "
                    f"give one for each dataset of this config, {sorted(datasets)}, and no other"
                )
        indexed = {r.name for r in self.indexed_retrievers()}
        for retriever in self.retrievers:
            if unknown := sorted(set(retriever.fuse or ()) - indexed):
                raise ValueError(
                    f"hybrid retriever {retriever.name!r} fuses {unknown}, not a bm25 or dense retriever "
                    f"of this config ({sorted(indexed)})"
                )
        if self.reranker and max(self.k) > self.reranker.candidates:
            raise ValueError(
                f"the reranker reorders {self.reranker.candidates} candidates, fewer than k = {max(self.k)}"
            )
        if self.reranker and self.utility.candidates > self.reranker.candidates:
            raise ValueError(
                f"utility.candidates ({self.utility.candidates}) exceeds the {self.reranker.candidates} "
                "passages the reranker ranks (reranker.candidates): the utility candidates are the "
                "setting's ranking"
            )
        return self

    @model_validator(mode="after")
    def _compression_inputs(self) -> ExperimentConfig:
        if self.compression is None:
            return self
        names = [c.key for c in self.compression]
        if repeated := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(
                f"compression: compressor names must be unique; repeated: {repeated} (give 'name')"
            )
        if self.consens.leave_one_out:
            raise ValueError(
                "consens.leave_one_out leaves out whole passages, which a compressed context no longer "
                "has; turn it off or remove the compression section"
            )
        return self

    @model_validator(mode="after")
    def _multistep_inputs(self) -> ExperimentConfig:
        multistep = self.multistep
        if multistep is None:
            return self
        generators = [g.name for g in self.generators]
        if multistep.query_writer is not None and multistep.query_writer not in generators:
            raise ValueError(
                f"multistep.query_writer: {multistep.query_writer!r} is not a generator of this config "
                f"({generators}); name one of them (add the writer to generators to use another model)"
            )
        named = multistep.retrievers or []
        if unknown := sorted(set(named) - {r.name for r in self.retrievers}):
            raise ValueError(f"multistep.retrievers: {unknown} are not retrievers of this config")
        if run := sorted(name for name in named if self.retriever(name).kind == "run"):
            raise ValueError(
                f"multistep.retrievers: {run} are of kind run: a run file ranks only the dataset's "
                "questions and cannot be searched for a written query"
            )
        if not self.multistep_retrievers():
            raise ValueError(
                "multistep: every retriever of this config is of kind run; none can run rounds"
            )
        if multistep.max_passages is not None and multistep.max_passages < max(self.k):
            raise ValueError(
                f"multistep.max_passages ({multistep.max_passages}) is below k = {max(self.k)}: "
                "round 1's context alone would not fit"
            )
        return self

    @model_validator(mode="after")
    def _validity_inputs(self) -> ExperimentConfig:
        if self.validity is None:
            return self
        if "hard" in self.validity.negatives and self.hard_negative_retriever() is None:
            raise ValueError(
                "validity.negatives: hard negatives are the best-ranked BM25 passages; add a retriever "
                "of kind bm25 or leave 'hard' out"
            )
        for position, dataset in enumerate(self.datasets):
            if dataset.format == "qa" and not dataset.qrels:
                raise ValueError(
                    f"validity needs relevance judgments: datasets.{position} ({dataset.name!r}, format qa) "
                    f"has no 'qrels' file, so its qrels only say which passages hold an answer; give "
                    f"datasets.{position}.qrels or remove the validity section"
                )
        return self

    # --- partitions --------------------------------------------------------------------------

    def settings(self) -> list[Setting]:
        """Every dataset × retriever × k (× reranker): uncompressed, then once per compressor, then
        (a multi-step retriever's) once per round after the first."""
        reranker = self.reranker.name if self.reranker else None
        compressors = [None, *(c.key for c in self.compression or ())]
        chained = {r.name for r in self.multistep_retrievers()}
        rounds = range(2, self.multistep.steps + 1) if self.multistep else range(0)
        return [
            setting
            for dataset in self.datasets
            for retriever in self.retrievers
            for k in self.k
            for setting in [
                *(
                    Setting(dataset.name, retriever.name, k, reranker, compressor)
                    for compressor in compressors
                ),
                *(
                    Setting(dataset.name, retriever.name, k, reranker, step=step)
                    for step in (rounds if retriever.name in chained else ())
                ),
            ]
        ]

    def multistep_retrievers(self) -> list[RetrieverConfig]:
        """The retrievers whose settings go through multi-step rounds (none without ``multistep``)."""
        if self.multistep is None:
            return []
        named = self.multistep.retrievers
        return [r for r in self.retrievers if (r.name in named if named else r.kind != "run")]

    def query_writer(self) -> GeneratorConfig:
        """The generator writing the next query of multi-step rounds: ``multistep.query_writer``,
        or the config's first generator."""
        assert self.multistep is not None, "no multistep section"
        return self.generator(self.multistep.query_writer or self.generators[0].name)

    def compressor(self, setting: Setting) -> CompressorConfig | None:
        """The compressor of ``setting``; None for an uncompressed one."""
        if setting.compressor is None:
            return None
        return next(c for c in self.compression or () if c.key == setting.compressor)

    def setting(self, key: str) -> Setting:
        for setting in self.settings():
            if setting.key == key:
                return setting
        raise KeyError(f"no setting {key!r} in experiment {self.name!r}")

    def dataset(self, name: str) -> DatasetConfig:
        return _by_name(self.datasets, name, "dataset")

    def retriever(self, name: str) -> RetrieverConfig:
        return _by_name(self.retrievers, name, "retriever")

    def generator(self, name: str) -> GeneratorConfig:
        return _by_name(self.generators, name, "generator")

    def prompts_for(self, generator: str) -> PromptConfig:
        """The templates generator ``generator`` is prompted with: ``prompts`` with the
        generator's own ``prompts`` in place of the roles it sets."""
        return self.prompts.overridden(self.generator(generator).prompts)

    def indexed_retrievers(self) -> list[RetrieverConfig]:
        """The retrievers with an index of their own: bm25 and dense (a hybrid fuses theirs, a run
        retriever's ranking is read from its file)."""
        return [r for r in self.retrievers if r.kind in ("bm25", "dense")]

    def run_file(self, dataset: str, retriever: str) -> Path:
        """The run file of run retriever ``retriever`` for ``dataset``, expanded as a user path."""
        files = self.retriever(retriever).run_files()
        return user_path(files[dataset] if dataset in files else files[None])

    def run_file_partitions(self) -> dict[str, tuple[str, str]]:
        """Every run file's partition key (dataset × retriever, as an index's) → (dataset, retriever)."""
        return {
            index_partition_key(dataset.name, retriever.name): (dataset.name, retriever.name)
            for dataset in self.datasets
            for retriever in self.retrievers
            if retriever.kind == "run"
        }

    def embedding_partitions(self) -> dict[str, list[str]]:
        """The ``passage_embeddings`` partition keys of every dense index, by index partition key."""
        return {
            index_partition_key(dataset.name, retriever.name): [
                embedding_partition_key(
                    index_partition_key(dataset.name, retriever.name),
                    shard,
                    retriever.embedding_shards,
                )
                for shard in range(1, retriever.embedding_shards + 1)
            ]
            for dataset in self.datasets
            for retriever in self.retrievers
            if retriever.kind == "dense"
        }

    def hard_negative_retriever(self) -> RetrieverConfig | None:
        """The bm25 retriever whose ranking gives validity's hard negatives (the config's first),
        or None when no validity negative is hard."""
        if self.validity is None or "hard" not in self.validity.negatives:
            return None
        return next((r for r in self.retrievers if r.kind == "bm25"), None)

    def searched_indexes(self, setting: Setting) -> list[str]:
        """The index partitions ``setting`` searches: its retriever's, a hybrid's fused ones, or
        none for a run retriever."""
        retriever = self.retriever(setting.retriever)
        if retriever.kind == "run":
            return []
        return [
            index_partition_key(setting.dataset, name)
            for name in retriever.fuse or [retriever.name]
        ]

    def fingerprint(self) -> str:
        """Hash of the whole config: part of every MLflow run key. Unset optional settings
        (``None``) are left out, so that a new optional setting does not change the keys of
        configs that do not use it; a changed non-``None`` default does change them."""
        return stable_hash(self.model_dump(mode="json", exclude_none=True), 16)

    def partition_fingerprint(self, parts: Iterable[str] | None) -> str:
        """Hash of the part of the config one partition reads (:meth:`partition_config`): a
        partition whose slice is unchanged need not run again (``ragutil run``), and its MLflow
        run counts as this config's (the ``partition_config_fingerprint`` param)."""
        return stable_hash(self.partition_config(parts), 16)

    def partition_config(self, parts: Iterable[str] | None) -> dict:
        """The config a partition reads, given its key's parts (a dataset, index, embedding shard,
        setting or generator key each; a multi-partition key's dimensions): every section shared
        by the grid (sampling, nli, prompts, seed, …) and, of the per-partition sections, only the
        datasets, retrievers (with those a hybrid fuses), generators, reranker and compressor the
        parts name. ``None`` (an unpartitioned asset, which reads every partition): all of it."""
        whole = self.model_dump(mode="json", exclude_none=True)
        if parts is None:
            return whole
        datasets, retrievers, generators, settings = set(), set(), set(), []
        by_setting = {s.key: s for s in self.settings()}
        indexes = {
            index_partition_key(d.name, r.name): (d.name, r.name)
            for d in self.datasets
            for r in self.retrievers
        }
        shards = {
            shard: index for index, keys in self.embedding_partitions().items() for shard in keys
        }
        for part in parts:
            part = shards.get(part, part)
            known = False
            if part in by_setting:
                setting = by_setting[part]
                settings.append(setting)
                datasets.add(setting.dataset)
                retrievers.add(setting.retriever)
                known = True
            if part in indexes:
                datasets.add(indexes[part][0])
                retrievers.add(indexes[part][1])
                known = True
            if part in {d.name for d in self.datasets}:
                datasets.add(part)
                known = True
            if part in {g.name for g in self.generators}:
                generators.add(part)
                known = True
            if not known:
                raise KeyError(f"{part!r} is no partition key of experiment {self.name!r}")
        retrievers |= {
            name for r in self.retrievers if r.name in retrievers for name in r.fuse or ()
        }
        compressors = {s.compressor for s in settings}
        return {
            **{name: value for name, value in whole.items() if name not in PER_PARTITION_SECTIONS},
            "datasets": [d for d in whole["datasets"] if d["name"] in datasets],
            "retrievers": [r for r in whole["retrievers"] if r["name"] in retrievers],
            "generators": [g for g in whole["generators"] if g["name"] in generators],
            "settings": [s.key for s in settings],  # k, reranker and compressor names included
            **({"reranker": whole["reranker"]} if any(s.reranker for s in settings) else {}),
            "compression": [
                c.model_dump(mode="json", exclude_none=True)
                for c in self.compression or ()
                if c.key in compressors
            ],
        }


PER_PARTITION_SECTIONS = ("datasets", "retrievers", "generators", "k", "reranker", "compression")
"""The sections of which a partition reads only its own entries (:meth:`ExperimentConfig.partition_config`)."""


def _by_name(items: list, name: str, what: str):
    for item in items:
        if item.name == name:
            return item
    raise KeyError(f"no {what} named {name!r}; configured: {[i.name for i in items]}")
