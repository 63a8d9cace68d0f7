"""``ragutil ui``: the Dagster UI and the MLflow UI over ragutil's state — a GraphQL smoke test,
and headless Chromium (Playwright) checks of the lineage graph, a materialised ``metric_scores``,
and its MLflow run link leading to the run page with the run's dataset and logged model.

``ragutil ui`` binds 127.0.0.1 on free ports and is started and stopped by
``ragutil_dagster.infra.processes.background_server`` (signals reset, own process group, stopped by PID);
it stops its two servers when it gets SIGTERM. Screenshots go to /tmp, out of the repository.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from dagster._core.nux import set_nux_seen

from ragutil_dagster.assets import build_assets
from ragutil_dagster.config import parse_config
from ragutil_dagster.definitions import build_definitions
from ragutil_dagster.infra.processes import background_server, free_port
from ragutil_dagster.runner import dagster_instance, materialize_all
from ragutil_dagster.tracking.resource import MLFLOW_UI_URL_VARIABLE

from ..conftest import skip_or_fail

NODES = [
    "queries",
    "corpus",
    "index",
    "retrieval_run",
    "utility_candidates",
    "setting_queries",
    "retrieved_passages",
    "closed_book_generations",
    "generations",
    "consens",
    "utility_generations",
    "utility_judgments",
    "utility_signals",
    "entailment_clusters",
    "nli_probabilities",
    "metric_scores",
    "document_scores",
    "candidate_scores",
    "group_scores",
    "retrieval_correlations",
    "utility_transfer",
    "reports",
]
ARTIFACTS = Path("/tmp/ragutil-test-ui")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        payload = json.loads(response.read())
    assert "errors" not in payload, payload.get("errors")
    return payload["data"]


@dataclass(frozen=True)
class Servers:
    dagster: int
    mlflow: int
    printed: str  # what ragutil ui printed


@pytest.fixture(scope="module")
def ui(tiny_world, make_tiny_config, tmp_path_factory):
    """The tiny experiment materialised with run links to the MLflow port ``ragutil ui`` is then
    given, and ``ragutil ui`` serving both UIs over that state."""
    _, world, models = tiny_world
    root = tmp_path_factory.mktemp("ui")
    config = make_tiny_config(models, world)
    config["retrievers"] = config["retrievers"][:1]
    config["k"] = [1]
    config_path = root / "experiment.yaml"
    config_path.write_text(yaml.safe_dump(config))
    dagster_port, mlflow_port = free_port(), free_port()
    env = {**os.environ, "RAGUTIL_HOME": str(root / "home"), "RAGUTIL_CONFIG": str(config_path)}
    env["DAGSTER_HOME"] = str(root / "home" / "dagster")
    env.pop("MLFLOW_TRACKING_URI", None)
    experiment = parse_config(config)
    with pytest.MonkeyPatch.context() as patch:
        # Dagster's "Join the community" dialog opens a second after a page loads, over whatever
        # a test is about to click; the UI shows it until the instance records it as seen.
        patch.setenv("DAGSTER_HOME", env["DAGSTER_HOME"])
        set_nux_seen()
        patch.delenv("DAGSTER_HOME", raising=False)
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        patch.setenv(MLFLOW_UI_URL_VARIABLE, f"http://127.0.0.1:{mlflow_port}")
        instance = dagster_instance(root / "home")
        parts, _ = build_assets(experiment)
        materialize_all(
            build_definitions(experiment, str(root / "home")),
            experiment,
            parts,
            instance,
            progress=False,
        )
        instance.dispose()

    command = [
        sys.executable,
        "-m",
        "ragutil_dagster.cli",
        "ui",
        str(config_path),
        "--port",
        str(dagster_port),
        "--mlflow-port",
        str(mlflow_port),
    ]
    log = root / "ragutil-ui.log"
    with background_server(
        command, f"http://127.0.0.1:{dagster_port}/server_info", log, env=env, cwd=root, timeout=300
    ):
        # The webserver answers before the code location has loaded; wait for the assets.
        deadline = time.monotonic() + 180
        while not graphql(dagster_port, "{ assetNodes { id } }")["assetNodes"]:
            assert time.monotonic() < deadline, "the code location did not load within 180 s"
            time.sleep(2)
        # ragutil ui prints its URLs once its own readiness poll has seen both servers, which
        # can be a moment after this test's poll did.
        while "Dagster UI:" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(1)
        yield Servers(dagster_port, mlflow_port, log.read_text())
    # ragutil ui stopped both servers when it was stopped.
    for port in (dagster_port, mlflow_port):
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)


def test_ui_prints_both_urls_and_serves_mlflow(ui) -> None:
    assert f"Dagster UI: http://127.0.0.1:{ui.dagster}" in ui.printed
    assert f"MLflow UI:  http://127.0.0.1:{ui.mlflow} (over sqlite:///" in ui.printed
    with urllib.request.urlopen(f"http://127.0.0.1:{ui.mlflow}/health", timeout=10) as response:
        assert response.status == 200


def test_graphql_lists_assets_and_partitions(ui) -> None:
    data = graphql(ui.dagster, "{ assetNodes { assetKey { path } isPartitioned } }")
    nodes = {tuple(n["assetKey"]["path"]): n["isPartitioned"] for n in data["assetNodes"]}
    assert {"/".join(path) for path in nodes} == {*NODES, "model/generator", "model/nli"}
    assert nodes[("model", "generator")] is True and nodes[("model", "nli")] is False
    assert nodes[("reports",)] is False and nodes[("metric_scores",)] is True
    data = graphql(
        ui.dagster,
        '{ assetNodeOrError(assetKey: {path: ["metric_scores"]}) { ... on AssetNode { '
        "partitionKeysByDimension { name partitionKeys } } } }",
    )
    dimensions = {
        d["name"]: d["partitionKeys"] for d in data["assetNodeOrError"]["partitionKeysByDimension"]
    }
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


@pytest.fixture(scope="module")
def chromium() -> str:
    """Chromium's executable, or — where it is missing — a skip, under CI a failure
    (``skip_or_fail``: .ci/run installs it). Asked before ``ui``, so no server starts for nothing."""
    if not Path(CHROMIUM).exists():
        skip_or_fail(f"Chromium is not installed (no {CHROMIUM}; install.sh installs it)")
    return CHROMIUM


@contextmanager
def chromium_page(executable: str):
    """A page of a headless Chromium, closed on exit; the screenshot directory exists."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=executable,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-quic",
            ],
        )
        try:
            yield browser.new_page(viewport={"width": 1600, "height": 1000})
        finally:
            browser.close()


