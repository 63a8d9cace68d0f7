"""Fixtures of the tracking tests: the smallest experiment that shows every behaviour — two
retrievers (so there are paired tests between them) at k = 2, two generators with their own
weights (so one can change alone), 6 queries, N = 3 — and a real ``mlflow server``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from ragutil_dagster.assets import build_assets
from ragutil_dagster.assets.partitions import Partitions
from ragutil_dagster.config import ExperimentConfig, parse_config
from ragutil_dagster.definitions import build_definitions
from ragutil_dagster.embedded.world import make_world, write_world
from ragutil_dagster.testing.tiny import build_causal_lm, build_tiny_models


@dataclass
class Experiment:
    config: ExperimentConfig
    parts: Partitions
    defs: dg.Definitions
    instance: dg.DagsterInstance
    home: Path
    generator_dirs: dict[str, Path]

    def materialize(
        self, assets: list[str], partition: str | None, **resources: object
    ) -> dg.ExecuteInProcessResult:
        """Materialise ``assets`` (with the other outputs of their steps) for one partition with the
        definitions' resources, some replaced."""
        return dg.materialize(
            list(self.defs.assets or []),
            selection=dg.AssetSelection.assets(*assets).required_multi_asset_neighbors(),
            partition_key=partition,
            instance=self.instance,
            resources={**dict(self.defs.resources or {}), **resources},
            raise_on_error=False,
        )

    def partitions(self, generator: str | None = None) -> list[str]:
        keys = [str(k) for k in self.parts.setting_generator.get_partition_keys()]
        return [k for k in keys if generator is None or k.startswith(f"{generator}|")]


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory, make_tiny_config) -> Experiment:
    root = tmp_path_factory.mktemp("tracking")
    world = write_world(make_world(0, "ci"), root / "world")
    models = build_tiny_models(root / "models")
    generator_dirs = {
        f"lm{i}": build_causal_lm(root / "models" / f"lm{i}", seed=i) for i in range(2)
    }
    data = make_tiny_config(models, world, generators=2)
    data["k"] = [2]
    for generator in data["generators"]:
        generator["model"] = str(generator_dirs[generator["name"]])
    config = parse_config(data)
    home = root / "home"
    parts, _ = build_assets(config)
    return Experiment(
        config,
        parts,
        build_definitions(config, str(home)),
        dg.DagsterInstance.ephemeral(),
        home,
        generator_dirs,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Background processes here inherit SIGINT/SIGTERM ignored, and an ignored signal stays ignored
# across exec: the server is started through this prelude, which restores the defaults and then
# becomes the server (no preexec_fn, which is unsafe once threads exist).
RESET_SIGNALS_AND_EXEC = (
    "import os, signal, sys; "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); signal.signal(signal.SIGTERM, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``mlflow server`` on 127.0.0.1 (SQLite backend, temporary artifact root), in its
    own process group, stopped by PID; yields its URL."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    log = (root / "server.log").open("wb")
    command = [
        sys.executable,
        "-c",
        RESET_SIGNALS_AND_EXEC,
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination",
        str(root / "artifacts"),
    ]
    process = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "MLFLOW_TRACKING_URI": ""},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited with {process.returncode}: {(root / 'server.log').read_text()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"mlflow server not healthy after 120 s: {(root / 'server.log').read_text()[-2000:]}"
                )
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=20)
        log.close()
