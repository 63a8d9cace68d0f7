"""N-sample generation speed: HFGenerator vs the SePer reference's way of sampling (issue 3).

Baseline, as the SePer reference code samples: per question, the prompt repeated N times in one
``model.generate`` batch, then ``compute_transition_scores`` for the token log-probs. A second
baseline passes the prompt once with ``num_return_sequences=N`` (transformers expands the prompt
before prefill, so it costs the same N prefills). Ours: one ``HFGenerator.sample`` call over all
prompts (many prompts per batch, one prefill per prompt, KV cache expanded to N rows). Same model,
same prompts, same machine, interleaved repeats. The fastest run of each method is the headline
(on a machine shared with other work, the least disturbed run estimates the cost best); medians
are recorded too.

The NLI section counts entailment pairs on sampled answers of SePer-shaped requests (closed-book,
top-k together, and each top-k passage alone, N samples each): "naive" is what an implementation
without deduplication queries — for every question and condition, every ordered pair of
responses for clustering plus both directions between each response and each gold answer —
and "dedup" the distinct pairs ``Entailment`` actually ran through the model for the whole run.
Realistic samples need a trained reader: pass ``--reader`` and ``--nli`` (e.g. the ``reader/``
and ``nli/`` of ``ragutil_dagster.embedded.training.train_all``) and the world's seed and size.
Without them the random bench model answers, which has far fewer duplicates than a real LM.

    python bench/generation.py [--prompts 8] [--n 10] [--prompt-tokens 512] [--new-tokens 16]
        [--repeats 3] [--device cpu|cuda] [--qwen-config] [--vllm]
        [--reader DIR --nli DIR --world-seed 0 --world-size ci] [--questions 40]

Writes bench/results/generation.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch

from ragutil_dagster.models.causal_lm import CausalLM, load_causal_lm
from ragutil_dagster.models.hf_backend import HFGenerator
from ragutil_dagster.sampling import SamplingParams
from ragutil_dagster.testing.tiny import (
    build_causal_lm,
    build_nli_classifier,
    build_random_qwen,
    corpus_lines,
    train_bpe_tokenizer,
)

RESULTS = Path(__file__).parent / "results" / "generation.json"

# Qwen2.5-0.5B's published architecture (config.json of Qwen/Qwen2.5-0.5B), randomly initialised.


def build_bench_model(root: Path, qwen_config: bool, positions: int) -> Path:
    """The tiny project LM, or a random model of Qwen2.5-0.5B's shape with the tiny tokenizer."""
    if not qwen_config:
        return build_causal_lm(root / "tiny-lm", seed=0, max_positions=max(positions, 2048))
    return build_random_qwen(root / "qwen2.5-0.5b-random", train_bpe_tokenizer(512))


def make_prompts(lm: CausalLM, count: int, tokens: int, seed: int) -> list[str]:
    """``count`` distinct prompts of about ``tokens`` tokens: shuffled built-in sentences."""
    rng = random.Random(seed)
    sentences = corpus_lines()
    prompts = []
    for _ in range(count):
        text = ""
        while len(lm.tokenizer(text)["input_ids"]) < tokens:
            text += " ".join(rng.sample(sentences, len(sentences))) + " "
        ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"][: tokens - 1]
        prompts.append(lm.tokenizer.decode(ids))
    return prompts


def reference_sampling(
    lm: CausalLM, prompts: list[str], n: int, new_tokens: int, repeat_prompt: bool
) -> int:
    """SePer reference style: one ``generate`` per question, then transition scores.

    ``repeat_prompt``: the prompt repeated n times in the batch (the reference); otherwise
    ``num_return_sequences=n``. Returns the number of generated tokens.
    """
    generated = 0
    for prompt in prompts:
        batch = [prompt] * (n if repeat_prompt else 1)
        enc = lm.tokenizer(batch, return_tensors="pt").to(lm.device)
        with torch.inference_mode():
            out = lm.model.generate(
                **enc,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=new_tokens,
                num_return_sequences=1 if repeat_prompt else n,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=lm.pad_id,
            )
            scores = lm.model.compute_transition_scores(
                out.sequences, out.scores, normalize_logits=True
            )
        answers = out.sequences[:, enc["input_ids"].shape[1] :]
        lm.tokenizer.batch_decode(answers, skip_special_tokens=True)
        generated += int(torch.isfinite(scores).sum())
    return generated


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = fn()
    return time.perf_counter() - start, tokens


