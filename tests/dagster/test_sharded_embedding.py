"""Sharded embedding through the graph: a dense retriever with ``embedding_shards: 3`` is embedded by
three ``passage_embeddings`` partitions into one file, and its index retrieves what the same
retriever with one shard retrieves."""

from __future__ import annotations

import os

import dagster as dg
import numpy as np
import pytest
from polars.testing import assert_frame_equal

from ragutil_dagster.assets import build_assets
from ragutil_dagster.assets.common import GPU_POOL
from ragutil_dagster.config import parse_config
from ragutil_dagster.definitions import build_definitions
from ragutil_dagster.errors import IncompleteEmbeddingsError
from ragutil_dagster.resources import ArtifactStore
from ragutil_dagster.runner import plan

SHARDS = ["world__dense__shard-1-of-3", "world__dense__shard-2-of-3", "world__dense__shard-3-of-3"]


def dense_experiment(tiny_world, make_tiny_config, shards: int):
    _, world, models = tiny_world
    config = make_tiny_config(models, world)
    config["retrievers"] = [{**config["retrievers"][1], "embedding_shards": shards}]
    return parse_config(config)


def materialise_retrieval(
    experiment, home, instance: dg.DagsterInstance, skip: set[str] = frozenset()
) -> None:
    """The steps of ``ragutil run`` up to the retrieval runs, one Dagster run per partition (those in
    ``skip`` left out), as the runner runs them in process."""
    defs = build_definitions(experiment, str(home))
    _, assets = build_assets(experiment)
    for names, keys in plan(assets):
        for key in keys:
            if key in skip:
                continue
            dg.materialize(
                list(defs.assets),
                selection=names,
                partition_key=key,
                instance=instance,
                resources=dict(defs.resources),
            )
        if "retrieval_run" in names:
            return


@pytest.fixture(scope="module")
def three_shards(tiny_world, make_tiny_config, tmp_path_factory):
    experiment = dense_experiment(tiny_world, make_tiny_config, 3)
    home, instance = tmp_path_factory.mktemp("three-shards"), dg.DagsterInstance.ephemeral()
    materialise_retrieval(experiment, home, instance)
    return experiment, home, instance


def test_the_lineage_has_the_passage_embeddings_between_corpus_and_index(three_shards) -> None:
    experiment, home, _ = three_shards
    graph = build_definitions(experiment, str(home)).resolve_asset_graph()

    def parents(asset: str) -> set[str]:
        return {key.to_user_string() for key in graph.get(dg.AssetKey(asset)).parent_keys}

    assert parents("passage_embeddings") == {"corpus", "model/embedder"}
    assert parents("index") == {"corpus", "passage_embeddings", "model/embedder"}
    assert (
        graph.get(dg.AssetKey("passage_embeddings")).partitions_def.get_partition_keys() == SHARDS
    )
    _, assets = build_assets(experiment)
    pools = {a.op.name: a.op.pool for a in assets if isinstance(a, dg.AssetsDefinition)}
    assert pools["passage_embeddings"] == pools["index"] == GPU_POOL  # one GPU per shard step


