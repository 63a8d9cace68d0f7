"""``ragutil ui``: the Dagster UI over ragutil's instance and state."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ragutil_dagster.files import ragutil_home


def _ui(args: argparse.Namespace) -> int:
    from ragutil_dagster.runner import dagster_instance

    os.environ["RAGUTIL_CONFIG"] = str(Path(args.config).resolve())
    if not os.environ.get("DAGSTER_HOME"):
        dagster_instance()  # creates <RAGUTIL_HOME>/dagster with its dagster.yaml
        os.environ["DAGSTER_HOME"] = str(ragutil_home() / "dagster")
    command = ["dagster", "dev", "-m", "ragutil_dagster.definitions", "-a", "defs", "-h", args.host, "-p", str(args.port)]
    os.execvp(command[0], command)
    return 0  # not reached


def add(sub: argparse._SubParsersAction) -> None:
    ui = sub.add_parser("ui", help="serve the Dagster UI over ragutil's instance ($RAGUTIL_HOME/dagster)")
    ui.add_argument("config", nargs="?", default="examples/demo.yaml", help="experiment YAML")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=3000)
    ui.set_defaults(func=_ui)