def speed(args: argparse.Namespace, model_dir: Path) -> dict[str, object]:
    lm = load_causal_lm(str(model_dir), device=args.device)
    prompts = make_prompts(lm, args.prompts, args.prompt_tokens, seed=1)
    prompt_tokens = statistics.mean(len(ids) for ids in lm.encode_prompts(prompts))
    ours = HFGenerator(lm, show_progress=False, max_batch_rows=args.batch_rows)

    def run_ours() -> int:
        samples = ours.sample(
            prompts, SamplingParams(n=args.n, max_new_tokens=args.new_tokens, seed=0)
        )
        return sum(len(s.token_ids) for per in samples for s in per)

    runs: dict[str, Callable[[], int]] = {
        "reference (prompt repeated N times)": lambda: reference_sampling(
            lm, prompts, args.n, args.new_tokens, repeat_prompt=True
        ),
        "generate(num_return_sequences=N)": lambda: reference_sampling(
            lm, prompts, args.n, args.new_tokens, repeat_prompt=False
        ),
        "HFGenerator": run_ours,
    }
    if args.vllm:
        from ragutil_dagster.models.vllm_backend import VLLMGenerator

        engine = VLLMGenerator(str(model_dir), show_progress=False, gpu_memory_utilization=0.5)

        def run_vllm() -> int:
            samples = engine.sample(
                prompts, SamplingParams(n=args.n, max_new_tokens=args.new_tokens, seed=0)
            )
            return sum(len(s.token_ids) for per in samples for s in per)

        runs["VLLMGenerator"] = run_vllm
    for fn in runs.values():  # warm-up: lazy init, allocator, kernels
        fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    tokens: dict[str, int] = {}
    for _ in range(args.repeats):  # interleaved so machine load hits every method alike
        for name, fn in runs.items():
            seconds, tokens[name] = timed(fn)
            times[name].append(seconds)
    samples = args.prompts * args.n
    table = {
        name: {
            "seconds": min(ts),
            "samples_per_s": samples / min(ts),
            "median_samples_per_s": samples / statistics.median(ts),
            "tokens_per_sample": tokens[name] / samples,
            "all_seconds": ts,
        }
        for name, ts in times.items()
    }
    return {
        "table": table,
        "prompt_tokens": prompt_tokens,
        "device": str(lm.device),
        "dtype": str(lm.dtype).removeprefix("torch."),
    }


