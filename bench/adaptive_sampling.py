"""Adaptive sampling against fixed N on the demo world: samples drawn, per-query ΔSePer_S against
the fixed-N 95 % CI, and the world's validity r.

Four runs of ``ragutil run`` on ``examples/demo.yaml`` cut to BM25 at k = 5 (the rag condition for
per-query ΔSePer, the five per_doc passages for validity), each in its own ``$RAGUTIL_HOME``:

* ``fixed``          — N = 10 per prompt, seed 0 (the reference);
* ``fixed_redraw``   — N = 10, seed 1: an independent fixed-N draw;
* ``adaptive``       — ``sampling.adaptive`` at its defaults, seed 0: a prompt's N_q samples are
  the first N_q of ``fixed`` (every round continues the prompt's sample stream);
* ``adaptive_redraw`` — adaptive, seed 1 (the first samples of ``fixed_redraw``, none of ``fixed``).

The fixed-N 95 % CI of a query's ΔSePer_S is a percentile bootstrap over its N samples: each of
2,000 resamples draws N of the closed-book samples and N of the rag samples with replacement,
independently; SePer_S of a resample re-softmaxes the drawn samples' mean token log-probs into
weights and sums weight × soft-kernel credit (the credit of a sample does not depend on the
others: the soft kernel scores each sample against the gold answers). The share of the
re-draws' ΔSePer_S inside that CI says how strict the criterion is: a fixed-N run with another
seed is as good an estimate as the reference, yet lands inside it only that often.

Validity r: the pipeline's ``pearson_delta_seper_s_true_utility`` — Pearson r between ΔSePer_S of
the per_doc passages and the world's ground-truth utility, over the questions the reader does not
answer closed book (SePer Table 2's protocol) — with a 95 % CI by bootstrap over those queries
(2,000 resamples; a query's passages stay together).

    python bench/adaptive_sampling.py --home /tmp/adaptive-bench    # runs what is missing
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import yaml

from ragutil_dagster.evaluation.scoring import soft_seper, table_entail
from ragutil_dagster.metrics.seper import seper_standard_error
from ragutil_dagster.metrics.stats import bootstrap_mean_ci
from ragutil_dagster.resources import ArtifactStore

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "adaptive_sampling.json"
K = 5
RESAMPLES = 2000
VARIANTS = {  # name -> (seed, adaptive)
    "fixed": (0, False),
    "fixed_redraw": (1, False),
    "adaptive": (0, True),
    "adaptive_redraw": (1, True),
}
CONTEXT = f"reader|world__bm25__k{K}"
CLOSED_BOOK = "world|reader"


def variant_config(seed: int, adaptive: bool, max_queries: int) -> dict:
    config = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    config.update(seed=seed, name=f"demo-adaptive-bench-{seed}-{int(adaptive)}",
                  retrievers=[r for r in config["retrievers"] if r["kind"] == "bm25"], k=[K])
    config["datasets"][0]["max_queries"] = max_queries
    if adaptive:
        config["sampling"]["adaptive"] = {}
    return config


def run_variant(home: Path, name: str, max_queries: int) -> float:
    """``ragutil run`` of the variant in ``home/name`` unless already done; its wall seconds."""
    target = home / name
    done = target / "bench_seconds.json"
    if done.is_file():
        return json.loads(done.read_text())["seconds"]
    target.mkdir(parents=True, exist_ok=True)
    seed, adaptive = VARIANTS[name]
    config_path = target / "config.yaml"
    config_path.write_text(yaml.safe_dump(variant_config(seed, adaptive, max_queries)))
    env = {**os.environ, "RAGUTIL_HOME": str(target), "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ragutil_dagster.cli", "run", str(config_path), "--quiet"],
                   env=env, check=True)
    seconds = time.perf_counter() - start
    done.write_text(json.dumps({"seconds": seconds}))
    return seconds


def credit_table(store: ArtifactStore) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """Per (query, condition, doc) group: each sample's log SePer weight (its mean answer
    log-prob up to a constant, which a softmax ignores) and soft-kernel credit, from the stored
    samples and NLI probabilities."""
    samples = pl.concat([store.read_table("closed_book_generations", CLOSED_BOOK),
                         store.read_table("generations", CONTEXT)])
    queries = store.read_table("setting_queries", f"world__bm25__k{K}")
    entail = table_entail(store.read_table("nli_probabilities", CONTEXT))
    return {key: (np.log(r.weights), r.credits) for key, r in soft_seper(samples, queries, entail).items()}


def resampled_seper(scores: np.ndarray, credits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """SePer_S of RESAMPLES bootstrap resamples of one group's samples."""
    picks = rng.integers(0, scores.size, size=(RESAMPLES, scores.size))
    logits = scores[picks]
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    return (weights * credits[picks]).sum(axis=1)