def test_three_shards_retrieve_what_one_shard_retrieves(
    three_shards, tiny_world, make_tiny_config, tmp_path
) -> None:
    experiment, home, instance = three_shards
    records = [
        instance.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=dg.AssetKey("passage_embeddings"), asset_partitions=[key]
            ),
            limit=1,
        )
        .records[0]
        .asset_materialization
        for key in SHARDS
    ]
    corpus_rows = ArtifactStore(home=str(home)).read_table("corpus", "world").height
    assert sum(record.metadata["rows"].value for record in records) == corpus_rows
    assert [record.metadata["row_range"].value for record in records] == [
        f"[{start}, {stop}) of {corpus_rows}"
        for start, stop in zip(
            [0, corpus_rows // 3, 2 * corpus_rows // 3],
            [corpus_rows // 3, 2 * corpus_rows // 3, corpus_rows],
        )
    ]
    path = {record.metadata["path"].value for record in records}
    assert len(path) == 1 and path.pop().startswith(
        str(home / "scratch" / "passage_embeddings" / "world__dense")
    )
    index = (
        instance.fetch_materializations(dg.AssetKey("index"), limit=1)
        .records[0]
        .asset_materialization
    )
    assert index.metadata["embedding_shards"].value == 3

    one = dense_experiment(tiny_world, make_tiny_config, 1)
    one_home = tmp_path / "one-shard"
    materialise_retrieval(one, one_home, dg.DagsterInstance.ephemeral())
    sharded_store, one_store = ArtifactStore(home=str(home)), ArtifactStore(home=str(one_home))
    # The shards' vectors are the one-shot vectors (up to the float rounding of other batches).
    vectors = [
        np.load(store.local_files("index", "world__dense", "index") / "embeddings.npy")
        for store in (sharded_store, one_store)
    ]
    np.testing.assert_allclose(vectors[0], vectors[1], atol=1e-6)
    for setting in ("world__dense__k1", "world__dense__k2"):
        sharded_run, one_run = (
            store.read_table("retrieval_run", setting) for store in (sharded_store, one_store)
        )
        assert sharded_run.height == 6 * int(setting[-1])
        assert sharded_run["doc_id"].to_list() == one_run["doc_id"].to_list()
        assert_frame_equal(sharded_run, one_run, check_exact=False, abs_tol=1e-5)


def test_the_index_step_names_the_shard_not_embedded(
    tiny_world, make_tiny_config, tmp_path
) -> None:
    experiment = dense_experiment(tiny_world, make_tiny_config, 3)
    instance = dg.DagsterInstance.ephemeral()
    with pytest.raises(
        IncompleteEmbeddingsError, match=r"not embedded: world__dense__shard-2-of-3; materialise"
    ):
        materialise_retrieval(experiment, tmp_path, instance, skip={"world__dense__shard-2-of-3"})


def test_shards_run_in_processes_of_their_own_on_the_multiprocess_executor(
    three_shards, tiny_world, make_tiny_config, tmp_path, monkeypatch
) -> None:
    """The shard step as ``ragutil run --workers 3`` runs it, the ``gpu`` pool opened to three slots
    (three cards): each shard a Dagster run on the multiprocess executor, in a process of its own,
    all writing into one file — the in-process run's vectors (up to the step processes' own thread
    pools). Whether the three overlapped in time is not asserted: the steps last a fraction of a
    second here; tests/retrieval/test_embedding_shards.py races processes for real."""
    from ragutil_dagster.infra.databases import DAGSTER_HOME_VARIABLE, DAGSTER_POSTGRES_URL_VARIABLE
    from ragutil_dagster.runner import ParallelRuns, dagster_instance

    monkeypatch.delenv(DAGSTER_HOME_VARIABLE, raising=False)
    monkeypatch.delenv(DAGSTER_POSTGRES_URL_VARIABLE, raising=False)
    experiment, in_process_home = dense_experiment(tiny_world, make_tiny_config, 3), three_shards[1]
    home = tmp_path / "home"
    instance = dagster_instance(home)
    instance.event_log_storage.set_concurrency_slots(GPU_POOL, 3)
    defs = build_definitions(experiment, str(home))
    dg.materialize(
        list(defs.assets),
        selection=["queries", "corpus"],
        partition_key="world",
        instance=instance,
        resources=dict(defs.resources),
    )
    runs = ParallelRuns(
        dict(defs.resources),
        experiment,
        instance,
        {},
        {"console": {"config": {"log_level": "WARNING"}}},
        3,
    )
    try:
        outcomes = list(runs.map(["passage_embeddings"], SHARDS, [{}] * len(SHARDS)))
    finally:
        runs.close()
    assert [success for success, _, _ in outcomes] == [True] * 3, outcomes
    records = [
        instance.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=dg.AssetKey("passage_embeddings"), asset_partitions=[key]
            ),
            limit=1,
        ).records[0]
        for key in SHARDS
    ]
    pids = {record.event_log_entry.dagster_event.pid for record in records}
    assert len(pids) == 3 and os.getpid() not in pids

    def vectors(root) -> np.ndarray:
        (path,) = (root / "scratch" / "passage_embeddings" / "world__dense").glob(
            "*/embeddings.npy"
        )
        return np.load(path)

    np.testing.assert_allclose(vectors(home), vectors(in_process_home), atol=1e-6)
