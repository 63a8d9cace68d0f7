"""The Dagster UI over ragutil's instance: a ``dagster dev`` smoke test through GraphQL, and a
headless Chromium (Playwright) check of the lineage graph and a materialised ``metric_scores``.

The server binds 127.0.0.1 on a free port and is started and stopped by
``ragutil_dagster.processes.background_server`` (signals reset, own process group, stopped by PID).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from ragutil_dagster.assets import build_assets
from ragutil_dagster.config import parse_config
from ragutil_dagster.definitions import build_definitions
from ragutil_dagster.processes import background_server, free_port
from ragutil_dagster.runner import dagster_instance, materialize_all

NODES = [
    "queries", "corpus", "index", "retrieval_run", "setting_queries", "retrieved_passages",
    "closed_book_generations", "generations", "consens", "utility_signals", "entailment_clusters",
    "nli_probabilities", "metric_scores", "document_scores", "group_scores", "reports",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        payload = json.loads(response.read())
    assert "errors" not in payload, payload.get("errors")
    return payload["data"]


@pytest.fixture(scope="module")
def dagster_dev(tiny_world, make_tiny_config, tmp_path_factory):
    _, world, models = tiny_world
    root = tmp_path_factory.mktemp("ui")
    config = make_tiny_config(models, world)
    config["retrievers"] = config["retrievers"][:1]
    config["k"] = [1]
    config_path = root / "experiment.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "RAGUTIL_HOME": str(root / "home"), "RAGUTIL_CONFIG": str(config_path)}
    env["DAGSTER_HOME"] = str(root / "home" / "dagster")
    experiment = parse_config(config)
    os.environ.pop("DAGSTER_HOME", None)
    instance = dagster_instance(root / "home")
    parts, _ = build_assets(experiment)
    materialize_all(build_definitions(experiment, str(root / "home")), experiment, parts, instance, progress=False)
    instance.dispose()

    port = free_port()
    command = [sys.executable, "-m", "dagster", "dev", "-m", "ragutil_dagster.definitions", "-a", "defs",
               "-h", "127.0.0.1", "-p", str(port)]
    with background_server(
        command, f"http://127.0.0.1:{port}/server_info", root / "dagster-dev.log", env=env, cwd=root, timeout=300
    ):
        # The webserver answers before the code location has loaded; wait for the assets.
        deadline = time.monotonic() + 180
        while not graphql(port, "{ assetNodes { id } }")["assetNodes"]:
            assert time.monotonic() < deadline, "the code location did not load within 180 s"
            time.sleep(2)
        yield port


def test_graphql_lists_assets_and_partitions(dagster_dev) -> None:
    data = graphql(dagster_dev, "{ assetNodes { assetKey { path } isPartitioned } }")
    nodes = {tuple(n["assetKey"]["path"]): n["isPartitioned"] for n in data["assetNodes"]}
    assert {"/".join(path) for path in nodes} == {*NODES, "model/generator", "model/nli"}
    assert nodes[("model", "generator")] is True and nodes[("model", "nli")] is False
    assert nodes[("reports",)] is False and nodes[("metric_scores",)] is True
    data = graphql(
        dagster_dev,
        '{ assetNodeOrError(assetKey: {path: ["metric_scores"]}) { ... on AssetNode { '
        "partitionKeysByDimension { name partitionKeys } } } }",
    )
    dimensions = {d["name"]: d["partitionKeys"] for d in data["assetNodeOrError"]["partitionKeysByDimension"]}
    assert dimensions == {"generator": ["lm0"], "setting": ["world__bm25__k1"]}


def dismiss_popups(page) -> None:
    """Close whatever dialog the UI opens on a first visit (news, onboarding, telemetry)."""
    for _ in range(3):
        dialog = page.locator(".bp5-dialog, [role=dialog]")
        if not dialog.count():
            return
        for label in ("Skip", "Dismiss", "Close", "No thanks", "Got it"):
            button = dialog.first.get_by_role("button", name=label)
            if button.count() and button.first.is_enabled():
                button.first.click()
                break
        else:
            page.keyboard.press("Escape")
        page.wait_for_timeout(500)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Chromium is not installed (.ci/run installs it)")
def test_ui_shows_the_lineage_graph_and_a_materialised_metric_scores(dagster_dev) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    base = f"http://127.0.0.1:{dagster_dev}"
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic"],
        )
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.goto(f"{base}/asset-groups/ragutil", wait_until="networkidle")
        page.screenshot(path=str(ARTIFACTS / "ui-first-view.png"))
        dismiss_popups(page)
        for node in NODES:
            page.get_by_text(node, exact=True).first.wait_for(timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "ui-lineage.png"), full_page=True)

        page.goto(f"{base}/assets/metric_scores", wait_until="networkidle")
        dismiss_popups(page)
        # The overview names the latest materialised partition and its passed checks.
        page.get_by_text("Latest materialization").first.wait_for(timeout=30_000)
        page.get_by_text("lm0|world__bm25__k1").first.wait_for(timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "ui-metric-scores.png"), full_page=True)
        browser.close()
    assert (ARTIFACTS / "ui-lineage.png").stat().st_size > 10_000
