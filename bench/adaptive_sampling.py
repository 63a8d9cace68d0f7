"""Adaptive sampling against fixed N: samples drawn, per-query ΔSePer_S against the fixed-N
95 % CI, and (on the demo world) the world's validity r.

Two workloads, each run as ``ragutil run`` variants in their own ``$RAGUTIL_HOME``:

* ``demo`` — ``examples/demo.yaml`` cut to BM25 at k = 5 (the rag condition for per-query
  ΔSePer, the five per_doc passages for validity), four variants:

  * ``fixed``           — N = 10 per prompt, seed 0 (the reference);
  * ``fixed_redraw``    — N = 10, seed 1: an independent fixed-N draw;
  * ``adaptive``        — ``sampling.adaptive`` at its defaults, seed 0: a prompt's N_q samples
    are the first N_q of ``fixed`` (every round continues the prompt's sample stream);
  * ``adaptive_redraw`` — adaptive, seed 1 (the first samples of ``fixed_redraw``, none of
    ``fixed``).

* ``squad`` — ``examples/squad-compression.yaml`` as it is (40 SQuAD questions, SmolLM2 on vLLM,
  BM25 at k = 5, uncompressed and five compressed settings: 240 setting × question ΔSePer_S
  values), variants ``fixed`` and ``adaptive`` (seed 0). ``--caches-from HOME`` copies an
  earlier run's caches and installed models (``cache``, ``embedded``, ``models``) into each fresh
  home, so the fixed variant re-reads its samples and the adaptive one draws only its rounds; the
  statistics do not depend on it, the run seconds do.

The fixed-N 95 % CI of a query's ΔSePer_S is a percentile bootstrap over its N samples: each of
2,000 resamples draws N of the closed-book samples and N of the context samples with replacement,
independently; SePer_S of a resample re-softmaxes the drawn samples' mean token log-probs into
weights and sums weight × soft-kernel credit (the credit of a sample does not depend on the
others: the soft kernel scores each sample against the gold answers). A value is inside the CI
strictly, and at the reports' resolution: within the CI widened by half of ΔSePer's last printed
decimal (``RESOLUTION``). Where every sample of both conditions misses the gold, each credit is
an entailment probability near 0 (0.001 ± 0.0005) and the CI is a few ten-thousandths wide —
narrower than the generator's own batch-composition noise (a prompt decoded among other batch
mates draws a different token in about 2 % of samples on the demo reader) —, so the strict share
counts as misses values no report can tell apart. The share of the re-draws' ΔSePer_S inside
that CI says how strict the criterion is: a fixed-N run with another seed is as good an estimate
as the reference, yet lands inside it only that often.

Validity r (demo): the pipeline's ``pearson_delta_seper_s_true_utility`` — Pearson r between
ΔSePer_S of the per_doc passages and the world's ground-truth utility, over the questions the
reader does not answer closed book (SePer Table 2's protocol) — with a 95 % CI by bootstrap over
those queries (2,000 resamples; a query's passages stay together).

    python bench/adaptive_sampling.py --home /tmp/adaptive-bench                 # demo
    python bench/adaptive_sampling.py --workload squad --home /tmp/adaptive-squad \
        --caches-from <a home where examples/squad-compression.yaml ran>
    python bench/adaptive_sampling.py ... --replay   # also the stop rule replayed over a grid of targets
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import yaml
from scipy.special import softmax

from ragutil_dagster.config import AdaptiveSamplingConfig, ExperimentConfig
from ragutil_dagster.config.sampling import CLOSED_BOOK_ALWAYS_N
from ragutil_dagster.evaluation.groups import soft_seper, table_entail
from ragutil_dagster.evaluation.prompt_sampling import continues, round_sizes
from ragutil_dagster.metrics.seper import seper_standard_error
from ragutil_dagster.metrics.stats import bootstrap_mean_ci
from ragutil_dagster.resources import ArtifactStore

ROOT = Path(__file__).resolve().parent.parent
RESAMPLES = 2000
RESOLUTION = 0.0005
"""Half of the last decimal (0.001) the reports and docs print ΔSePer to: a value this close to
the CI cannot be told from one inside it."""
CACHED = ("cache", "embedded", "models")
"""What ``--caches-from`` copies from an earlier home: the generation / NLI / compression caches
and the installed models."""


@dataclass(frozen=True)
class Workload:
    example: str
    dataset: str
    generator: str
    variants: dict[str, tuple[int, bool]]  # name -> (seed, adaptive)
    validity: bool  # the world's ground-truth utility exists

    def config(
        self, seed: int, adaptive: bool, max_queries: int | None, dtype: str | None = None
    ) -> dict:
        """The example as this variant runs it; ``dtype`` replaces the generators' (vLLM: the
        engine's) weights dtype."""
        config = yaml.safe_load((ROOT / "examples" / self.example).read_text())
        config.update(
            seed=seed, name=f"{Path(self.example).stem}-adaptive-bench-{seed}-{int(adaptive)}"
        )
        if self.validity:
            config.update(
                retrievers=[r for r in config["retrievers"] if r["kind"] == "bm25"], k=[5]
            )
        if max_queries:
            config["datasets"][0]["max_queries"] = max_queries
        if adaptive:
            config["sampling"]["adaptive"] = {}
        for generator in config["generators"] if dtype else ():
            if generator.get("backend") == "vllm":
                generator.setdefault("engine", {})["dtype"] = dtype
            else:
                generator["dtype"] = dtype
        return config

    @property
    def closed_partition(self) -> str:
        return f"{self.dataset}|{self.generator}"


