"""``ragutil ui``: the Dagster UI and the MLflow UI over the same state, started and stopped together.

MLflow is served over the tracking store ragutil logs to (the embedded store, or
``MLFLOW_TRACKING_URI`` when that is a database); when ``MLFLOW_TRACKING_URI`` is already a
server, that server is the MLflow UI. Dagster gets the MLflow UI's URL in
``RAGUTIL_MLFLOW_UI_URL``, so the run links of what it materialises lead to the port in use.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from ragutil_dagster.infra.databases import (
    DAGSTER_HOME_VARIABLE,
    MLFLOW_TRACKING_URI_VARIABLE,
    check_reachable,
)
from ragutil_dagster.infra.files import ragutil_home
from ragutil_dagster.infra.processes import available_port, background_server

if TYPE_CHECKING:
    from ragutil_dagster.tracking import MlflowTracking

DAGSTER_PORT = 3000
MLFLOW_PORT = 5000  # mlflow ui's default, where run links point when ragutil ui did not set them


def mlflow_server_command(backend_uri: str, home: Path, host: str, port: int) -> list[str]:
    """``mlflow server`` over ``backend_uri``; experiments it creates keep their artifacts under
    ``<home>/mlruns`` like those ragutil creates (existing ones keep their own location)."""
    return [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        backend_uri,
        "--default-artifact-root",
        (home / "mlruns").as_uri(),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]


def dagster_dev_command(host: str, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dagster",
        "dev",
        "-m",
        "ragutil_dagster.definitions",
        "-a",
        "defs",
        "-h",
        host,
        "-p",
        str(port),
    ]


def _stop_on_sigint() -> None:
    """Turn a SIGINT inherited ignored into KeyboardInterrupt (SIGTERM already exits: ``cli.main``),
    so leaving the ``with`` stops both servers instead of orphaning them."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _ui(args: argparse.Namespace) -> int:
    from ragutil_dagster.runner import dagster_instance
    from ragutil_dagster.tracking import MlflowTracking  # noqa: F811 (lazy: keeps `ragutil --help` fast)

    _stop_on_sigint()
    home = ragutil_home()
    if not os.environ.get(DAGSTER_HOME_VARIABLE):
        # Writes <RAGUTIL_HOME>/dagster/dagster.yaml (PostgreSQL storage when
        # $RAGUTIL_DAGSTER_POSTGRES_URL is set, which dagster dev inherits) and checks the database.
        dagster_instance()
    env = {**os.environ, "RAGUTIL_CONFIG": str(Path(args.config).resolve())}
    env.setdefault(DAGSTER_HOME_VARIABLE, str(home / "dagster"))
    tracking = MlflowTracking(
        home=str(home), tracking_uri=os.environ.get(MLFLOW_TRACKING_URI_VARIABLE, "")
    )
    # mlflow server would retry a refused database for the best part of an hour.
    check_reachable(tracking.uri, "the MLflow tracking database", MLFLOW_TRACKING_URI_VARIABLE)
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        return _serve(args, tracking, env, home, logs)
    except KeyboardInterrupt:  # Ctrl-C: both servers are stopped on the way out
        return 130


def _serve(
    args: argparse.Namespace, tracking: MlflowTracking, env: dict[str, str], home: Path, logs: Path
) -> int:
    """Start the MLflow UI (unless the tracking store is a server) and the Dagster UI, print
    their URLs, and wait; leaving stops both. Returns 1 when one of them exits on its own."""
    from ragutil_dagster.tracking.resource import MLFLOW_UI_URL_VARIABLE

    with ExitStack() as servers:
        processes = []
        if tracking.uri.startswith(("http://", "https://")):
            mlflow_url, mlflow_what = tracking.display_uri, "the tracking server"
        else:
            port = available_port(args.mlflow_port, args.host)
            mlflow_url, mlflow_what = f"http://{args.host}:{port}", f"over {tracking.display_uri}"
            mlflow = mlflow_server_command(tracking.uri, home, args.host, port)
            processes.append(
                servers.enter_context(
                    background_server(mlflow, f"{mlflow_url}/health", logs / "mlflow-ui.log")
                )
            )
            env[MLFLOW_UI_URL_VARIABLE] = mlflow_url
        port = available_port(args.port, args.host)
        dagster_url = f"http://{args.host}:{port}"
        processes.append(
            servers.enter_context(
                background_server(
                    dagster_dev_command(args.host, port),
                    f"{dagster_url}/server_info",
                    logs / "dagster-ui.log",
                    env=env,
                )
            )
        )
        print(
            f"Dagster UI: {dagster_url}\nMLflow UI:  {mlflow_url} ({mlflow_what})\n"
            f"logs in {logs}; Ctrl-C stops both",
            flush=True,
        )
        while all(process.poll() is None for process in processes):
            time.sleep(1)
        print(f"ragutil ui: a server exited; see the logs in {logs}", file=sys.stderr)
    return 1


def add(sub: argparse._SubParsersAction) -> None:
    ui = sub.add_parser(
        "ui",
        help="serve the Dagster UI and the MLflow UI over ragutil's state",
        description="Serve the Dagster UI over ragutil's instance ($RAGUTIL_HOME/dagster) and the MLflow "
        "UI over its tracking store ($MLFLOW_TRACKING_URI, else $RAGUTIL_HOME/mlflow.db), on free ports "
        "(the given ones when free); print both URLs; stop both on Ctrl-C or SIGTERM.",
    )
    ui.add_argument("config", nargs="?", default="examples/demo.yaml", help="experiment YAML")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument(
        "--port", type=int, default=DAGSTER_PORT, help="Dagster UI port (another when taken)"
    )
    ui.add_argument(
        "--mlflow-port", type=int, default=MLFLOW_PORT, help="MLflow UI port (another when taken)"
    )
    ui.set_defaults(func=_ui)
