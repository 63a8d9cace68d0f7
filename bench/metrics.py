"""Speed of the batched SePer path with an instant lookup-table NLI (issue: metric core).

Scores 10,000 synthetic questions at N = 10 through ``seper_batch`` (soft and hard kernels) with an
``entail`` that is a dictionary lookup, so the figure is the metric's own overhead: pair planning,
deduplication, clustering and kernel sums. Prints a table and writes bench/results/metrics.json.

    python bench/metrics.py [--questions 10000] [--n 10]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import date
from pathlib import Path

import numpy as np

from ragutil_dagster.metrics.seper import SePerInput, seper_batch

RESULTS = Path(__file__).parent / "results" / "metrics.json"
ENTAILMENT = np.array([0.02, 0.08, 0.90])
CONTRADICTION = np.array([0.90, 0.08, 0.02])


def make_questions(n_questions: int, n_samples: int, seed: int) -> list[SePerInput]:
    """Questions whose samples draw from a few answers each (some shared across questions),
    like real sampled generations: many duplicates, a handful of distinct strings."""
    rng = np.random.default_rng(seed)
    items = []
    for q in range(n_questions):
        pool = [f"answer {q % 500}-{j}" for j in range(4)] + [
            f"answer {q}-rare{j}" for j in range(3)
        ]
        probs = np.array([0.5, 0.2, 0.1, 0.05, 0.05, 0.05, 0.05])
        chosen = rng.choice(len(pool), size=n_samples, p=probs)
        responses = [pool[i] for i in chosen]
        logprobs = [rng.uniform(-3, 0, size=rng.integers(1, 6)).tolist() for _ in range(n_samples)]
        items.append(SePerInput(responses, logprobs, [pool[0]], question=f"question {q}"))
    return items


class LookupNLI:
    """Entailment when both texts name the same answer family, contradiction otherwise."""

    def __init__(self) -> None:
        self.pairs = 0

    def __call__(self, premises, hypotheses) -> np.ndarray:
        self.pairs += len(premises)
        same = np.fromiter(
            (p.split("-")[0] == h.split("-")[0] for p, h in zip(premises, hypotheses)),
            dtype=bool,
            count=len(premises),
        )
        return np.where(same[:, None], ENTAILMENT, CONTRADICTION)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=10_000)
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    items = make_questions(args.questions, args.n, args.seed)
    rows = {}
    for kernel in ("soft", "hard"):
        nli = LookupNLI()
        start = time.perf_counter()
        results = seper_batch(items, nli, kernel=kernel)
        elapsed = time.perf_counter() - start
        assert len(results) == len(items)
        rows[kernel] = {
            "seconds": elapsed,
            "ms_per_question": 1000 * elapsed / len(items),
            "nli_pairs": nli.pairs,
            "naive_nli_pairs": len(items) * (args.n * (args.n - 1) + 2 * args.n),
            "mean_score": float(np.mean([r.score for r in results])),
        }

    print(f"SePer batched path, {args.questions} questions, N = {args.n}, lookup-table NLI")
    print(f"{'kernel':<8}{'total s':>10}{'ms/question':>14}{'NLI pairs':>12}{'naive pairs':>14}")
    for kernel, row in rows.items():
        print(
            f"{kernel:<8}{row['seconds']:>10.2f}{row['ms_per_question']:>14.3f}"
            f"{row['nli_pairs']:>12,}{row['naive_nli_pairs']:>14,}"
        )
    summary = {
        "ms_per_question": rows["soft"]["ms_per_question"],
        "ms_per_question_hard": rows["hard"]["ms_per_question"],
        "questions": args.questions,
        "n": args.n,
        "nli_pairs": rows["soft"]["nli_pairs"],
        "naive_nli_pairs": rows["soft"]["naive_nli_pairs"],
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