WORKLOADS = {
    "demo": Workload(
        "demo.yaml",
        "world",
        "reader",
        {
            "fixed": (0, False),
            "fixed_redraw": (1, False),
            "adaptive": (0, True),
            "adaptive_redraw": (1, True),
        },
        validity=True,
    ),
    "squad": Workload(
        "squad-compression.yaml",
        "squad",
        "smollm2",
        {"fixed": (0, False), "adaptive": (0, True)},
        validity=False,
    ),
}


def run_variant(
    home: Path,
    workload: Workload,
    name: str,
    max_queries: int | None,
    dtype: str | None,
    caches_from: Path | None,
) -> float:
    """``ragutil run`` of the variant in ``home/name`` unless already done; its wall seconds."""
    target = home / name
    done = target / "bench_seconds.json"
    if done.is_file():
        return json.loads(done.read_text())["seconds"]
    target.mkdir(parents=True, exist_ok=True)
    if caches_from is not None:
        for part in CACHED:
            if (caches_from / part).is_dir() and not (target / part).exists():
                shutil.copytree(caches_from / part, target / part, symlinks=True)
    seed, adaptive = workload.variants[name]
    config_path = target / "config.yaml"
    config_path.write_text(yaml.safe_dump(workload.config(seed, adaptive, max_queries, dtype)))
    env = {**os.environ, "RAGUTIL_HOME": str(target), "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "ragutil_dagster.cli", "run", str(config_path), "--quiet"],
        env=env,
        check=True,
        cwd=ROOT,
    )
    seconds = time.perf_counter() - start
    done.write_text(json.dumps({"seconds": seconds}))
    return seconds


Tables = dict[str, dict[tuple, tuple[np.ndarray, np.ndarray]]]
"""Per setting: each (query, condition, doc) group's log SePer weights and soft-kernel credits,
the closed-book groups in every setting's table."""


def credit_table(store: ArtifactStore, workload: Workload, settings: list[str]) -> Tables:
    """Per setting and (query, condition, doc) group: each sample's log SePer weight (its mean
    answer log-prob up to a constant, which a softmax ignores) and soft-kernel credit, from the
    stored samples and NLI probabilities; checked against the pipeline's ΔSePer_S."""
    closed = store.read_table("closed_book_generations", workload.closed_partition)
    tables = {}
    for setting in settings:
        partition = f"{workload.generator}|{setting}"
        samples = pl.concat([closed, store.read_table("generations", partition)])
        queries = store.read_table("setting_queries", setting)
        entail = table_entail(store.read_table("nli_probabilities", partition))
        table = {
            key: (np.log(r.weights), r.credits)
            for key, r in soft_seper(samples, queries, entail).items()
        }
        stored = (
            store.read_table("metric_scores", partition)
            .select("query_id", "delta_seper_s")
            .iter_rows()
        )
        assert max(abs(value - delta_seper(table, qid)) for qid, value in stored) < 1e-9, setting
        tables[setting] = table
    return tables


