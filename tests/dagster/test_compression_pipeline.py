"""Context compression in the graph (SePer §5.4, RQ3): compressed settings materialise beside the
uncompressed ones — whose partition keys stay as they were — with their rag prompts showing the
compressed context, and the reports, the summaries and the MLflow runs carry context tokens before
and after, the compression ratio and ΔSePer per 100 context tokens."""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest

from ragutil_dagster.assets import build_assets
from ragutil_dagster.assets.reports import summary_table
from ragutil_dagster.config import parse_config
from ragutil_dagster.definitions import build_definitions
from ragutil_dagster.errors import StepFailedError
from ragutil_dagster.resources import ArtifactStore
from ragutil_dagster.runner import materialize_all
from ragutil_dagster.tables import CONTEXTS, PROMPTS
from ragutil_dagster.tracking import MlflowTracking

K = 2
BUDGET = 12
COMPRESSED = ("truncate-12", "extractive-12", "summary")


def compression_config(tiny_world, make_tiny_config) -> dict:
    """The tiny experiment with BM25 at one k, no verbalized judgment, and three compressors."""
    _, world, models = tiny_world
    config = make_tiny_config(models, world)
    return {
        **config,
        "retrievers": config["retrievers"][:1],
        "k": [K],
        "utility": {"candidates": K, "methods": []},
        "compression": [
            {"method": "truncate", "budget": BUDGET},
            {"method": "extractive", "budget": BUDGET, "embedder": str(models.embedder)},
            {"name": "summary", "method": "abstractive", "budget": BUDGET},
        ],
    }


