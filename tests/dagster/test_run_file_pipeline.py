"""A retriever of kind run in the graph: its run file an observable source asset, scored beside
the built-in BM25 it was written from, and a replaced file re-running exactly what it feeds."""

from __future__ import annotations

import hashlib

import dagster as dg
import polars as pl
import pytest
from dagster._core.definitions.data_version import StaleStatus
from dagster._core.definitions.observe import observe
from dagster._utils.test.data_versions import get_stale_status_resolver
from polars.testing import assert_frame_equal

from ragutil_dagster.assets import build_assets
from ragutil_dagster.assets.run_files import RUN_FILE
from ragutil_dagster.automation import build_model_sensor
from ragutil_dagster.config import parse_config
from ragutil_dagster.data.corpus import corpus_record
from ragutil_dagster.data.qa import load_dataset
from ragutil_dagster.definitions import build_definitions
from ragutil_dagster.metrics import catalog
from ragutil_dagster.metrics.erag import erag_measure_names, erag_scores
from ragutil_dagster.resources import ArtifactStore
from ragutil_dagster.retrieval.bm25 import BM25Retriever
from ragutil_dagster.retrieval.runs import evaluate_run, write_trec
from ragutil_dagster.runner import materialize_all, plan
from ragutil_dagster.tables import QRELS, QUERY_CONDITION_COLUMNS
from ragutil_dagster.tracking.partition_run import partition_identities

K = 2
CANDIDATES = 4
RETRIEVAL = ("retrieval_run", "retrieved_passages", "setting_queries", "utility_candidates")
SCORING = (
    "candidate_scores",
    "consens",
    "document_scores",
    "entailment_clusters",
    "generations",
    "group_scores",
    "metric_scores",
    "nli_probabilities",
    "retrieval_correlations",
    "utility_generations",
    "utility_judgments",
    "utility_signals",
    "utility_transfer",
)


def bm25_config(tiny_world, make_tiny_config) -> dict:
    """The tiny experiment with BM25 only, one k and no verbalized judgment (seconds, not minutes)."""
    _, world, models = tiny_world
    config = make_tiny_config(models, world)
    return {
        **config,
        "retrievers": config["retrievers"][:1],
        "k": [K],
        "utility": {"candidates": CANDIDATES, "methods": []},
    }


def write_bm25_run(config: dict, path) -> pl.DataFrame:
    """The project's BM25 ranking of the tiny world's questions, as deep as the retrieval step
    searches, written as a TREC run file."""
    loaded = load_dataset(parse_config(config).dataset("world"))
    index = BM25Retriever.build(
        loaded.corpus, fingerprint=str(corpus_record(loaded.corpus)["fingerprint"])
    )
    queries = loaded.queries.select(
        pl.col("query_id").alias("id"), pl.col("question").alias("text")
    )
    run = index.search(queries, k=CANDIDATES, name="bm25")
    write_trec(run, path, tag="their-system")
    return run


def source_of(assets: list) -> dg.SourceAsset:
    return next(a for a in assets if isinstance(a, dg.SourceAsset) and a.key == RUN_FILE)


def latest(instance: dg.DagsterInstance, asset: str, partition: str) -> dg.AssetMaterialization:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]), limit=1
    ).records
    return records[0].asset_materialization


def materialised(result: dg.ExecuteInProcessResult) -> set[tuple[str, str]]:
    return {
        (e.asset_key.to_user_string(), str(e.partition))
        for e in result.get_asset_materialization_events()
    }


