"""Print a config with ``sampling.adaptive`` switched on at its defaults, to score the same
records adaptively and at fixed N with one config otherwise:

    python bench/adaptive_config.py examples/squad.yaml > squad-adaptive.yaml
    ragutil score ../shared/data/squad/beir/records_200.jsonl --config squad-adaptive.yaml \\
        --generator smollm2 --out scored-adaptive.jsonl
    python bench/squad_records.py scored-adaptive.jsonl ../shared/data/squad/beir/records_200.jsonl \\
        --label "smollm2 adaptive" --json bench/results/squad_records_smollm2_adaptive.json

Relative dataset paths resolve from the directory ``ragutil`` runs in, so the copy may live anywhere.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from ragutil_dagster.config import parse_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path, help="an experiment YAML")
    config = yaml.safe_load(parser.parse_args().config.read_text(encoding="utf-8"))
    sampling = config.setdefault("sampling", {})
    if sampling.get("adaptive") is not None:
        raise SystemExit("sampling.adaptive is already on in that config")
    sampling["adaptive"] = {}
    parse_config(config)  # the copy must load as ragutil will load it
    yaml.safe_dump(config, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
