"""A partition's datasets and models as MLflow entities, not only as strings among the params.

- Datasets: the queries (with their gold answers), the corpus, and the contexts the setting
  retrieved for them are logged as run inputs (``log_inputs``). Each digest is computed from the
  content by ragutil (MLflow's own polars digest depends on the polars version), so the same data
  has the same digest on every machine and the MLflow UI groups runs by dataset.
- Models: the generator, the NLI model, the embedder and the reranker are external LoggedModels
  in the run's experiment (the dataset's), keyed by their identity (hub commit, directory or GGUF
  hash, registry version): a run re-uses the model an earlier run of the experiment created, and
  a new revision adds exactly one. The run lists them as model inputs. The MLflow UI's run page
  finds a run's models only in the run's own experiment, so one shared experiment of models would
  leave them off every run page; the price is one LoggedModel per identity and dataset.
- The run's metrics are linked to the generator's model and to the contexts dataset, so
  ``search_logged_models`` ranks generators on the same retrieved contexts (docs/mlflow.md).
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from ragutil_dagster.data.qa import dataset_folder
from ragutil_dagster.infra.files import stable_hash
from ragutil_dagster.infra.redaction import redact
from ragutil_dagster.tracking.keys import PartitionRun
from ragutil_dagster.tracking.resource import MlflowTracking, TrackedRun

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Dataset

MODEL_KEY_TAG = "ragutil.model_key"
MODEL_ROLE_TAG = "ragutil.model_role"
MODEL_IDENTITY_TAG = "ragutil.model_identity"
SPLIT_TAG = "ragutil.split"
DIGEST_LENGTH = 32  # MLflow stores at most 36 characters of a dataset digest


@dataclass(frozen=True)
class PartitionDatasets:
    """The three datasets a partition was evaluated on, as MLflow dataset entities."""

    queries: Dataset
    corpus: Dataset
    contexts: Dataset


def table_digest(table: pl.DataFrame) -> str:
    """A digest of a table's columns and rows, the same on every machine and polars version."""
    return stable_hash({"columns": table.columns, "rows": table.rows()}, DIGEST_LENGTH)


def partition_datasets(
    tracked: PartitionRun,
    queries: pl.DataFrame,
    corpus: Mapping[str, object],
    contexts: pl.DataFrame,
) -> PartitionDatasets:
    """The queries with answers and the corpus of the dataset (source: its folder, name with its
    split), and the contexts the setting retrieved for the queries. The corpus comes as its
    record (``data.corpus.corpus_record``: fingerprint, rows, column types), never its rows."""
    from mlflow.data import from_polars
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.entities import Dataset

    spec = tracked.experiment.dataset(tracked.setting.dataset)
    with warnings.catch_warnings():
        # MLflow registers its local-artifact source twice and warns that a file URI is ambiguous.
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(dataset_folder(spec).resolve().as_uri())

    def entity(table: pl.DataFrame, name: str, digest: str, **options: object) -> Dataset:
        return from_polars(table, source, name=name, digest=digest, **options)._to_mlflow_entity()

    # The corpus's columns are validated strings (data.corpus): its schema from an empty frame
    # of them, its profile counting its passages, its digest the fingerprint (its identity).
    described = entity(
        pl.DataFrame(schema={name: pl.String() for name in corpus["columns"]}),  # type: ignore[union-attr]
        f"{spec.name}/corpus",
        str(corpus["fingerprint"]).removeprefix("sha256:")[:DIGEST_LENGTH],
    )
    corpus_entity = Dataset(
        described.name,
        described.digest,
        described.source_type,
        described.source,
        described.schema,
        json.dumps(
            {
                "num_rows": corpus["rows"],
                "num_elements": int(corpus["rows"]) * len(corpus["columns"]),
            }
        ),  # type: ignore[arg-type]
    )
    return PartitionDatasets(
        queries=entity(
            queries, f"{spec.name}/{spec.split}/queries", table_digest(queries), targets="answers"
        ),
        corpus=corpus_entity,
        contexts=entity(
            contexts, f"{tracked.setting.key}/{spec.split}/contexts", table_digest(contexts)
        ),
    )


def log_datasets(run: TrackedRun, datasets: PartitionDatasets, split: str) -> None:
    """Log the datasets as the run's inputs: the queries and contexts in context ``eval``, the
    corpus in context ``corpus``. The store keeps one input per (name, digest) and run, so
    logging them again on a re-used run adds nothing."""
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    def entry(dataset: Dataset, context: str) -> DatasetInput:
        tags = [InputTag(MLFLOW_DATASET_CONTEXT, context), InputTag(SPLIT_TAG, split)]
        return DatasetInput(dataset, tags)

    run.client.log_inputs(
        run.run_id,
        datasets=[
            entry(datasets.queries, "eval"),
            entry(datasets.corpus, "corpus"),
            entry(datasets.contexts, "eval"),
        ],
    )