def nli_pairs(args: argparse.Namespace, bench_model: Path, root: Path) -> dict[str, object]:
    """Sample SePer-shaped requests and count NLI pairs before and after deduplication."""
    from ragutil_dagster import prompts as templates
    from ragutil_dagster.embedded.world import make_world
    from ragutil_dagster.metrics.seper import SePerInput, seper_batch
    from ragutil_dagster.models.entailment import Entailment

    realistic = args.reader is not None
    reader = args.reader or bench_model
    nli_dir = args.nli or build_nli_classifier(root / "tiny-nli", seed=0)
    world = make_world(args.world_seed, args.world_size)
    gen = HFGenerator(str(reader), device=args.device, show_progress=False)
    requests: list[tuple[str, str, tuple[str, ...]]] = []  # (question, prompt, gold answers)
    for q in world.questions[: args.questions]:
        docs = [world.passage_by_id[j.passage_id] for j in q.judgements][: args.k]
        pairs = [(p.title, p.text) for p in docs]
        requests.append((q.text, templates.closed_book(q.text), q.answers))
        requests.append((q.text, templates.with_context(q.text, pairs), q.answers))
        requests += [(q.text, templates.with_context(q.text, [pair]), q.answers) for pair in pairs]
    samples = gen.sample(
        [r[1] for r in requests],
        SamplingParams(n=args.n, max_new_tokens=args.answer_tokens, stop=["\n"], seed=0),
    )
    inputs = [
        SePerInput(
            [s.text.strip() for s in per], [s.token_logprobs for s in per], list(gold), question
        )
        for (question, _, gold), per in zip(requests, samples, strict=True)
    ]
    entail = Entailment(
        str(nli_dir), device=args.device, cache=root / "nli.sqlite", show_progress=False
    )
    seper_batch(inputs, entail)
    naive = sum(
        len(i.responses) * (len(i.responses) - 1) + 2 * len(i.responses) * len(i.gold_answers)
        for i in inputs
    )
    distinct_answers = statistics.mean(len(set(i.responses)) for i in inputs)
    return {
        "nli_pairs": naive,
        "nli_pairs_dedup": entail.stats.computed,
        "nli_requests": len(inputs),
        "nli_mean_distinct_answers": distinct_answers,
        "nli_samples_from": "trained reader" if realistic else "random bench model (unrealistic)",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-rows", type=int, default=80, help="HFGenerator max_batch_rows")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--qwen-config",
        action="store_true",
        help="random model of Qwen2.5-0.5B's configuration instead of the tiny LM",
    )
    parser.add_argument("--vllm", action="store_true", help="also time VLLMGenerator (GPU)")
    parser.add_argument("--reader", type=Path, help="trained reader LM for realistic NLI samples")
    parser.add_argument("--nli", type=Path, help="NLI model directory (tiny random one by default)")
    parser.add_argument("--world-seed", type=int, default=0)
    parser.add_argument("--world-size", default="ci")
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--k", type=int, default=3, help="passages per question (rag and per-doc)")
    parser.add_argument("--answer-tokens", type=int, default=12)
    args = parser.parse_args()
    torch.manual_seed(0)  # the baselines sample from the global RNG

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = build_bench_model(root, args.qwen_config, args.prompt_tokens + args.new_tokens)
        result = speed(args, model_dir)
        nli = nli_pairs(args, model_dir, root)

    table = result["table"]
    ours = table["HFGenerator"]["samples_per_s"]
    base = table["reference (prompt repeated N times)"]["samples_per_s"]
    model = "random Qwen2.5-0.5B config" if args.qwen_config else "tiny LM (tiny.build_causal_lm)"
    print(
        f"{model}, {result['device']} {result['dtype']}, {args.prompts} prompts of "
        f"~{result['prompt_tokens']:.0f} tokens, N = {args.n}, {args.new_tokens} new tokens, "
        f"best of {args.repeats}"
    )
    print(
        f"{'method':<40}{'seconds':>10}{'samples/s':>12}{'tokens/sample':>15}{'vs reference':>14}"
    )
    for name, row in table.items():
        print(
            f"{name:<40}{row['seconds']:>10.2f}{row['samples_per_s']:>12.1f}"
            f"{row['tokens_per_sample']:>15.1f}{row['samples_per_s'] / base:>13.2f}x"
        )
    print(
        f"NLI pairs on {nli['nli_requests']} SePer requests ({nli['nli_samples_from']}, "
        f"{nli['nli_mean_distinct_answers']:.1f} distinct answers of {args.n}): "
        f"naive {nli['nli_pairs']:,} -> dedup {nli['nli_pairs_dedup']:,}"
    )
    summary = {
        "samples_per_s": ours,
        "baseline_samples_per_s": base,
        "ratio": ours / base,
        "median_ratio": table["HFGenerator"]["median_samples_per_s"]
        / table["reference (prompt repeated N times)"]["median_samples_per_s"],
        "num_return_sequences_samples_per_s": table["generate(num_return_sequences=N)"][
            "samples_per_s"
        ],
        **({"vllm_samples_per_s": table["VLLMGenerator"]["samples_per_s"]} if args.vllm else {}),
        **nli,
        "model": model,
        "device": result["device"],
        "dtype": result["dtype"],
        "prompts": args.prompts,
        "prompt_tokens": result["prompt_tokens"],
        "n": args.n,
        "new_tokens": args.new_tokens,
        "table": table,
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "torch_threads": torch.get_num_threads(),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp_file = RESULTS.with_suffix(".json.tmp")
    tmp_file.write_text(json.dumps(summary, indent=2))
    tmp_file.replace(RESULTS)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