def delta_seper(table: dict, qid: str) -> float:
    def seper(key: tuple) -> float:
        scores, credits = table[key]
        weights = np.exp(scores - scores.max())
        return float((weights / weights.sum()) @ credits)
    return seper((qid, "rag", None)) - seper((qid, "closed_book", None))


def fixed_cis(table: dict, rng: np.random.Generator) -> dict[str, tuple[float, float]]:
    """Per query, the percentile bootstrap 95 % CI of ΔSePer_S over its fixed-N samples."""
    cis = {}
    for qid in sorted({k[0] for k in table if k[1] == "rag"}):
        delta = resampled_seper(*table[(qid, "rag", None)], rng) - resampled_seper(*table[(qid, "closed_book", None)], rng)
        low, high = np.percentile(delta, [2.5, 97.5])
        cis[qid] = (float(low), float(high))
    return cis


def standard_error_cis(table: dict) -> dict[str, tuple[float, float]]:
    """Per query, ΔSePer_S ± 1.96 · √(SE_rag² + SE_closed²) with the Jeffreys-floored SE of
    ``metrics.seper.seper_standard_error`` over the fixed-N samples: never of zero width."""
    cis = {}
    for qid in sorted({k[0] for k in table if k[1] == "rag"}):
        errors = []
        for condition in ("rag", "closed_book"):
            scores, credits = table[(qid, condition, None)]
            weights = np.exp(scores - scores.max())
            errors.append(seper_standard_error(credits, weights / weights.sum()))
        half = 1.96 * float(np.hypot(*errors))
        cis[qid] = (delta_seper(table, qid) - half, delta_seper(table, qid) + half)
    return cis


def share_inside(cis: dict, table: dict) -> float:
    inside = [low - 1e-12 <= delta_seper(table, qid) <= high + 1e-12 for qid, (low, high) in cis.items()]
    return float(np.mean(inside))


def mean_with_ci(table: dict, store: ArtifactStore, queries: list[str]) -> dict[str, float]:
    """Mean ΔSePer_S over the queries with its bootstrap 95 % CI (as MLflow logs it), the
    per-query values checked against the pipeline's ``metric_scores``."""
    values = [delta_seper(table, q) for q in queries]
    stored = dict(store.read_table("metric_scores", CONTEXT).select("query_id", "delta_seper_s").iter_rows())
    assert max(abs(stored[q] - v) for q, v in zip(queries, values)) < 1e-9
    interval = bootstrap_mean_ci(values)
    return {"mean": float(np.mean(values)), "ci_low": interval.low, "ci_high": interval.high}


PAIRS = (("adaptive", "fixed"), ("adaptive_redraw", "fixed_redraw"), ("fixed_redraw", "fixed"))
"""Paired per-query differences of ΔSePer_S: adaptive against fixed N with the same seed, and the
fixed-N re-draw against the reference (what noise alone moves)."""


def paired_shift(tables: dict, first: str, second: str, queries: list[str]) -> dict[str, float]:
    """Mean over queries of ΔSePer_S(first) − ΔSePer_S(second), with its bootstrap 95 % CI."""
    differences = [delta_seper(tables[first], q) - delta_seper(tables[second], q) for q in queries]
    interval = bootstrap_mean_ci(differences)
    return {"mean": float(np.mean(differences)), "ci_low": interval.low, "ci_high": interval.high}


def validity_r(store: ArtifactStore, rng: np.random.Generator) -> dict[str, float]:
    """The pipeline's validity r — Pearson r of per_doc ΔSePer_S with true utility over the
    questions not answered closed book (``evaluation/scoring._validity_correlations``) — recomputed
    from the stored tables (checked against the summary), and its query-bootstrap 95 % CI."""
    unanswered = store.read_table("metric_scores", CONTEXT).filter(~pl.col("answer_has_closed"))["query_id"]
    documents = store.read_table("document_scores", CONTEXT).filter(
        pl.col("true_utility").is_not_null() & pl.col("query_id").is_in(unanswered.to_list()))
    by_query = [(part["delta_seper_s"].to_numpy(), part["true_utility"].to_numpy())
                for _, part in documents.group_by("query_id", maintain_order=True)]
    x = np.concatenate([a for a, _ in by_query])
    y = np.concatenate([b for _, b in by_query])
    r = float(np.corrcoef(x, y)[0, 1])
    summary = store.read_json("metric_scores", CONTEXT, "summary")
    assert abs(r - summary["pearson_delta_seper_s_true_utility"]) < 1e-9, (r, summary)
    draws = []
    for _ in range(RESAMPLES):
        picked = [by_query[i] for i in rng.integers(0, len(by_query), len(by_query))]
        a, b = np.concatenate([p[0] for p in picked]), np.concatenate([p[1] for p in picked])
        if np.ptp(a) > 0 and np.ptp(b) > 0:
            draws.append(np.corrcoef(a, b)[0, 1])
    low, high = np.percentile(draws, [2.5, 97.5])
    return {"r": r, "ci_low": float(low), "ci_high": float(high), "passages": int(x.size), "queries": len(by_query)}


