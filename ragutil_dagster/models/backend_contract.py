"""What a generator backend module declares to register itself (models/backends.py collects them):
the :class:`Backend` entry, the :class:`Placement` its factories are given, and the metrics a
backend must be able to score (:data:`TOKEN_SCORED_METRICS`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ragutil_dagster.config import GeneratorConfig
from ragutil_dagster.models.identity import ModelRef

if TYPE_CHECKING:  # the generation module imports torch; a factory imports it when called
    from ragutil_dagster.models.generation import Generator

# Metrics the generations asset computes from teacher-forced log-probs of the generator (a
# server backend checks at start that it can give them).
TOKEN_SCORED_METRICS = ("consens", "utility_likelihood")


@dataclass(frozen=True)
class Placement:
    """How the model loader resource runs a backend: ``device`` (None: CUDA when present), sequences
    per decoding batch, and whether the backend shows its own progress bars."""

    device: str | None
    batch_rows: int
    show_progress: bool


@dataclass(frozen=True)
class Backend:
    """A generator backend as the registry knows it.

    ``config``: the subclass of :class:`GeneratorConfig` declaring the backend's own keys;
    ``generator(config, local_copy, placement)``: the :class:`Generator`, where ``local_copy`` is
    the configured model resolved on this machine (None only when ``needs_local_copy`` is False:
    a server can run a model this machine has no copy of); ``scorer(generator, placement)``: the
    token scorer on that generator's own weights and prompt formatting (``score``,
    ``score_ids``, ``supports_attention``), never a second copy of the model;
    ``runtime_metadata(generator)``: how this process runs it (e.g. a CPU engine's threads and
    cores), as text metadata for the generations asset."""

    name: str
    config: type[GeneratorConfig]
    generator: Callable[[Any, ModelRef | None, Placement], Generator]
    scorer: Callable[[Any, Placement], Any]
    needs_local_copy: bool = True
    runtime_metadata: Callable[[Any], dict[str, str]] = lambda _generator: {}
