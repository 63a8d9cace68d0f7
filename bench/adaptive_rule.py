"""Choose ``sampling.adaptive``'s default stop rule from the replays of several development-half
runs of ``bench/adaptive_cost.py`` (each result file's ``<backend>.replay``): the fewest samples
(mean over the runs) among the rules keeping ``adaptive_sampling.MIN_INSIDE_DEV`` of the rag
ΔSePer_S values strictly inside the fixed-N bootstrap CI in every run
(``adaptive_sampling.chosen_rule``). Only development-half runs may be given: the report half's
figures of the chosen rule are read afterwards, never while choosing.

    python bench/adaptive_rule.py bench/results/adaptive_rule_dev.json bench/results/adaptive_cost.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from adaptive_sampling import MIN_INSIDE_DEV, chosen_rule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path, nargs="+", help="adaptive_cost.py result files")
    parser.add_argument("--backend", default="hf", help="whose fixed-N run was replayed")
    args = parser.parse_args()
    replay_sets = []
    for path in args.results:
        result = json.loads(path.read_text())
        if args.backend not in result or "replay" not in result[args.backend]:
            raise SystemExit(f"{path}: no {args.backend}.replay (a bench/adaptive_cost.py result)")
        if result["command"].get("half") == "test":
            raise SystemExit(f"{path}: a report-half run; choose on development-half runs only")
        replay_sets.append(result[args.backend]["replay"])
    chosen = chosen_rule(replay_sets)
    print(f"chosen (fewest samples keeping {MIN_INSIDE_DEV} inside in every run): {chosen}")


if __name__ == "__main__":
    main()
