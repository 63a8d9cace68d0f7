"""Teacher-forced scoring on the vLLM engine (ConSens, likelihood utility): prompts read from the
prefix cache against one pass over every position.

``VLLMTokenScorer`` prefills each prompt first and scores prompt + continuation reading the
prompt's cached blocks, so the output layer runs only at the continuation's positions (and the
rest of the prompt's last block); with ``enable_prefix_caching: false`` it runs one pass with
prompt log-probs at every position — the scorer's previous behaviour and the baseline here. The
workload is ``ragutil score``'s ConSens on ``records_200.jsonl``: the example's with-context
prompt for the model (``examples/squad-two-llms.yaml``) over a record's two paragraphs, scored on
a gold answer. Both arms run in one process on the same pairs, one engine at a time; the
log-probs of the two arms are compared too.

    python bench/vllm_scoring.py [--model gemma|smollm2] [--pairs 60] [--records PATH]

Prints the figures and writes bench/results/vllm_scoring_<model>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"
RECORDS = Path("/work/shared/data/squad/beir/records_200.jsonl")
EXAMPLE = ROOT / "examples" / "squad-two-llms.yaml"


def workload(records: Path, pairs: int, model: str) -> tuple[str, bool, list[str], list[str]]:
    """(model name, use_chat_template, prompts, continuations) of the example's generator."""
    from ragutil_dagster.config import load_config
    from ragutil_dagster.prompts import with_context

    experiment = load_config(EXAMPLE)
    spec = experiment.generator(model)
    template = experiment.prompts_for(model).with_context
    rows = [json.loads(line) for line in records.read_text(encoding="utf-8").splitlines()][:pairs]
    prompts = [
        with_context(row["question"], [("", c["text"]) for c in row["contexts"]], template)
        for row in rows
    ]
    return spec.model, spec.use_chat_template, prompts, [f" {row['answers'][0]}" for row in rows]


def timed_scoring(model: str, chat: bool, prompts, continuations, prefix_caching: bool) -> dict:
    """Seconds to score the pairs on a fresh engine (its start not counted), and the log-probs."""
    from ragutil_dagster.models.backend_contract import Placement
    from ragutil_dagster.models.backends import BACKENDS
    from ragutil_dagster.models.vllm_backend import VLLMGenerator, release_engine

    generator = VLLMGenerator(
        model,
        use_chat_template=chat,
        dtype="float32",
        kv_cache_space_gib=2,
        max_model_len=4096,
        enable_prefix_caching=prefix_caching,
        show_progress=False,
    )
    scorer = BACKENDS["vllm"].scorer(
        generator, Placement(device=None, batch_rows=1, show_progress=False)
    )
    started = time.perf_counter()
    scored = scorer.score(prompts, continuations)
    seconds = time.perf_counter() - started
    release_engine()
    return {"seconds": seconds, "logprobs": [np.asarray(s.token_logprobs) for s in scored]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["gemma", "smollm2"], default="gemma")
    parser.add_argument("--pairs", type=int, default=60)
    parser.add_argument("--records", type=Path, default=RECORDS)
    args = parser.parse_args()
    model, chat, prompts, continuations = workload(args.records, args.pairs, args.model)
    cached = timed_scoring(model, chat, prompts, continuations, prefix_caching=True)
    every = timed_scoring(model, chat, prompts, continuations, prefix_caching=False)
    gaps = np.concatenate(
        [np.abs(a - b) for a, b in zip(cached["logprobs"], every["logprobs"], strict=True)]
    )
    figures = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "command": f"python bench/vllm_scoring.py --model {args.model} --pairs {args.pairs}",
        "model": model,
        "pairs": len(prompts),
        "dtype": "float32",
        "prefix_cached_seconds": cached["seconds"],
        "every_position_seconds": every["seconds"],
        "speedup": every["seconds"] / cached["seconds"],
        "max_abs_logprob_diff": float(gaps.max()),
        "tokens": int(gaps.size),
    }
    out = RESULTS / f"vllm_scoring_{args.model}.json"
    out.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    for key, value in figures.items():
        print(f"{key}: {value}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