@dataclass(frozen=True)
class ModelSpec:
    """One model of a partition: its role, configured name and reference, and resolved identity."""

    role: str
    name: str
    reference: str
    revision: str | None
    identity: str

    @property
    def key(self) -> str:
        """The LoggedModel's key: the identity alone, so every role and run of an experiment
        using the same weights shares one model."""
        return stable_hash({"identity": self.identity}, 32)

    @property
    def mlflow_name(self) -> str:
        """A LoggedModel name (MLflow refuses ``/ : . % " '``): role, name, short identity."""
        short = self.identity.removeprefix("sha256:")[:12]
        return re.sub(r"[/:.%\"']", "-", f"{self.role}-{self.name}-{short}")


def partition_models(tracked: PartitionRun) -> list[ModelSpec]:
    """The generator, NLI model, embedder (dense retrievers) and reranker (when the setting
    reranks) of a partition, with the identities the run key was computed from."""
    experiment, identities = tracked.experiment, tracked.identities
    generator = experiment.generator(tracked.generator)
    models = [
        ModelSpec(
            "generator", generator.name, generator.model, generator.revision, identities.generator
        ),
        ModelSpec("nli", "nli", experiment.nli.model, experiment.nli.revision, identities.nli),
    ]
    retriever = experiment.retriever(tracked.setting.retriever)
    if retriever.model and identities.embedder:
        models.append(
            ModelSpec(
                "embedder", retriever.name, retriever.model, retriever.revision, identities.embedder
            )
        )
    if tracked.setting.reranker and identities.reranker:
        reranker = experiment.reranker
        models.append(
            ModelSpec(
                "reranker", reranker.name, reranker.model, reranker.revision, identities.reranker
            )
        )
    return models


def find_logged_model(client: MlflowClient, experiment_id: str, key: str):
    """The oldest live LoggedModel tagged with ``key``, or ``None``."""
    found = client.search_logged_models(
        [experiment_id],
        filter_string=f"tags.`{MODEL_KEY_TAG}` = '{key}'",
        max_results=1,
        order_by=[{"field_name": "creation_timestamp", "ascending": True}],
    )
    return found[0] if found else None


def logged_model_id(tracking: MlflowTracking, experiment_id: str, spec: ModelSpec) -> str:
    """The id of the external LoggedModel of ``spec``'s identity in the experiment, created on
    first use.

    Find-then-create holds the model's claim (``MlflowTracking.claim``), so no two processes
    create the same model (MLflow has no unique constraint on tags)."""
    from mlflow.entities import LoggedModelStatus
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_IS_EXTERNAL

    client = tracking.client()
    with tracking.claim(f"model-{experiment_id}-{spec.key}"):
        existing = find_logged_model(client, experiment_id, spec.key)
        if existing is not None:
            return existing.model_id
        model = client.create_logged_model(
            experiment_id,
            name=spec.mlflow_name,
            model_type=spec.role,
            # What mlflow.create_external_model sets: the weights live outside MLflow.
            tags={
                MLFLOW_MODEL_IS_EXTERNAL: "true",
                MODEL_KEY_TAG: spec.key,
                MODEL_ROLE_TAG: spec.role,
                MODEL_IDENTITY_TAG: spec.identity,
            },
            params={
                "name": spec.name,
                "model": redact(spec.reference),
                "revision": spec.revision or "none",
                "identity": spec.identity,
            },
        )
        client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
        return model.model_id


def link_partition(
    tracking: MlflowTracking,
    run: TrackedRun,
    tracked: PartitionRun,
    queries: pl.DataFrame,
    corpus: Mapping[str, object],
    contexts: pl.DataFrame,
) -> TrackedRun:
    """Log the partition's datasets and models as the run's inputs; return the run whose
    metrics are linked to the generator's model and the contexts dataset."""
    from mlflow.entities import LoggedModelInput

    datasets = partition_datasets(tracked, queries, corpus, contexts)
    split = tracked.experiment.dataset(tracked.setting.dataset).split
    log_datasets(run, datasets, split)
    ids = {
        spec.role: logged_model_id(tracking, run.experiment_id, spec)
        for spec in partition_models(tracked)
    }
    # The store keys a model input by (run, model): logging it again adds nothing.
    run.client.log_inputs(run.run_id, models=[LoggedModelInput(i) for i in ids.values()])
    return dataclasses.replace(
        run,
        model_id=ids["generator"],
        dataset=(datasets.contexts.name, datasets.contexts.digest),
    )
