"""Datasets and models as MLflow entities, without the pipeline: one input per dataset and run,
one LoggedModel per model identity in the run's experiment (where the MLflow UI's run page finds
it) whatever the run, metrics linked to the
generator's model and the contexts dataset, and the ranking query of docs/mlflow.md."""

from __future__ import annotations

import json

import polars as pl
import pytest
from mlflow import MlflowClient

from ragutil_dagster.config import Setting, parse_config
from ragutil_dagster.data.corpus import corpus_record
from ragutil_dagster.tracking import MlflowTracking
from ragutil_dagster.tracking.entities import (
    MODEL_IDENTITY_TAG,
    link_partition,
    partition_models,
    table_digest,
)
from ragutil_dagster.tracking.keys import ModelIdentities, PartitionRun

QUERIES = pl.DataFrame(
    {"query_id": ["q0", "q1"], "question": ["a?", "b?"], "answers": [["x"], ["y"]]}
)
CORPUS = pl.DataFrame({"id": ["d0", "d1"], "title": ["", ""], "text": ["x is here", "y is there"]})


def contexts(first: str) -> pl.DataFrame:
    return pl.DataFrame({"query_id": ["q0", "q1"], "doc_id": [first, "d1"], "rank": [1, 1]})


@pytest.fixture()
def config(tmp_path):
    return parse_config(
        {
            "name": "entities",
            "datasets": [
                {
                    "name": "world",
                    "format": "synthetic",
                    "path": str(tmp_path / "world"),
                    "split": "dev",
                }
            ],
            "retrievers": [
                {"name": "bm25", "kind": "bm25"},
                {"name": "dense", "kind": "dense", "model": "some/embedder"},
            ],
            "k": [1],
            "generators": [
                {"name": "lm0", "model": "some/lm"},
                {"name": "lm1", "model": "other/lm"},
            ],
            "nli": {"model": "some/nli"},
        }
    )


def score(
    tracking: MlflowTracking, tracked: PartitionRun, retrieved: pl.DataFrame, delta: float
) -> str:
    """One partition run as metric_scores logs it: entities first, then metrics."""
    with tracking.run(
        tracked.mlflow_experiment, tracked.key, tracked.run_name, "partition", {}
    ) as run:
        linked = link_partition(tracking, run, tracked, QUERIES, corpus_record(CORPUS), retrieved)
        linked.log_metrics({"delta_seper_s": delta})
    return run.run_id