def test_ui_shows_the_lineage_graph_and_a_materialised_metric_scores(chromium, ui) -> None:
    base = f"http://127.0.0.1:{ui.dagster}"
    with chromium_page(chromium) as page:
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
    assert (ARTIFACTS / "ui-lineage.png").stat().st_size > 10_000


def test_the_mlflow_run_link_opens_the_run_with_its_dataset_and_models(chromium, ui) -> None:
    runs = f"http://127.0.0.1:{ui.mlflow}/#/experiments/"
    with chromium_page(chromium) as page:
        page.goto(f"http://127.0.0.1:{ui.dagster}/assets/metric_scores", wait_until="networkidle")
        dismiss_popups(page)
        link = page.locator(f'a[href^="{runs}"]').first
        link.wait_for(timeout=30_000)
        href = link.get_attribute("href")
        with page.context.expect_page() as opened:
            link.click()  # Dagster opens metadata URLs in a new tab
        run_page = opened.value
        run_page.wait_for_load_state()  # the MLflow UI keeps polling: never network-idle
        assert run_page.url == href and "/runs/" in href
        run_page.get_by_text("world/test/queries").first.wait_for(timeout=60_000)
        run_page.screenshot(path=str(ARTIFACTS / "mlflow-run.png"))
        # Its logged models: the generator and the NLI model (a BM25 setting has no embedder).
        models = run_page.get_by_text("Logged models (2)")
        models.wait_for(timeout=60_000)
        run_page.get_by_text(re.compile(r"^generator-lm0-")).first.wait_for(timeout=10_000)
        run_page.get_by_text(re.compile(r"^nli-nli-")).first.wait_for(timeout=10_000)
        # The page scrolls inside the app (a full-page shot is only the viewport): bring the
        # table below the metrics and parameters into view.
        models.scroll_into_view_if_needed()
        run_page.screenshot(path=str(ARTIFACTS / "mlflow-run-models.png"))