@pytest.fixture(scope="module")
def run_beside_bm25(tiny_world, make_tiny_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("run-file")
    config = bm25_config(tiny_world, make_tiny_config)
    path = root / "mine.trec"
    bm25_run = write_bm25_run(config, path)
    config["retrievers"] = [
        *config["retrievers"],
        {"name": "mine", "kind": "run", "path": str(path)},
    ]
    experiment = parse_config(config)
    home = root / "home"
    defs = build_definitions(experiment, str(home))
    parts, assets = build_assets(experiment)
    instance = dg.DagsterInstance.ephemeral()
    # Observed first, as "Observe sources" in the UI does: Dagster marks a partition stale by the
    # observations after the one its materialisation read, so it needs one to count from.
    observe([source_of(assets)], instance=instance)
    materialize_all(defs, experiment, parts, instance, progress=False)
    return experiment, defs, assets, instance, ArtifactStore(home=str(home)), path, bm25_run


def test_a_run_file_of_bm25_scores_as_bm25(run_beside_bm25) -> None:
    experiment, _, assets, instance, store, path, _ = run_beside_bm25
    keys = {spec.key.to_user_string() for a in assets for spec in getattr(a, "specs", [])} | {
        a.key.to_user_string() for a in assets if isinstance(a, dg.SourceAsset)
    }
    assert "run_file" in keys
    index = next(
        a for a in assets if isinstance(a, dg.AssetsDefinition) and dg.AssetKey("index") in a.keys
    )
    assert index.partitions_def.get_partition_keys() == [
        "world__bm25"
    ]  # no index of a run retriever

    def without_retriever(asset: str, partition: str) -> pl.DataFrame:
        return store.read_table(asset, partition).drop("retriever").sort("query_id", "rank")

    for asset in ("retrieval_run", "utility_candidates"):
        assert_frame_equal(
            without_retriever(asset, f"world__mine__k{K}"),
            without_retriever(asset, f"world__bm25__k{K}"),
        )
    mine, bm25 = (
        store.read_table("metric_scores", f"lm0|world__{r}__k{K}").sort("query_id")
        for r in ("mine", "bm25")
    )
    assert mine.height == 6
    numeric = [c for c, dtype in mine.schema.items() if dtype.is_numeric()]
    assert len(numeric) > 10
    assert_frame_equal(mine.select(numeric), bm25.select(numeric))
    summaries = [
        store.read_json("metric_scores", f"lm0|world__{r}__k{K}", "summary")
        for r in ("mine", "bm25")
    ]
    assert {k: v for k, v in summaries[0].items() if isinstance(v, float)} == pytest.approx(
        {k: v for k, v in summaries[1].items() if isinstance(v, float)}, nan_ok=True
    )
    metadata = latest(instance, "retrieval_run", f"world__mine__k{K}").metadata
    assert (
        metadata["run_file_version"].value
        == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    )
    assert metadata["rows_of_other_queries"].value == 0
    identities = partition_identities(
        experiment,
        experiment.setting(f"world__mine__k{K}"),
        store.read_table("generations", f"lm0|world__mine__k{K}"),
        instance,
        f"lm0|world__mine__k{K}",
    )
    assert (
        identities.run_file == metadata["run_file_version"].value
    )  # a replaced file: a new MLflow run


def test_a_replaced_run_file_reruns_exactly_what_it_feeds(run_beside_bm25) -> None:
    """Observing the run file gives its SHA-256 and marks the run's settings stale once the file is
    replaced by a hand-reordered run; the sensor then requests the run's retrieval step and its
    scoring only, and running those requests materialises nothing of BM25's. A bad file then
    fails the retrieval step and leaves the published run as it was."""
    experiment, defs, assets, instance, store, path, bm25_run = run_beside_bm25

    def observed() -> str:
        result = observe([source_of(assets)], instance=instance)
        (event,) = result.get_asset_observation_events()
        assert event.partition == "world__mine"
        return event.asset_observation_data.asset_observation.tags["dagster/data_version"]

    assert observed() == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    sensor = build_model_sensor(experiment, assets, identity=lambda model, revision: "unchanged")
    baseline = sensor(dg.build_sensor_context())
    assert not sensor(dg.build_sensor_context(cursor=baseline.cursor)).run_requests

    # The second passage of every query first.
    reordered = bm25_run.with_columns(
        pl.when(pl.col("rank") == 1)
        .then(2)
        .when(pl.col("rank") == 2)
        .then(1)
        .otherwise(pl.col("rank"))
        .cast(pl.Int32)
        .alias("rank")
    ).with_columns(pl.col("score").max().over("query_id") + 1 - pl.col("rank"))
    write_trec(reordered, path, tag="their-system-v2")
    assert observed() == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    # What the UI shows after "Observe sources": the run's settings stale, BM25's not.
    stale = get_stale_status_resolver(instance, assets)
    assert stale.get_status(dg.AssetKey("retrieval_run"), f"world__mine__k{K}") == StaleStatus.STALE
    assert stale.get_status(dg.AssetKey("retrieval_run"), f"world__bm25__k{K}") == StaleStatus.FRESH
    changed = sensor(dg.build_sensor_context(cursor=baseline.cursor))
    requests = {
        (tuple(sorted(k.to_user_string() for k in r.asset_selection)), r.partition_key): r
        for r in changed.run_requests
    }
    assert set(requests) == {(RETRIEVAL, f"world__mine__k{K}"), (SCORING, f"lm0|world__mine__k{K}")}

    bm25_before = store.read_table("metric_scores", f"lm0|world__bm25__k{K}")
    order = [name for names, _ in plan(assets) for name in names]
    done: set[tuple[str, str]] = set()
    for (names, partition), request in sorted(
        requests.items(), key=lambda item: order.index(item[0][0][0])
    ):
        result = dg.materialize(
            assets,
            selection=request.asset_selection,
            partition_key=partition,
            instance=instance,
            resources=defs.resources,
        )
        assert result.success
        done |= materialised(result)
    assert done == {(name, f"world__mine__k{K}") for name in RETRIEVAL} | {
        (name, f"lm0|world__mine__k{K}") for name in SCORING
    }

    run = store.read_table("retrieval_run", f"world__mine__k{K}")
    expected = (
        reordered.filter(pl.col("rank") <= K)
        .select("query_id", "rank", "doc_id")
        .sort("query_id", "rank")
    )
    assert_frame_equal(run.select("query_id", "rank", "doc_id").sort("query_id", "rank"), expected)
    mine = store.read_table("metric_scores", f"lm0|world__mine__k{K}").sort("query_id")
    assert mine.height == 6
    assert_frame_equal(store.read_table("metric_scores", f"lm0|world__bm25__k{K}"), bm25_before)
    assert not sensor(dg.build_sensor_context(cursor=changed.cursor)).run_requests

    # A passage id of no corpus on line 3: the step fails naming it, and publishes nothing.
    lines = path.read_text().splitlines()
    lines[2] = lines[2].replace(lines[2].split()[2], "no-such-passage")
    path.write_text("\n".join(lines) + "\n")
    failed = dg.materialize(
        assets,
        selection=list(requests[(RETRIEVAL, f"world__mine__k{K}")].asset_selection),
        partition_key=f"world__mine__k{K}",
        instance=instance,
        resources=defs.resources,
        raise_on_error=False,
    )
    assert not failed.success and not materialised(failed)
    (failure,) = [e for e in failed.all_events if e.is_step_failure]
    message = failure.step_failure_data.error.cause.message
    assert (
        f"{path}:3: field 'doc_id': 'no-such-passage' is not a passage of dataset 'world'"
        in message
    )
    assert_frame_equal(store.read_table("retrieval_run", f"world__mine__k{K}"), run)


@pytest.mark.parametrize("built_in", [["bm25"], []])
def test_run_files_side_by_side_in_the_lineage_graph(
    tiny_world, make_tiny_config, tmp_path, built_in
) -> None:
    """Two run files beside BM25 (or alone): each a partition of ``run_file`` feeding only its own
    settings, no index of theirs; the definitions validate as ``dagster definitions validate`` does."""
    config = bm25_config(tiny_world, make_tiny_config)
    for name in ("mine", "theirs"):
        (tmp_path / f"{name}.trec").write_text("")
    config["retrievers"] = [
        *(r for r in config["retrievers"] if r["name"] in built_in),
        *(
            {"name": n, "kind": "run", "path": str(tmp_path / f"{n}.trec")}
            for n in ("mine", "theirs")
        ),
    ]
    experiment = parse_config(config)
    defs = build_definitions(experiment, str(tmp_path / "home"))
    graph = defs.resolve_asset_graph()
    assert {p.to_user_string() for p in graph.get(dg.AssetKey("retrieval_run")).parent_keys} == {
        "index",
        "queries",
        "corpus",
        "run_file",
    }
    assert graph.get(RUN_FILE).partitions_def.get_partition_keys() == [
        "world__mine",
        "world__theirs",
    ]
    assert graph.get(dg.AssetKey("index")).partitions_def.get_partition_keys() == [
        f"world__{r}" for r in built_in
    ]
    children = graph.get_children_partitions(RUN_FILE, "world__theirs")
    assert {(c.asset_key.to_user_string(), c.partition_key) for c in children} == {
        (name, f"world__theirs__k{K}") for name in RETRIEVAL
    }
    dg.Definitions.validate_loadable(defs)


DROPPED = 2
"""Questions the partial run file leaves out."""


@pytest.fixture(scope="module")
def run_without_some_questions(tiny_world, make_tiny_config, tmp_path_factory):
    """BM25 beside ``partial``: BM25's own ranking as a run file without the rows of the first
    ``DROPPED`` questions, with ``missing_queries: empty``."""
    root = tmp_path_factory.mktemp("run-file-missing")
    config = bm25_config(tiny_world, make_tiny_config)
    bm25_run = write_bm25_run(config, root / "full.trec")
    dropped = sorted(bm25_run["query_id"].unique())[:DROPPED]
    path = root / "partial.trec"
    write_trec(bm25_run.filter(~pl.col("query_id").is_in(dropped)), path, tag="their-system")
    partial = {"name": "partial", "kind": "run", "path": str(path)}
    config["retrievers"] = [*config["retrievers"], {**partial, "missing_queries": "empty"}]
    experiment = parse_config(config)
    home = root / "home"
    defs = build_definitions(experiment, str(home))
    parts, _ = build_assets(experiment)
    instance = dg.DagsterInstance.ephemeral()
    materialize_all(defs, experiment, parts, instance, progress=False)
    refusing = parse_config({**config, "retrievers": [*config["retrievers"][:1], partial]})
    return experiment, refusing, instance, ArtifactStore(home=str(home)), dropped


def test_questions_without_rows_score_as_an_empty_retrieval(run_without_some_questions) -> None:
    """With ``missing_queries: empty`` the questions without a row are reported and scored as a
    retriever that returned nothing: their rag answer is their closed-book one (ΔSePer exactly 0,
    MIRAGE's mixed answer the closed-book one, ConSens 0), they have no document, candidate or
    judgment, and eRAG and the IR measures count them 0 over all questions. Every other
    question scores as it does with all rows (BM25's own ranking)."""
    _, _, instance, store, dropped = run_without_some_questions
    setting, partition = f"world__partial__k{K}", f"lm0|world__partial__k{K}"
    metadata = latest(instance, "retrieval_run", setting).metadata
    assert metadata["queries_without_rows"].value == DROPPED
    assert metadata["queries_without_rows_named"].value == ", ".join(dropped)
    warnings = [
        entry.user_message
        for run in instance.get_runs()
        for entry in instance.all_logs(run.run_id)
        if "returned nothing (missing_queries: empty)" in entry.user_message
    ]
    assert warnings and all(repr(q) in warnings[0] for q in dropped)
    assert (
        latest(instance, "generations", partition)
        .metadata["prompts_reusing_closed_book_samples"]
        .value
        == DROPPED
    )

    mine, bm25 = (
        store.read_table("metric_scores", f"lm0|world__{r}__k{K}").sort("query_id")
        for r in ("partial", "bm25")
    )
    assert mine.height == 6
    empty, kept = (
        mine.filter(pl.col("query_id").is_in(dropped) == is_dropped) for is_dropped in (True, False)
    )
    assert (
        empty["delta_seper_s"].to_list() == [0.0] * DROPPED
        and empty["delta_seper_h"].to_list() == [0.0] * DROPPED
    )
    for (
        column
    ) in QUERY_CONDITION_COLUMNS:  # answer_loose: MIRAGE's mixed correctness is the closed-book one
        assert empty[f"{column}_rag"].to_list() == empty[f"{column}_closed"].to_list(), column
    consens = store.read_table("consens", partition).filter(pl.col("query_id").is_in(dropped))
    assert (
        consens["consens"].to_list() == [0.0] * DROPPED
    )  # r = log(P_E / P_C) = 0: the context is the empty one
    numeric = [c for c, dtype in mine.schema.items() if dtype.is_numeric()]
    assert_frame_equal(
        kept.select(numeric),
        bm25.filter(pl.col("query_id").is_in(kept["query_id"].implode())).select(numeric),
    )

    for asset in ("document_scores", "candidate_scores"):
        table, full = (
            store.read_table(asset, f"lm0|world__{r}__k{K}").sort("query_id", "rank")
            for r in ("partial", "bm25")
        )
        assert set(table["query_id"]) == set(kept["query_id"]), asset
        assert_frame_equal(
            table, full.filter(~pl.col("query_id").is_in(dropped)), check_row_order=False
        )

    # eRAG and the IR measures: the mean over every question, the questions without rows counting 0
    # (the tiny generator's eRAG labels are all 0, so n tells; tests/evaluation/test_summary.py checks a mean).
    documents = store.read_table("document_scores", f"lm0|world__bm25__k{K}").filter(
        ~pl.col("query_id").is_in(dropped)
    )
    ranked = dict(
        documents.sort("rank").group_by("query_id", maintain_order=True).agg("doc_id").iter_rows()
    )
    labels: dict[str, dict[str, float]] = {}
    for qid, doc, label in documents.select("query_id", "doc_id", "erag_label").iter_rows():
        labels.setdefault(qid, {})[doc] = float(label)
    kept_scores = erag_scores(ranked, labels, erag_measure_names("exact_match", K)).per_query
    summary = store.read_json("metric_scores", partition, "summary")
    for measure in kept_scores[next(iter(kept_scores))]:
        assert summary[f"erag_{measure}"] == pytest.approx(
            sum(s[measure] for s in kept_scores.values()) / 6
        ), measure
        assert summary[f"n_{catalog.generic_name(f'erag_{measure}')}"] == 6
    bm25_run = store.read_table("retrieval_run", f"world__bm25__k{K}")
    per_query, _ = evaluate_run(
        bm25_run.filter(~pl.col("query_id").is_in(dropped)),
        store.read_table("setting_queries", setting, QRELS),
        [f"recall_{K}", "recip_rank"],
    )
    for measure in (f"recall_{K}", "recip_rank"):
        assert per_query[measure].sum() > 0 and metadata[measure].value == pytest.approx(
            per_query[measure].sum() / 6
        )


def test_questions_without_rows_are_refused_by_default_naming_the_option(
    run_without_some_questions,
) -> None:
    _, refusing, instance, store, dropped = run_without_some_questions
    assert refusing.retriever("partial").missing_queries == "refuse"
    defs = build_definitions(refusing, str(store.home))
    _, assets = build_assets(refusing)
    failed = dg.materialize(
        assets,
        selection=list(RETRIEVAL),
        partition_key=f"world__partial__k{K}",
        instance=instance,
        resources=defs.resources,
        raise_on_error=False,
    )
    assert not failed.success and not materialised(failed)
    (failure,) = [e for e in failed.all_events if e.is_step_failure]
    message = failure.step_failure_data.error.cause.message
    assert (
        f"{DROPPED} of the 6 queries of dataset 'world' have no row, e.g. {dropped[0]!r}" in message
    )
    assert "set 'missing_queries: empty' on the retriever" in message