@pytest.mark.slow
def test_datasets_and_models_are_logged_once_and_linked_to_the_metrics(config, tmp_path) -> None:
    tracking = MlflowTracking(home=str(tmp_path / "home"))
    client = MlflowClient(tracking.uri)
    dense = Setting("world", "dense", 1)
    identities = ModelIdentities("sha256:" + "a" * 64, "sha256:" + "b" * 64, embedder="c" * 40)
    lm0 = PartitionRun(config, dense, "lm0", identities)
    run_id = score(tracking, lm0, contexts("d0"), 0.25)
    score(tracking, lm0, contexts("d0"), 0.25)  # a re-materialisation of the same inputs

    run = client.get_run(run_id)
    inputs = {d.dataset.name: d for d in run.inputs.dataset_inputs}
    assert set(inputs) == {"world/dev/queries", "world/corpus", "world__dense__k1/dev/contexts"}
    assert {t.key: t.value for t in inputs["world/dev/queries"].tags} == {
        "mlflow.data.context": "eval",
        "ragutil.split": "dev",
    }
    assert inputs["world/dev/queries"].dataset.digest == table_digest(QUERIES)
    assert (
        inputs["world/dev/queries"].dataset.source
        == f'{{"uri": "{(tmp_path / "world").as_uri()}"}}'
    )
    # The corpus is described by its record (fingerprint, passages), never loaded for logging.
    corpus = inputs["world/corpus"].dataset
    assert corpus.digest == str(corpus_record(CORPUS)["fingerprint"]).removeprefix("sha256:")[:32]
    assert json.loads(corpus.profile)["num_rows"] == CORPUS.height
    world = run.info.experiment_id
    models = client.search_logged_models([world])
    assert sorted(m.model_type for m in models) == ["embedder", "generator", "nli"]
    assert {m.model_id for m in models} == {i.model_id for i in run.inputs.model_inputs}
    generator = next(m for m in models if m.model_type == "generator")
    assert generator.tags[MODEL_IDENTITY_TAG] == identities.generator
    assert generator.tags["mlflow.model.isExternal"] == "true" and generator.status.name == "READY"
    # Each materialisation adds a value to the metric's history, linked like the first.
    assert {
        (m.key, m.value, m.run_id, m.dataset_name, m.dataset_digest) for m in generator.metrics
    } == {
        (
            "delta_seper_s",
            0.25,
            run_id,
            "world__dense__k1/dev/contexts",
            table_digest(contexts("d0")),
        )
    }

    # Another generator re-uses the NLI model and the embedder: only it is a new LoggedModel.
    lm1 = ModelIdentities("sha256:" + "d" * 64, identities.nli, identities.embedder)
    score(tracking, PartitionRun(config, dense, "lm1", lm1), contexts("d0"), 0.5)
    assert len(client.search_logged_models([world])) == 4
    # A new revision of lm0 adds exactly one model.
    revised = PartitionRun(
        config, dense, "lm0", ModelIdentities("e" * 40, identities.nli, identities.embedder)
    )
    score(tracking, revised, contexts("d0"), 0.1)
    assert len(client.search_logged_models([world])) == 5
    # Another dataset's experiment gets its own models, found by identity across experiments.
    other = config.model_copy(
        update={"datasets": [config.datasets[0].model_copy(update={"name": "other"})]}
    )
    on_other = PartitionRun(other, Setting("other", "dense", 1), "lm0", identities)
    other_run = client.get_run(score(tracking, on_other, contexts("d0"), 0.3))
    elsewhere = other_run.info.experiment_id
    assert {
        client.get_logged_model(i.model_id).experiment_id for i in other_run.inputs.model_inputs
    } == {elsewhere}
    same_nli = client.search_logged_models(
        [world, elsewhere], filter_string=f"tags.`{MODEL_IDENTITY_TAG}` = '{identities.nli}'"
    )
    assert sorted(m.experiment_id for m in same_nli) == sorted([world, elsewhere])
    assert len(client.search_logged_models([world])) == 5

    # The ranking of docs/mlflow.md: generators on the same contexts, best ΔSePer first.
    name, digest = "world__dense__k1/dev/contexts", table_digest(contexts("d0"))
    ranking = client.search_logged_models(
        [world],
        filter_string="tags.`ragutil.model_role` = 'generator'",
        datasets=[{"dataset_name": name, "dataset_digest": digest}],
        order_by=[
            {
                "field_name": "metrics.delta_seper_s",
                "ascending": False,
                "dataset_name": name,
                "dataset_digest": digest,
            }
        ],
    )
    ranked = [m.tags[MODEL_IDENTITY_TAG] for m in ranking]
    assert ranked == [lm1.generator, identities.generator, "e" * 40]


def test_partition_models_follow_the_setting(config) -> None:
    identities = ModelIdentities("g", "n", embedder="e")
    roles = [
        m.role
        for m in partition_models(
            PartitionRun(config, Setting("world", "bm25", 1), "lm0", identities)
        )
    ]
    assert roles == ["generator", "nli"]
    [generator, nli, embedder] = partition_models(
        PartitionRun(config, Setting("world", "dense", 1), "lm0", identities)
    )
    assert (embedder.role, embedder.reference, embedder.identity) == (
        "embedder",
        "some/embedder",
        "e",
    )
    assert generator.key != nli.key and "/" not in generator.mlflow_name