@pytest.fixture(scope="module")
def compressed_run(tiny_world, make_tiny_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("compression")
    experiment = parse_config(compression_config(tiny_world, make_tiny_config))
    home = root / "home"
    defs = build_definitions(experiment, str(home))
    parts, _ = build_assets(experiment)
    instance = dg.DagsterInstance.ephemeral()
    materialize_all(defs, experiment, parts, instance, progress=False)
    return experiment, parts, instance, ArtifactStore(home=str(home))


def test_compressed_settings_sit_beside_the_uncompressed_ones(
    tiny_world, make_tiny_config, compressed_run
) -> None:
    experiment, parts, _, _ = compressed_run
    plain = compression_config(tiny_world, make_tiny_config)
    del plain["compression"]
    assert [s.key for s in parse_config(plain).settings()] == [f"world__bm25__k{K}"]
    assert parts.setting.get_partition_keys() == [
        f"world__bm25__k{K}",
        *(f"world__bm25__k{K}__{c}" for c in COMPRESSED),
    ]
    # Unset, the section is None: the config fingerprint (of the fields set, not None) is unchanged.
    assert parse_config(plain).compression is None
    assert "compression" not in parse_config(plain).model_dump(mode="json", exclude_none=True)


def test_the_rag_prompts_show_the_compressed_context_within_the_budget(compressed_run) -> None:
    _, _, _, store = compressed_run
    plain = store.read_table("generations", f"lm0|world__bm25__k{K}", CONTEXTS)
    assert plain["context_tokens_before"].to_list() == plain["context_tokens_after"].to_list()
    for name in COMPRESSED:
        partition = f"lm0|world__bm25__k{K}__{name}"
        contexts = store.read_table("generations", partition, CONTEXTS).sort("query_id")
        assert contexts.height == 6
        assert (contexts["context_tokens_after"] <= BUDGET).all()
        assert (
            contexts["context_tokens_before"].to_list()
            == plain.sort("query_id")["context_tokens_before"].to_list()
        )
        prompts = store.read_table("generations", partition, PROMPTS)
        rag = dict(
            prompts.filter(pl.col("condition") == "rag").select("query_id", "prompt").iter_rows()
        )
        for qid, texts in contexts.select("query_id", "passages").iter_rows():
            assert all(text in rag[qid] for text in texts)
        # per_doc prompts are the uncompressed setting's: each passage alone, as retrieved.
        per_doc = prompts.filter(pl.col("condition") == "per_doc").sort("query_id", "doc_id")[
            "prompt"
        ]
        plain_prompts = store.read_table("generations", f"lm0|world__bm25__k{K}", PROMPTS)
        assert (
            per_doc.to_list()
            == plain_prompts.filter(pl.col("condition") == "per_doc")
            .sort("query_id", "doc_id")["prompt"]
            .to_list()
        )
    truncated = store.read_table("generations", f"lm0|world__bm25__k{K}__truncate-12", CONTEXTS)
    assert (truncated["context_tokens_after"] < truncated["context_tokens_before"]).all()


def test_reports_and_mlflow_carry_tokens_ratio_and_delta_seper_per_100_tokens(
    compressed_run,
) -> None:
    experiment, parts, instance, store = compressed_run
    table = summary_table(store, parts).sort("compression")
    assert table["compression"].to_list() == sorted(["", *COMPRESSED])
    for column in (
        "context_tokens_before",
        "context_tokens_after",
        "compression_ratio",
        "delta_seper_s_per_100_context_tokens",
    ):
        assert table[column].null_count() == 0, column
    for row in table.iter_rows(named=True):
        assert row["compression_ratio"] == pytest.approx(
            row["context_tokens_after"] / row["context_tokens_before"]
        )
        assert row["delta_seper_s_per_100_context_tokens"] == pytest.approx(
            100 * row["delta_seper_s"] / row["context_tokens_after"]
        )
    assert table.filter(pl.col("compression") == "")["compression_ratio"].item() == 1.0
    assert table.filter(pl.col("compression") == "truncate-12")["compression_ratio"].item() < 1.0
    partition = f"lm0|world__bm25__k{K}__truncate-12"
    per_query = store.read_table("metric_scores", partition)
    assert (per_query["context_tokens_after"] <= BUDGET).all()
    record = (
        instance.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=dg.AssetKey("metric_scores"), asset_partitions=[partition]
            ),
            limit=1,
        )
        .records[0]
        .asset_materialization
    )
    assert "delta_seper_s_per_100_context_tokens" in record.metadata
    generations = (
        instance.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=dg.AssetKey("generations"), asset_partitions=[partition]
            ),
            limit=1,
        )
        .records[0]
        .asset_materialization
    )
    assert generations.metadata["compressor"].value == "truncate-12"
    assert generations.metadata["context_token_unit"].value == "generator tokens"
    client = MlflowTracking(home=store.home).client()
    logged = client.get_run(store.read_json("metric_scores", partition, "mlflow")["run_id"]).data
    assert logged.params["compression"] == "truncate-12" and logged.params[
        "compression_budget"
    ] == str(BUDGET)
    assert logged.metrics["delta_seper_s_per_100_context_tokens"] == pytest.approx(
        table.filter(pl.col("compression") == "truncate-12")[
            "delta_seper_s_per_100_context_tokens"
        ].item()
    )


def test_an_abstractive_budget_beyond_the_generators_context_is_a_config_error(
    tiny_world, make_tiny_config, tmp_path
) -> None:
    config = compression_config(tiny_world, make_tiny_config)
    config["compression"] = [{"name": "huge", "method": "abstractive", "budget": 10**6}]
    experiment = parse_config(config)
    defs = build_definitions(experiment, str(tmp_path / "home"))
    parts, _ = build_assets(experiment)
    with pytest.raises(
        StepFailedError, match=r"ConfigError.*compression\.0\.budget: compressor 'huge'"
    ):
        materialize_all(defs, experiment, parts, dg.DagsterInstance.ephemeral(), progress=False)
    store = ArtifactStore(home=str(tmp_path / "home"))
    for asset in ("generations", "consens"):  # nothing written
        assert not store.has_table(asset, f"lm0|world__bm25__k{K}__huge")
