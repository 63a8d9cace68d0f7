"""The answer NLI's pairs/s on this CPU by runtime, and how many labels each keeps (issue 29 item 3).

The cross-encoder (``embedded:nli`` by default: all-MiniLM-L6-v2 fine-tuned for answer
equivalence) judges real answer pairs in SePer's ``"{q}? {answer}"`` form — SQuAD annotator
pairs and other-question pairs of one paragraph (``bench/nli_real.py``'s ``squad`` set) — through
``models.entailment.Entailment._predict``, so every runtime sees the same tokenisation and the same
length batching; only the forward pass differs:

* ``float32`` — eager PyTorch, the CPU default;
* ``bfloat16`` — eager PyTorch with bfloat16 weights (emulated on CPUs without AVX512-BF16 / AMX);
* ``compiled`` — ``torch.compile(model, dynamic=True)`` (Inductor), float32; its first pass, which
  compiles, is timed apart as ``warmup_seconds``;
* ``compiled-bfloat16`` — the same compiled model with bfloat16 weights (native on AMX CPUs).

Labels kept = share of pairs whose argmax label equals float32 eager's; the largest absolute
difference in P(entailment) is reported too. Each runtime judges the pairs ``--repeats`` times
after a warm-up pass; pairs/s is the best of those.

    python bench/nli_runtime.py [--model embedded:nli] [--pairs 2000] [--repeats 3]

Writes ``bench/results/nli_runtime.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nli_real import SQUAD, squad_pairs  # noqa: E402
from vllm_cpu import cpu_model  # noqa: E402

from ragutil_dagster.metrics.seper import nli_text  # noqa: E402
from ragutil_dagster.models.device import cpu_has_native_bf16  # noqa: E402
from ragutil_dagster.models.entailment import Entailment  # noqa: E402
from ragutil_dagster.models.resolver import resolve  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
LABELS_KEPT_TARGET = 0.995
RUNTIMES = ("float32", "bfloat16", "compiled", "compiled-bfloat16")


def judge(
    entailment: Entailment, premises: list[str], hypotheses: list[str], repeats: int
) -> tuple[np.ndarray, float, float]:
    """Probabilities, the warm-up pass's seconds and the best pass's seconds."""
    start = time.perf_counter()
    probs = entailment._predict(premises, hypotheses)
    warmup = time.perf_counter() - start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        probs = entailment._predict(premises, hypotheses)
        best = min(best, time.perf_counter() - start)
    return probs, warmup, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", default="embedded:nli", help="NLI model: name, directory or embedded:nli"
    )
    parser.add_argument("--pairs", type=int, default=2000, help="pairs judged (half equivalent)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--runtimes",
        default=",".join(RUNTIMES),
        help=f"comma-separated, among {', '.join(RUNTIMES)}; float32 (the reference) always runs",
    )
    parser.add_argument("--squad", type=Path, default=SQUAD)
    parser.add_argument("--out", type=Path, default=RESULTS / "nli_runtime.json")
    args = parser.parse_args()

    pairs = squad_pairs(args.squad, args.pairs // 2)
    premises = [nli_text(p.first, p.question) for p in pairs]
    hypotheses = [nli_text(p.second, p.question) for p in pairs]
    ref = resolve(args.model)
    runtimes: dict[str, dict[str, float]] = {}
    reference: np.ndarray | None = None
    for name in ("float32", *(r for r in args.runtimes.split(",") if r != "float32")):
        if name not in RUNTIMES:
            parser.error(f"unknown runtime {name!r}; choose among {', '.join(RUNTIMES)}")
        entailment = Entailment(
            ref,
            device="cpu",
            dtype="bfloat16" if name.endswith("bfloat16") else "float32",
            cache=False,
            show_progress=False,
            compile_after_seconds=None,
        )
        if name.startswith("compiled"):
            entailment.model = torch.compile(entailment.model, dynamic=True)
        probs, warmup, seconds = judge(entailment, premises, hypotheses, args.repeats)
        if reference is None:
            reference = probs
        labels_kept = float(np.mean(probs.argmax(1) == reference.argmax(1)))
        runtimes[name] = {
            "pairs_per_second": len(pairs) / seconds,
            "seconds": seconds,
            "warmup_seconds": warmup,
            "labels_kept": labels_kept,
            "max_abs_diff_p_entailment": float(np.abs(probs[:, 2] - reference[:, 2]).max()),
            "keeps_labels": labels_kept >= LABELS_KEPT_TARGET,
        }
        row = runtimes[name]
        print(
            f"{name:12s} {row['pairs_per_second']:8.1f} pairs/s  warm-up {warmup:6.1f} s  "
            f"labels kept {labels_kept:.4f}  max |ΔP(e)| {row['max_abs_diff_p_entailment']:.4f}",
            flush=True,
        )
    eligible = {name: row for name, row in runtimes.items() if row["keeps_labels"]}
    fastest = max(eligible, key=lambda name: eligible[name]["pairs_per_second"])
    base = runtimes["float32"]["pairs_per_second"]
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "machine": {
            "platform": platform.platform(),
            "cpu": cpu_model(),
            "native_bf16": cpu_has_native_bf16(),
            "cores": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "model": ref.identity,
        "pairs": len(pairs),
        "runtimes": runtimes,
        "fastest_keeping_labels": fastest,
        "ratios": {
            f"{name}_vs_float32": row["pairs_per_second"] / base for name, row in runtimes.items()
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"fastest keeping ≥ {LABELS_KEPT_TARGET:.1%} of the labels: {fastest}; wrote {args.out}")


if __name__ == "__main__":
    main()