def resampled_seper(
    scores: np.ndarray, credits: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """SePer_S of RESAMPLES bootstrap resamples of one group's samples."""
    picks = rng.integers(0, scores.size, size=(RESAMPLES, scores.size))
    return (softmax(scores[picks], axis=1) * credits[picks]).sum(axis=1)


def delta_seper(table: dict, qid: str) -> float:
    def seper(key: tuple) -> float:
        scores, credits = table[key]
        return float(softmax(scores) @ credits)

    return seper((qid, "rag", None)) - seper((qid, "closed_book", None))


def units(tables: Tables) -> list[tuple[str, str]]:
    """The (setting, query) pairs with a per-query ΔSePer_S."""
    return sorted(
        (setting, key[0]) for setting, table in tables.items() for key in table if key[1] == "rag"
    )


def fixed_cis(
    tables: Tables, rng: np.random.Generator
) -> dict[tuple[str, str], tuple[float, float]]:
    """Per (setting, query), the percentile bootstrap 95 % CI of ΔSePer_S over its fixed-N samples."""
    cis = {}
    for setting, qid in units(tables):
        table = tables[setting]
        delta = resampled_seper(*table[(qid, "rag", None)], rng) - resampled_seper(
            *table[(qid, "closed_book", None)], rng
        )
        low, high = np.percentile(delta, [2.5, 97.5])
        cis[(setting, qid)] = (float(low), float(high))
    return cis


def standard_error_cis(tables: Tables) -> dict[tuple[str, str], tuple[float, float]]:
    """Per (setting, query), ΔSePer_S ± 1.96 · √(SE_rag² + SE_closed²) with the Jeffreys-floored
    SE of ``metrics.seper.seper_standard_error`` over the fixed-N samples: never of zero width."""
    cis = {}
    for setting, qid in units(tables):
        table, errors = tables[setting], []
        for condition in ("rag", "closed_book"):
            scores, credits = table[(qid, condition, None)]
            errors.append(seper_standard_error(credits, softmax(scores)))
        half, value = 1.96 * float(np.hypot(*errors)), delta_seper(table, qid)
        cis[(setting, qid)] = (value - half, value + half)
    return cis


def share_inside(cis: dict, tables: Tables, slack: float = 0.0) -> float:
    inside = [
        low - slack - 1e-12 <= delta_seper(tables[setting], qid) <= high + slack + 1e-12
        for (setting, qid), (low, high) in cis.items()
    ]
    return float(np.mean(inside))


def mean_with_ci(tables: Tables, keys: list[tuple[str, str]]) -> dict[str, float]:
    """Mean ΔSePer_S over the (setting, query) pairs with its bootstrap 95 % CI (as MLflow logs it
    per setting)."""
    values = [delta_seper(tables[setting], qid) for setting, qid in keys]
    interval = bootstrap_mean_ci(values)
    return {"mean": float(np.mean(values)), "ci_low": interval.low, "ci_high": interval.high}


PAIRS = (("adaptive", "fixed"), ("adaptive_redraw", "fixed_redraw"), ("fixed_redraw", "fixed"))
"""Paired per-query differences of ΔSePer_S: adaptive against fixed N with the same seed, and the
fixed-N re-draw against the reference (what noise alone moves)."""


def paired_shift(
    tables: dict[str, Tables], first: str, second: str, keys: list[tuple[str, str]]
) -> dict[str, float]:
    """Mean over (setting, query) of ΔSePer_S(first) − ΔSePer_S(second), with its bootstrap 95 % CI."""
    differences = [
        delta_seper(tables[first][s], q) - delta_seper(tables[second][s], q) for s, q in keys
    ]
    interval = bootstrap_mean_ci(differences)
    return {"mean": float(np.mean(differences)), "ci_low": interval.low, "ci_high": interval.high}


def validity_r(store: ArtifactStore, partition: str, rng: np.random.Generator) -> dict[str, float]:
    """The pipeline's validity r — Pearson r of per_doc ΔSePer_S with true utility over the
    questions not answered closed book (``evaluation/summary._validity_correlations``) — recomputed
    from the stored tables (checked against the summary), and its query-bootstrap 95 % CI."""
    unanswered = store.read_table("metric_scores", partition).filter(~pl.col("answer_has_closed"))[
        "query_id"
    ]
    documents = store.read_table("document_scores", partition).filter(
        pl.col("true_utility").is_not_null() & pl.col("query_id").is_in(unanswered.to_list())
    )
    by_query = [
        (part["delta_seper_s"].to_numpy(), part["true_utility"].to_numpy())
        for _, part in documents.group_by("query_id", maintain_order=True)
    ]
    x = np.concatenate([a for a, _ in by_query])
    y = np.concatenate([b for _, b in by_query])
    r = float(np.corrcoef(x, y)[0, 1])
    summary = store.read_json("metric_scores", partition, "summary")
    assert abs(r - summary["pearson_delta_seper_s_true_utility"]) < 1e-9, (r, summary)
    draws = []
    for _ in range(RESAMPLES):
        picked = [by_query[i] for i in rng.integers(0, len(by_query), len(by_query))]
        a, b = np.concatenate([p[0] for p in picked]), np.concatenate([p[1] for p in picked])
        if np.ptp(a) > 0 and np.ptp(b) > 0:
            draws.append(np.corrcoef(a, b)[0, 1])
    low, high = np.percentile(draws, [2.5, 97.5])
    return {
        "r": r,
        "ci_low": float(low),
        "ci_high": float(high),
        "passages": int(x.size),
        "queries": len(by_query),
    }


def sample_rows(store: ArtifactStore, workload: Workload, settings: list[str]) -> pl.DataFrame:
    """Every sample the variant drew (greedy answers are not samples), with its setting
    (none for the closed-book prompts, drawn once for all settings)."""
    parts = [
        store.read_table("closed_book_generations", workload.closed_partition).with_columns(
            setting=pl.lit(None, pl.String)
        )
    ]
    parts += [
        store.read_table("generations", f"{workload.generator}|{setting}").with_columns(
            setting=pl.lit(setting)
        )
        for setting in settings
    ]
    return pl.concat(parts, how="diagonal_relaxed").filter(pl.col("decoding") == "sample")


def same_index_differs(rows: pl.DataFrame, reference: pl.DataFrame) -> dict[str, float]:
    """Of the samples ``rows`` shares by index with the same-seed ``reference``, the share whose
    text differs, and the largest log-prob difference between identical texts: the engine's
    batch-composition noise (a prompt decoded among other batch mates)."""
    keys = ["setting", "query_id", "condition", "doc_id", "sample_index"]
    joined = rows.join(reference, on=keys, nulls_equal=True, suffix="_reference")
    same = joined.filter(pl.col("text") == pl.col("text_reference"))
    logprob_gap = (
        (same["token_logprobs"].list.sum() - same["token_logprobs_reference"].list.sum())
        .abs()
        .max()
    )
    return {
        "samples": joined.height,
        "text_differs": float((joined["text"] != joined["text_reference"]).mean()),
        "max_logprob_sum_difference": float(logprob_gap or 0.0),
    }


def as_prefix(tables: Tables, reference: Tables) -> Tables:
    """``reference``'s samples cut to the number each group of ``tables`` drew: what an engine
    whose samples do not depend on their batch mates would have given the adaptive run."""
    return {
        setting: {
            key: (scores[: len(table[key][1])], credits[: len(table[key][1])])
            for key, (scores, credits) in reference[setting].items()
            if key in table
        }
        for setting, table in tables.items()
    }


REPLAY_TARGETS = (0.16, 0.18, 0.20, 0.22, 0.25, 0.28, 0.30)
FULL_CLOSED_BOOK_TARGETS = (0.22, 0.24, 0.26, 0.28)
ALWAYS_N = CLOSED_BOOK_ALWAYS_N  # the closed-book prompt always draws all N
ROUND_SHAPES = ((3, 2), (4, 3), (4, 6), (5, 5))
"""(first_round, round_size) beside 4 / 2: a smaller first round, and coarser rounds with fewer
places to stop between the first round and N (4 / 6: a prompt stops at 4 or draws all 10)."""
SHAPE_TARGETS = ((0.22, None), (0.26, None), (0.26, ALWAYS_N), (0.30, ALWAYS_N))
MIN_INSIDE_DEV = 0.96
"""What the defaults must keep on the development half: the share of rag ΔSePer_S values strictly
inside the fixed-N bootstrap CI, a point above the 0.95 the report half must show."""


def replay_rules() -> list[AdaptiveSamplingConfig]:
    """The stop rules ``--replay`` (and the realistic bench) replay: each of ``REPLAY_TARGETS``
    with ``closed_book_target_se`` at the same value and at half of it (the default), and each of
    ``FULL_CLOSED_BOOK_TARGETS`` with the closed-book prompt drawn in full (its SePer enters every
    ΔSePer of its question), and each of ``ROUND_SHAPES`` at ``SHAPE_TARGETS``."""
    return (
        [
            AdaptiveSamplingConfig(target_se=target, closed_book_target_se=closed)
            for target in REPLAY_TARGETS
            for closed in (target, None)
        ]
        + [
            AdaptiveSamplingConfig(target_se=target, closed_book_target_se=ALWAYS_N)
            for target in FULL_CLOSED_BOOK_TARGETS
        ]
        + [
            AdaptiveSamplingConfig(
                first_round=first, round_size=size, target_se=target, closed_book_target_se=closed
            )
            for first, size in ROUND_SHAPES
            for target, closed in SHAPE_TARGETS
        ]
    )


RULE_FIELDS = ("first_round", "round_size", "target_se", "closed_book_target_se")


def chosen_rule(replay_sets: list[list[dict[str, float]]]) -> dict[str, object]:
    """The rule ``sampling.adaptive``'s defaults take, chosen on development-half replays (each
    set one run's :func:`replay` rows): the fewest samples drawn (mean over the sets) among the
    rules keeping at least ``MIN_INSIDE_DEV`` of the values strictly inside the fixed-N bootstrap
    CI in every set (ties: more inside)."""
    by_rule: dict[tuple, list[dict[str, float]]] = {}
    for rows in replay_sets:
        for row in rows:
            by_rule.setdefault(tuple(row[f] for f in RULE_FIELDS), []).append(row)
    keeping = {
        rule: rows
        for rule, rows in by_rule.items()
        if len(rows) == len(replay_sets)
        and min(row["inside_fixed_ci"] for row in rows) >= MIN_INSIDE_DEV
    }
    if not keeping:
        raise SystemExit(f"no replayed rule keeps {MIN_INSIDE_DEV} of the values inside the CI")

    def cost(rule: tuple) -> tuple[float, float]:
        rows = keeping[rule]
        return (
            float(np.mean([r["sample_fraction"] for r in rows])),
            -min(r["inside_fixed_ci"] for r in rows),
        )

    rule = min(keeping, key=cost)
    return {
        **dict(zip(RULE_FIELDS, rule, strict=True)),
        "sample_fraction": [row["sample_fraction"] for row in keeping[rule]],
        "inside_fixed_ci": [row["inside_fixed_ci"] for row in keeping[rule]],
    }


def replay(
    tables: Tables, cis: dict, se_cis: dict, n_max: int, adaptive: AdaptiveSamplingConfig
) -> dict[str, float]:
    """The stop rule replayed on the fixed run's samples: each group's N_q is where
    ``evaluation/prompt_sampling.continues`` would have stopped it on its first samples, each group on
    its own. Where two groups hold one prompt (rag and per_doc at k = 1 on the realistic grid) they
    hold the same samples, stop alike and are counted twice, as the bench counts their rows; the
    share of samples drawn and of ΔSePer_S values inside the fixed-N CIs: the bootstrap ``cis``,
    strictly and at the reports' resolution, and the standard-error ``se_cis``."""
    cut: Tables = {}
    drawn = total = 0
    for setting, table in tables.items():
        cut[setting] = {}
        for key, (scores, credits) in table.items():
            n = 0
            for size in round_sizes(n_max, adaptive):
                n += size
                if not continues(
                    seper_standard_error(credits[:n], softmax(scores[:n])),
                    key[1],
                    n,
                    n_max,
                    adaptive,
                ):
                    break
            cut[setting][key] = (scores[:n], credits[:n])
            if key[1] != "closed_book" or setting == next(
                iter(tables)
            ):  # closed book: drawn once for all settings
                drawn, total = drawn + n, total + credits.size
    return {
        "first_round": adaptive.first_round,
        "round_size": adaptive.round_size,
        "target_se": adaptive.target_se,
        "closed_book_target_se": adaptive.target_for("closed_book"),
        "sample_fraction": drawn / total,
        "inside_fixed_ci": share_inside(cis, cut),
        "inside_fixed_ci_at_resolution": share_inside(cis, cut, RESOLUTION),
        "inside_fixed_se_ci": share_inside(se_cis, cut),
    }


def replay_line(row: dict[str, float]) -> str:
    """One :func:`replay` result, printed."""
    return (
        f"replayed on the fixed samples, rounds {row['first_round']} + {row['round_size']}, target_se {row['target_se']:.2f}, closed book {row['closed_book_target_se']:.3f}: "
        f"{row['sample_fraction']:.3f} of the samples, inside the fixed-N CI {row['inside_fixed_ci']:.3f} "
        f"({row['inside_fixed_ci_at_resolution']:.3f} at the reports' resolution), its SE CI {row['inside_fixed_se_ci']:.3f}"
    )


def samples_drawn(rows: pl.DataFrame) -> dict[str, int]:
    return {
        condition: int(n)
        for condition, n in rows.group_by("condition").len().sort("condition").iter_rows()
    }


def samples_per_group(rows: pl.DataFrame) -> dict[str, int]:
    """How many (setting, query, condition, doc) groups drew each number of samples."""
    counts = (
        rows.group_by("setting", "query_id", "condition", "doc_id")
        .len("drawn")
        .group_by("drawn")
        .len("groups")
    )
    return {str(n): int(groups) for n, groups in counts.sort("drawn").iter_rows()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="demo")
    parser.add_argument(
        "--home", type=Path, required=True, help="a directory holding one RAGUTIL_HOME per run"
    )
    parser.add_argument(
        "--max-queries",
        type=int,
        default=None,
        help="questions (default: 200 on the demo world, the example's own otherwise)",
    )
    parser.add_argument(
        "--caches-from",
        type=Path,
        default=None,
        help="an earlier RAGUTIL_HOME whose caches and installed models each fresh home starts from",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="the generators' dtype (default: the example's; on an AMX CPU `auto` is bfloat16)",
    )
    parser.add_argument(
        "--replay",
        action="store_true",
        help="also replay the stop rule on the fixed run's samples over a grid of targets",
    )
    args = parser.parse_args()
    workload = WORKLOADS[args.workload]
    max_queries = args.max_queries or (200 if args.workload == "demo" else None)
    names = list(workload.variants)
    seconds = {
        name: run_variant(args.home, workload, name, max_queries, args.dtype, args.caches_from)
        for name in names
    }
    fixed_config = ExperimentConfig.model_validate(workload.config(0, False, max_queries))
    settings = [setting.key for setting in fixed_config.settings()]
    stores = {name: ArtifactStore(home=str(args.home / name)) for name in names}
    tables = {name: credit_table(store, workload, settings) for name, store in stores.items()}
    rows = {name: sample_rows(store, workload, settings) for name, store in stores.items()}
    rng = np.random.default_rng(0)
    cis = fixed_cis(tables["fixed"], rng)
    se_cis = standard_error_cis(tables["fixed"])
    keys = sorted(cis)
    drawn = {name: samples_drawn(rows[name]) for name in names}
    fraction = {name: rows[name].height / rows["fixed"].height for name in names}
    others = [name for name in names if name != "fixed"]
    same_seed = [
        name for name in others if workload.variants[name] == (workload.variants["fixed"][0], True)
    ]
    result = {
        "command": f"python bench/adaptive_sampling.py --workload {args.workload} --home DIR"
        + (" --caches-from HOME" if args.caches_from else "")
        + (f" --dtype {args.dtype}" if args.dtype else ""),
        "config": f"examples/{workload.example}"
        + (", BM25, k = 5" if workload.validity else "")
        + f", {max_queries or 'all its'} queries, settings {settings}, N = {fixed_config.sampling.n}"
        + (f", generators in {args.dtype}" if args.dtype else ""),
        "adaptive_defaults": ExperimentConfig.model_validate(
            workload.config(0, True, max_queries)
        ).sampling.adaptive.key,
        "setting_queries": len(cis),
        "ci": f"percentile bootstrap 95 % over the N samples of each condition, {RESAMPLES} resamples",
        "resolution": RESOLUTION,
        "run_seconds": seconds,
        "samples_drawn": drawn,
        "sample_fraction": fraction,
        "groups_by_samples_drawn": {name: samples_per_group(rows[name]) for name in names},
        "sample_fraction_by_condition": {
            name: {c: drawn[name].get(c, 0) / drawn["fixed"][c] for c in drawn["fixed"]}
            for name in names
        },
        "inside_fixed_ci": {name: share_inside(cis, tables[name]) for name in others},
        "inside_fixed_ci_at_resolution": {
            name: share_inside(cis, tables[name], RESOLUTION) for name in others
        },
        "inside_fixed_ci_as_prefix": {
            name: share_inside(cis, as_prefix(tables[name], tables["fixed"])) for name in same_seed
        },
        "fixed_ci_narrower_than_0.001": float(
            np.mean([high - low < 0.001 for low, high in cis.values()])
        ),
        "inside_fixed_se_ci": {name: share_inside(se_cis, tables[name]) for name in others},
        "mean_delta_seper_s": {name: mean_with_ci(tables[name], keys) for name in names},
        "same_index_as_fixed": {
            name: same_index_differs(rows[name], rows["fixed"]) for name in same_seed
        },
        "paired_shift": {
            f"{a}-{b}": paired_shift(tables, a, b, keys) for a, b in PAIRS if {a, b} <= set(names)
        },
    }
    if args.replay:
        result["replay"] = [
            replay(tables["fixed"], cis, se_cis, fixed_config.sampling.n, rule)
            for rule in replay_rules()
        ]
    if workload.validity:
        partition = f"{workload.generator}|{settings[0]}"
        result["validity_r"] = {
            name: validity_r(store, partition, rng) for name, store in stores.items()
        }
    suffix = ("" if args.workload == "demo" else f"_{args.workload}") + (
        f"_{args.dtype}" if args.dtype else ""
    )
    results = ROOT / "bench" / "results" / f"adaptive_sampling{suffix}.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{'run':16} {'samples':>8} {'fraction':>9} {'in boot CI':>11} {'at 0.001':>9} {'in SE CI':>9} "
        f"{'mean ΔSePer_S [95% CI]':>27}"
        + (f" {'validity r [95% CI]':>26}" if workload.validity else "")
    )
    for name in names:
        m = result["mean_delta_seper_s"][name]
        shares = [
            result[k].get(name)
            for k in ("inside_fixed_ci", "inside_fixed_ci_at_resolution", "inside_fixed_se_ci")
        ]
        line = (
            f"{name:16} {rows[name].height:8d} {fraction[name]:9.3f} "
            + " ".join(
                f"{'—' if v is None else f'{v:.3f}':>{w}}" for v, w in zip(shares, (11, 9, 9))
            )
            + f" {m['mean']:8.4f} [{m['ci_low']:.4f}, {m['ci_high']:.4f}]"
        )
        if workload.validity:
            v = result["validity_r"][name]
            line += f" {v['r']:8.3f} [{v['ci_low']:.3f}, {v['ci_high']:.3f}]"
        print(line)
    for name in others:
        print(f"groups by samples drawn, {name}: {result['groups_by_samples_drawn'][name]}")
    for pair, shift in result["paired_shift"].items():
        print(
            f"paired ΔSePer_S shift {pair}: {shift['mean']:.4f} [{shift['ci_low']:.4f}, {shift['ci_high']:.4f}]"
        )
    for name, noise in result["same_index_as_fixed"].items():
        print(
            f"{name} against fixed, same seed and index: {noise['text_differs']:.4f} of {noise['samples']} texts differ, "
            f"log-prob sums of identical texts by up to {noise['max_logprob_sum_difference']:.4f}; inside the "
            f"fixed-N CI had its samples been the fixed run's first N_q: {result['inside_fixed_ci_as_prefix'][name]:.3f}"
        )
    for row in result.get("replay", []):
        print(replay_line(row))
    print(
        f"fixed-N bootstrap CIs narrower than 0.001: {result['fixed_ci_narrower_than_0.001']:.3f}"
    )
    print(f"wrote {results}")


if __name__ == "__main__":
    main()
