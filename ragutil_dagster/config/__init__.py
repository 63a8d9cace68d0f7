"""The experiment grid: a YAML file validated into typed config, and the partition keys it implies.

A ``setting`` is dataset × retriever × k (× reranker) (× compressor | multi-step round), written as
one key such as ``world__bm25__k5``, ``world__bm25__k5__bge``, ``world__bm25__k5__truncate-64`` or
``world__bm25__k5__step-2``; a ``generator`` key is a generator's name.
Every name is a lowercase slug so that keys stay readable and split unambiguously on ``__``.

Every name below is imported from here (``from ragutil_dagster.config import X``); it lives in one
module of this package, which imports its siblings' modules directly, never this ``__init__``:

- ``base``: ``SLUG`` / ``Slug``, ``ModelName``, the strict base model (unknown keys are errors),
  ``ModelConfig``;
- ``data``: ``DatasetConfig`` with ``ChunkingConfig``, ``RetrieverConfig`` (``GpuLayout``,
  ``MissingQueries``), ``RerankerConfig``;
- ``prompts``: ``PromptConfig``, ``PromptOverrides``, ``TemplateField`` (a role's template read
  from a built-in, inline text, ``FILE_PREFIX`` or the prompt registry);
- ``generators``: ``GeneratorConfig`` (each backend's own config model lives beside the backend,
  ``models/<name>_backend_config.py``);
- ``sampling``: ``SamplingConfig``, ``AdaptiveSamplingConfig``;
- ``sections``: the papers' sections — ``NliConfig``, ``ConsensConfig``, ``ERAGConfig``,
  ``UtilityConfig``, ``CompressorConfig``, ``MultistepConfig``, ``ValidityConfig``;
- ``partition_keys``: ``KEY_SEPARATOR``, the index and embedding-shard keys, ``Setting``;
- ``experiment``: ``ExperimentConfig`` (settings, partitions, fingerprints);
- ``loading``: ``parse_config``, ``load_config`` (YAML, every problem with its field path).
"""

from ragutil_dagster.config.base import SLUG, ModelConfig, ModelName, Slug
from ragutil_dagster.config.data import (
    ChunkingConfig,
    DatasetConfig,
    GpuLayout,
    MissingQueries,
    RerankerConfig,
    RetrieverConfig,
)
from ragutil_dagster.config.experiment import PER_PARTITION_SECTIONS, ExperimentConfig
from ragutil_dagster.config.generators import GeneratorConfig, GeneratorConfigT
from ragutil_dagster.config.loading import load_config, parse_config
from ragutil_dagster.config.partition_keys import (
    KEY_SEPARATOR,
    Setting,
    embedding_partition_key,
    embedding_shard_name,
    index_partition_key,
    parse_embedding_partition_key,
    parse_index_partition_key,
)
from ragutil_dagster.config.prompts import (
    FILE_PREFIX,
    INLINE_SOURCE,
    PromptConfig,
    PromptOverrides,
    TemplateField,
)
from ragutil_dagster.config.sampling import AdaptiveSamplingConfig, SamplingConfig
from ragutil_dagster.config.sections import (
    DEFAULT_COMPRESSION_EMBEDDER,
    CompressionMethod,
    CompressorConfig,
    ConsensConfig,
    ERAGConfig,
    MultistepConfig,
    NliConfig,
    UtilityConfig,
    ValidityConfig,
)

__all__ = [
    "DEFAULT_COMPRESSION_EMBEDDER",
    "FILE_PREFIX",
    "INLINE_SOURCE",
    "KEY_SEPARATOR",
    "PER_PARTITION_SECTIONS",
    "SLUG",
    "AdaptiveSamplingConfig",
    "ChunkingConfig",
    "CompressionMethod",
    "CompressorConfig",
    "ConsensConfig",
    "DatasetConfig",
    "ERAGConfig",
    "ExperimentConfig",
    "GeneratorConfig",
    "GeneratorConfigT",
    "GpuLayout",
    "MissingQueries",
    "ModelConfig",
    "ModelName",
    "MultistepConfig",
    "NliConfig",
    "PromptConfig",
    "PromptOverrides",
    "RerankerConfig",
    "RetrieverConfig",
    "SamplingConfig",
    "Setting",
    "Slug",
    "TemplateField",
    "UtilityConfig",
    "ValidityConfig",
    "embedding_partition_key",
    "embedding_shard_name",
    "index_partition_key",
    "load_config",
    "parse_config",
    "parse_embedding_partition_key",
    "parse_index_partition_key",
]