def samples_drawn(store: ArtifactStore) -> dict[str, int]:
    counts = {}
    for asset, partition in (("closed_book_generations", CLOSED_BOOK), ("generations", CONTEXT)):
        rows = store.read_table(asset, partition).filter(pl.col("decoding") == "sample")
        for condition, n in rows.group_by("condition").len().iter_rows():
            counts[condition] = int(n)
    return counts


def samples_per_group(store: ArtifactStore) -> dict[str, int]:
    """How many (query, condition, doc) groups drew each number of samples."""
    rows = pl.concat([store.read_table(asset, partition).filter(pl.col("decoding") == "sample")
                      for asset, partition in (("closed_book_generations", CLOSED_BOOK), ("generations", CONTEXT))])
    counts = rows.group_by("query_id", "condition", "doc_id").len("drawn").group_by("drawn").len("groups").sort("drawn")
    return {str(n): int(groups) for n, groups in counts.iter_rows()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, required=True, help="a directory holding one RAGUTIL_HOME per run")
    parser.add_argument("--max-queries", type=int, default=200)
    args = parser.parse_args()
    seconds = {name: run_variant(args.home, name, args.max_queries) for name in VARIANTS}
    stores = {name: ArtifactStore(home=str(args.home / name)) for name in VARIANTS}
    tables = {name: credit_table(store) for name, store in stores.items()}
    rng = np.random.default_rng(0)
    cis = fixed_cis(tables["fixed"], rng)
    se_cis = standard_error_cis(tables["fixed"])
    drawn = {name: samples_drawn(store) for name, store in stores.items()}
    fraction = {name: sum(drawn[name].values()) / sum(drawn["fixed"].values()) for name in VARIANTS}
    result = {
        "command": "python bench/adaptive_sampling.py --home DIR",
        "config": f"examples/demo.yaml, BM25, k = {K}, {args.max_queries} queries, N = 10",
        "queries": len(cis),
        "ci": f"percentile bootstrap 95 % over the N samples of each condition, {RESAMPLES} resamples",
        "run_seconds": seconds,
        "samples_drawn": drawn,
        "sample_fraction": fraction,
        "groups_by_samples_drawn": {name: samples_per_group(store) for name, store in stores.items()},
        "sample_fraction_by_condition": {
            name: {c: drawn[name][c] / drawn["fixed"][c] for c in drawn["fixed"]} for name in VARIANTS
        },
        "inside_fixed_ci": {name: share_inside(cis, tables[name]) for name in VARIANTS if name != "fixed"},
        "zero_width_fixed_ci": float(np.mean([high - low < 1e-9 for low, high in cis.values()])),
        "inside_fixed_se_ci": {name: share_inside(se_cis, tables[name]) for name in VARIANTS if name != "fixed"},
        "mean_delta_seper_s": {name: mean_with_ci(tables[name], stores[name], sorted(cis)) for name in VARIANTS},
        "paired_shift": {f"{a}-{b}": paired_shift(tables, a, b, sorted(cis)) for a, b in PAIRS},
        "validity_r": {name: validity_r(store, rng) for name, store in stores.items()},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'run':16} {'samples':>8} {'fraction':>9} {'in boot CI':>11} {'in SE CI':>9} "
          f"{'mean ΔSePer_S [95% CI]':>27} {'validity r [95% CI]':>26}")
    for name in VARIANTS:
        v, m = result["validity_r"][name], result["mean_delta_seper_s"][name]
        inside, inside_se = result["inside_fixed_ci"].get(name), result["inside_fixed_se_ci"].get(name)
        print(f"{name:16} {sum(drawn[name].values()):8d} {fraction[name]:9.3f} "
              f"{'—' if inside is None else f'{inside:.3f}':>11} {'—' if inside_se is None else f'{inside_se:.3f}':>9} "
              f"{m['mean']:8.4f} [{m['ci_low']:.4f}, {m['ci_high']:.4f}] "
              f"{v['r']:8.3f} [{v['ci_low']:.3f}, {v['ci_high']:.3f}]")
    print(f"groups by samples drawn, adaptive: {result['groups_by_samples_drawn']['adaptive']}")
    for pair, shift in result["paired_shift"].items():
        print(f"paired ΔSePer_S shift {pair}: {shift['mean']:.4f} [{shift['ci_low']:.4f}, {shift['ci_high']:.4f}]")
    print(f"fixed-N bootstrap CIs of zero width (all N samples alike in both conditions): "
          f"{result['zero_width_fixed_ci']:.3f}")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
