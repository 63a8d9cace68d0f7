"""Answer equivalence on real text: the answer NLI, the synthetic world's NLI and a lexical baseline.

Pair sets (the NLI sees SePer's ``"{q}? {answer}"`` form for both sides, as clustering does):

* ``squad`` — real answers from SQuAD v1.1 dev (``/work/shared/data/squad/beir``, read in place):
  a question's distinct annotator answers, pairwise = equivalent; the first answer of another
  question about the same paragraph = not equivalent (left out when it is the same string as one
  of the question's own answers after SQuAD normalisation). Both capped at ``--max-pairs``,
  sampled with a fixed seed.
* ``smollm2`` — SmolLM2-135M-Instruct's sampled answers against gold: a few dozen SQuAD
  questions (one per paragraph, fixed seed), the gold paragraph as context, ``n`` samples each
  with ``examples/squad.yaml``'s prompt, chat template and sampling (temperature, new-token limit,
  stop strings) through the project's own generator (``--smollm2-backend``, ``hf`` by default),
  distinct answers per question after SQuAD normalisation. Pair = (first
  gold answer, sample), both prefixed with the question. Equivalent = ``has_answer`` (a gold
  answer's tokens occur in the sample); not equivalent = token F1 0 against every gold answer;
  anything between (shared words without a whole gold answer, or the gold number in the other
  spelling: "2" for "two") is ambiguous and left out, as are
  empty samples. The generations are saved to ``bench/results/smollm2_squad_generations.jsonl``
  and reused while the settings match (``--regenerate`` to sample again).
* ``world`` — answer pairs of the synthetic world (``nli_pairs`` of the default world, seed 0):
  equivalent = aliases of one value.
* ``templates`` — fresh pairs of the answer-pair generator (a seed training never used).

Scores: P(entailment) both ways, their **mean** is the ranking score for ROC AUC (``auc``;
``auc_min`` ranks by the smaller of the two); accuracy is the clustering's decision from the
argmax labels both ways, ``strict`` (entailment both ways) and ``loose`` (no contradiction either
way, not neutral both ways) — ``metrics.seper.equivalent``. The **false-positive rate** is the
share of not-equivalent pairs judged equivalent by the loose rule (SePer_H's kernel:
``fp_rate_loose``), and the mean soft-kernel credit max(P_ent both ways) they get (SePer_S's:
``fp_credit_soft``). The baseline is SQuAD normalised
exact match and token F1 ≥ 0.5 between the bare answers (AUC of F1 as the score).

The ``squad`` and ``smollm2`` sets are also scored on each half of SQuAD's articles
(``ragutil_dagster.data.splits``: ``halves`` in the JSON, ``squad dev`` / ``squad test`` rows):
rules are chosen on ``dev``, figures reported on ``test``. With ``--answer-check`` each check is
scored twice: behind it (refused pairs neutral, as ``ContentCheckedJudge`` makes them; ``refused``
counts the equivalent pairs it refuses) and as ``…:passed-only``, the model alone on the pairs the
check passes — on ``smollm2`` a not-equivalent pair (token F1 0: no word shared) passes only
through a country, a demonym or a number in another spelling, so the figures behind the check
there say next to nothing about the model. ``--baseline-check COMMIT`` adds the
check as it was at COMMIT (``bench/answer_check.py``).

    python bench/nli_real.py                            # trains both NLI models in a temp dir
    python bench/nli_real.py --answer-nli DIR --world-nli DIR
    python bench/nli_real.py --answer-nli DIR --sets squad,smollm2 --pairs-out bench/results/pairs.jsonl

Prints a table and writes ``bench/results/nli_real.json`` (with the training wall times of the
models it trained).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import random
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

from ragutil_dagster.data.splits import HALVES, article_half
from ragutil_dagster.embedded.answer_pairs import ENTAILMENT, answer_pairs
from ragutil_dagster.embedded.world import make_world
from ragutil_dagster.metrics.answers import (
    exact_match,
    f1,
    has_answer,
    normalize_answer,
    numerals,
    shares_answer_content,
)
from ragutil_dagster.metrics.seper import ENTAILMENT as ENTAILMENT_INDEX
from ragutil_dagster.metrics.seper import equivalent, nli_text
from ragutil_dagster.models.entailment import NEUTRAL, Entailment

RESULTS = Path(__file__).resolve().parent / "results"
SQUAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad"
HELD_OUT_SEED = "answer-pairs-held-out"
GENERATIONS = RESULTS / "smollm2_squad_generations.jsonl"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "squad.yaml"


@dataclass(frozen=True)
class Pair:
    question: str | None  # None: the bare answers (the world's pairs carry their prefix already)
    first: str
    second: str
    equivalent: bool
    half: str | None = None  # SQuAD pairs: "dev" or "test", the half of the articles (data.splits)


def _jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def squad_pairs(root: Path, max_pairs: int, seed: int = 0) -> list[Pair]:
    """Annotator-answer pairs (equivalent) and other-question pairs of one paragraph (not)."""
    queries = {q["id"]: q for q in _jsonl(root / "beir" / "queries.jsonl")}
    paragraph_questions: dict[str, list[str]] = defaultdict(list)
    for query_id, doc_id in _qrels(root).items():
        paragraph_questions[doc_id].append(query_id)
    positives, negatives = [], []
    for doc_id, ids in paragraph_questions.items():
        half = article_half(doc_id)
        for qid in ids:
            q = queries[qid]
            answers = q["answers"]
            positives += [
                Pair(q["text"], a, b, True, half)
                for i, a in enumerate(answers)
                for b in answers[i + 1 :]
            ]
            own = {normalize_answer(a) for a in answers}
            negatives += [
                Pair(q["text"], answers[0], queries[other]["answers"][0], False, half)
                for other in ids
                if other != qid and normalize_answer(queries[other]["answers"][0]) not in own
            ]
    rng = random.Random(seed)
    return rng.sample(positives, min(max_pairs, len(positives))) + rng.sample(
        negatives, min(max_pairs, len(negatives))
    )


def _qrels(root: Path) -> dict[str, str]:
    """query id → the id of the paragraph it was written about (SQuAD: one each)."""
    paragraph: dict[str, str] = {}
    with (root / "beir" / "qrels" / "test.tsv").open(encoding="utf-8") as f:
        next(f)
        for line in f:
            query_id, doc_id, _ = line.rstrip("\n").split("\t")
            paragraph[query_id] = doc_id
    return paragraph


def _squad_questions(root: Path, n_questions: int, seed: int) -> list[tuple[dict, str]]:
    """``n_questions`` (query, gold paragraph text), one question per paragraph, drawn with ``seed``."""
    queries = {q["id"]: q for q in _jsonl(root / "beir" / "queries.jsonl")}
    paragraphs = {d["id"]: d["text"] for d in _jsonl(root / "beir" / "corpus.jsonl")}
    by_paragraph: dict[str, list[str]] = defaultdict(list)
    with (root / "beir" / "qrels" / "test.tsv").open(encoding="utf-8") as f:
        next(f)
        for line in f:
            query_id, doc_id, _ = line.rstrip("\n").split("\t")
            by_paragraph[doc_id].append(query_id)
    rng = random.Random(f"smollm2-pairs:{seed}")
    chosen = rng.sample(sorted(by_paragraph), min(n_questions, len(by_paragraph)))
    return [(queries[rng.choice(sorted(by_paragraph[doc]))], paragraphs[doc]) for doc in chosen]


def smollm2_generations(
    root: Path,
    n_questions: int,
    samples: int,
    backend: str,
    regenerate: bool = False,
    path: Path = GENERATIONS,
) -> list[dict]:
    """SmolLM2's sampled answers to ``n_questions`` SQuAD questions given the gold paragraph: one
    row per question (``id``, ``question``, ``answers``, ``samples``). Read from ``path`` when it
    was written with the same settings, else sampled and written there."""
    from ragutil_dagster.config import load_config
    from ragutil_dagster.prompts import with_context

    example = load_config(EXAMPLE)
    smollm2 = example.generator("smollm2")
    params = dataclasses.replace(example.sampling.params(seed=0), n=samples)
    settings = {
        "model": smollm2.model,
        "backend": backend,
        "use_chat_template": smollm2.use_chat_template,
        "prompt": example.prompts.with_context.label,
        "questions": n_questions,
        "sampling": {
            "n": params.n,
            "temperature": params.temperature,
            "max_new_tokens": params.max_new_tokens,
            "stop": list(params.stop),
            "seed": params.seed,
        },
    }
    if path.is_file() and not regenerate:
        rows = _jsonl(path)
        # The header adds what sampling measured (seconds, the model's identity) to the settings.
        if rows and {key: rows[0].get("settings", {}).get(key) for key in settings} == settings:
            return rows[1:]
    from ragutil_dagster.config import GeneratorConfig
    from ragutil_dagster.resources import ModelLoader

    questions = _squad_questions(root, n_questions, seed=0)
    prompts = [
        with_context(q["text"], [("", paragraph)], example.prompts.with_context)
        for q, paragraph in questions
    ]
    generator = ModelLoader().generator(
        GeneratorConfig(
            name=smollm2.name,
            model=smollm2.model,
            backend=backend,
            use_chat_template=smollm2.use_chat_template,
        )
    )
    start = time.perf_counter()
    sampled = generator.sample(prompts, params)
    settings["seconds"] = round(time.perf_counter() - start, 1)
    settings["identity"] = generator.identity
    rows = [
        {
            "id": q["id"],
            "question": q["text"],
            "answers": q["answers"],
            "samples": [s.text for s in got],
            "at_token_limit": sum(s.finish_reason == "length" for s in got),
        }
        for (q, _), got in zip(questions, sampled, strict=True)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in [{"settings": settings}, *rows]:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return rows


def smollm2_pairs(rows: list[dict], root: Path = SQUAD) -> tuple[list[Pair], dict[str, int]]:
    """(gold, sample) pairs with unambiguous labels, and counts: samples, those cut at the token
    limit, and how many were dropped why."""
    paragraph = _qrels(root)
    pairs, dropped = (
        [],
        {
            "empty": 0,
            "ambiguous": 0,
            "duplicate": 0,
            "samples": sum(len(row["samples"]) for row in rows),
            "at_token_limit": sum(row.get("at_token_limit", 0) for row in rows),
        },
    )
    for row in rows:
        golds, seen = row["answers"], set()
        for text in row["samples"]:
            answer = text.strip()
            key = normalize_answer(answer)
            if not key:
                dropped["empty"] += 1
                continue
            if key in seen:
                dropped["duplicate"] += 1
                continue
            seen.add(key)
            half = article_half(paragraph[row["id"]])
            if has_answer(answer, golds):
                pairs.append(Pair(row["question"], golds[0], answer, True, half))
            elif has_answer(numerals(answer), [numerals(gold) for gold in golds]):
                dropped["ambiguous"] += 1  # "2" for "two": the lexical labels cannot tell
            elif f1(answer, golds) == 0.0:
                pairs.append(Pair(row["question"], golds[0], answer, False, half))
            else:
                dropped["ambiguous"] += 1
    return pairs, dropped


def world_pairs(n: int) -> list[Pair]:
    from ragutil_dagster.embedded.train_loop import NLI_LABELS
    from ragutil_dagster.embedded.training import nli_pairs

    world = make_world(0, "default")
    entail = NLI_LABELS.index(ENTAILMENT)
    return [
        Pair(None, a, b, label == entail)
        for a, b, label in nli_pairs(world, random.Random("nli-real-bench"), n)
    ]


def template_pairs(n: int) -> list[Pair]:
    return [
        Pair(p.question, p.first, p.second, p.label == ENTAILMENT)
        for p in answer_pairs(random.Random(HELD_OUT_SEED), n)
    ]


def _bare(text: str, question: str | None) -> str:
    """The answer without the world pairs' question prefix (for the lexical baseline)."""
    return text.split("? ", 1)[1] if question is None and "? " in text else text


def judge_probs(model_dir: Path, pairs: list[Pair]) -> tuple[np.ndarray, np.ndarray, float]:
    """The model's [contradiction, neutral, entailment] rows for ``pairs`` both ways, and seconds."""
    entail = Entailment(
        str(model_dir), device="cpu", batch_size=64, cache=False, show_progress=False
    )
    a = [nli_text(p.first, p.question) for p in pairs]
    b = [nli_text(p.second, p.question) for p in pairs]
    start = time.perf_counter()
    forward, backward = entail(a, b), entail(b, a)
    return forward, backward, time.perf_counter() - start


def refused_by(check, pairs: list[Pair]) -> np.ndarray:
    """Which pairs ``check`` (``shares_answer_content`` or a version of it) refuses."""
    return np.array(
        [not check(nli_text(p.first, p.question), nli_text(p.second, p.question)) for p in pairs],
        dtype=bool,
    )


def scores_from_probs(
    pairs: list[Pair], forward: np.ndarray, backward: np.ndarray, refused: np.ndarray | None = None
) -> dict[str, float]:
    """The scores of the judge's rows; with ``refused``, behind a content check: a refused pair
    is neutral both ways, as ``ContentCheckedJudge`` makes it without asking the judge (the same
    rows), and the equivalent pairs it refuses are counted."""
    truth = np.array([p.equivalent for p in pairs])
    if refused is not None:
        forward, backward = forward.copy(), backward.copy()
        forward[refused] = backward[refused] = NEUTRAL
    both = np.stack([forward[:, ENTAILMENT_INDEX], backward[:, ENTAILMENT_INDEX]])
    labels = list(zip(forward.argmax(1), backward.argmax(1)))
    strict = np.array([equivalent(x, y, True) for x, y in labels])
    loose = np.array([equivalent(x, y, False) for x, y in labels])
    scores = {
        "n": len(pairs),
        "equivalent": int(truth.sum()),
        "auc": float(roc_auc_score(truth, both.mean(0)))
        if 0 < truth.sum() < len(truth)
        else float("nan"),
        "auc_min": float(roc_auc_score(truth, both.min(0)))
        if 0 < truth.sum() < len(truth)
        else float("nan"),
        "accuracy_strict": float((strict == truth).mean()),
        "accuracy_loose": float((loose == truth).mean()),
        "fp_rate_loose": float(loose[~truth].mean()),
        "fp_credit_soft": float(both.max(0)[~truth].mean()),
    }
    if refused is not None:
        scores["equivalent_refused_by_check"] = int((refused & truth).sum())
        scores["equivalent_refused_share"] = float((refused & truth).sum() / max(1, truth.sum()))
        scores["not_equivalent_passed_by_check"] = int((~refused & ~truth).sum())
    return scores


def nli_scores(
    model_dir: Path, pairs: list[Pair], per_pair: list | None = None, answer_check: bool = False
) -> dict[str, float]:
    """The model's scores on ``pairs``; with ``answer_check``, behind ragutil's content check
    (``nli: {answer_check: content}``), also counting the equivalent pairs the check refuses."""
    forward, backward, seconds = judge_probs(model_dir, pairs)
    if per_pair is not None:
        per_pair += [
            float(x) for x in (forward[:, ENTAILMENT_INDEX] + backward[:, ENTAILMENT_INDEX]) / 2
        ]
    refused = refused_by(shares_answer_content, pairs) if answer_check else None
    return {**scores_from_probs(pairs, forward, backward, refused), "seconds": seconds}


def baseline_scores(pairs: list[Pair]) -> dict[str, float]:
    truth = np.array([p.equivalent for p in pairs])
    bare = [(_bare(p.first, p.question), _bare(p.second, p.question)) for p in pairs]
    em = np.array([exact_match(x, y) for x, y in bare]) == 1.0
    token_f1 = np.array([f1(x, y) for x, y in bare])
    return {
        "auc": float(roc_auc_score(truth, token_f1)),
        "accuracy_em": float((em == truth).mean()),
        "accuracy_f1_05": float(((token_f1 >= 0.5) == truth).mean()),
    }


def _trained(given: Path | None, name: str, out: Path, seconds: dict[str, float]) -> Path:
    """``given``, else ``name`` ("answer_nli" / "world_nli") trained at default size, seed 0, into
    ``out`` (its wall time into ``seconds``)."""
    if given is not None:
        return given
    from ragutil_dagster.embedded.answer_nli import train_answer_nli
    from ragutil_dagster.embedded.training import train_world_nli

    start = time.perf_counter()
    trained = (
        train_answer_nli(out / "nli")
        if name == "answer_nli"
        else train_world_nli(out / "world-nli", size="default")
    )
    seconds[name] = time.perf_counter() - start
    return trained


def format_table(results: dict) -> str:
    header = (
        f"{'pair set':<16} {'model':<38} {'n':>5} {'AUC':>6} {'AUC(min)':>8} {'acc strict':>10} "
        f"{'acc loose':>9} {'FP loose':>8} {'FP soft':>7} {'refused':>9} {'acc EM':>7} {'acc F1≥.5':>9}"
    )
    lines = [header, "-" * len(header)]
    for name, entry in results["pair_sets"].items():
        parts = [(name, entry)] + [
            (f"{name} {half}", e) for half, e in entry.get("halves", {}).items()
        ]
        for label, part in parts:
            for model, r in part["models"].items():
                cells = [
                    f"{r.get(k, float('nan')):.3f}"
                    for k in (
                        "auc",
                        "auc_min",
                        "accuracy_strict",
                        "accuracy_loose",
                        "fp_rate_loose",
                        "fp_credit_soft",
                        "accuracy_em",
                        "accuracy_f1_05",
                    )
                ]
                cells = [c if c != "nan" else "—" for c in cells]
                refused = (
                    f"{r['equivalent_refused_by_check']}/{r['equivalent']}"
                    if "equivalent_refused_by_check" in r
                    else "—"
                )
                lines.append(
                    f"{label:<16} {model:<38} {r.get('n', part['n']):>5} {cells[0]:>6} {cells[1]:>8} "
                    f"{cells[2]:>10} {cells[3]:>9} {cells[4]:>8} {cells[5]:>7} {refused:>9} "
                    f"{cells[6]:>7} {cells[7]:>9}"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--answer-nli", type=Path, help="answer NLI directory (default: train one)")
    parser.add_argument("--world-nli", type=Path, help="world NLI directory (default: train one)")
    parser.add_argument("--squad", type=Path, default=SQUAD)
    parser.add_argument("--max-pairs", type=int, default=1000, help="per class, SQuAD pairs")
    parser.add_argument("--synthetic-pairs", type=int, default=1000)
    parser.add_argument(
        "--sets", default="squad,smollm2,world,templates", help="comma-separated pair sets to score"
    )
    parser.add_argument("--smollm2-questions", type=int, default=60)
    parser.add_argument("--smollm2-samples", type=int, default=10, help="samples per question")
    parser.add_argument("--smollm2-backend", default="hf", choices=("hf", "vllm"))
    parser.add_argument("--regenerate", action="store_true", help="sample SmolLM2 again")
    parser.add_argument("--no-world-nli", action="store_true", help="score the answer NLI only")
    parser.add_argument(
        "--answer-check",
        action="store_true",
        help="also score the answer NLI behind ragutil's content check "
        "(nli: {answer_check: content}) as 'answer-nli+check'",
    )
    parser.add_argument(
        "--baseline-check",
        metavar="COMMIT",
        help="with --answer-check, also score the answer NLI behind the content check as it "
        "was at COMMIT (read with git show), as 'answer-nli+check@COMMIT'",
    )
    parser.add_argument(
        "--pairs-out", type=Path, help="write every pair with its answer-NLI score here (JSONL)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "nli_real.json")
    args = parser.parse_args()
    wanted = args.sets.split(",")
    with tempfile.TemporaryDirectory() as scratch:
        trained: dict[str, float] = {}
        answer_dir = _trained(args.answer_nli, "answer_nli", Path(scratch), trained)
        world_dir = (
            None
            if args.no_world_nli
            else _trained(args.world_nli, "world_nli", Path(scratch), trained)
        )
        makers = {
            "squad": lambda: squad_pairs(args.squad, args.max_pairs),
            "smollm2": lambda: smollm2_pairs(
                smollm2_generations(
                    args.squad,
                    args.smollm2_questions,
                    args.smollm2_samples,
                    args.smollm2_backend,
                    args.regenerate,
                ),
                args.squad,
            ),
            "world": lambda: world_pairs(args.synthetic_pairs),
            "templates": lambda: template_pairs(args.synthetic_pairs),
        }
        unknown = set(wanted) - set(makers)
        if unknown:
            parser.error(f"unknown pair sets {sorted(unknown)}; choose from {sorted(makers)}")
        results: dict = {
            "date": datetime.date.today().isoformat(),
            "machine": platform.processor() or platform.machine(),
            "command": " ".join(["python", *sys.argv]),
            "score": "mean of P(entailment) both ways",
            "training_seconds": trained,
            "pair_sets": {},
        }
        dump = []
        checks = {"answer-nli+check": shares_answer_content}
        if args.baseline_check:
            from answer_check import shares_at  # bench/answer_check.py, beside this file

            checks[f"answer-nli+check@{args.baseline_check[:7]}"] = shares_at(args.baseline_check)
        for name in wanted:
            made = makers[name]()
            pairs, dropped = made if isinstance(made, tuple) else (made, None)
            forward, backward, seconds = judge_probs(answer_dir, pairs)
            refused = (
                {label: refused_by(check, pairs) for label, check in checks.items()}
                if args.answer_check
                else {}
            )
            world = judge_probs(world_dir, pairs)[:2] if world_dir is not None else None

            def models_on(rows: np.ndarray) -> dict[str, dict]:
                chosen = [pairs[i] for i in rows]
                models = {"answer-nli": scores_from_probs(chosen, forward[rows], backward[rows])}
                for label, refusals in refused.items():
                    models[label] = scores_from_probs(
                        chosen, forward[rows], backward[rows], refusals[rows]
                    )
                    # The model alone on the pairs the check passes: what it decides behind the check.
                    passed = rows[~refusals[rows]]
                    models[f"{label}:passed-only"] = scores_from_probs(
                        [pairs[i] for i in passed], forward[passed], backward[passed]
                    )
                if world is not None:
                    models["world-nli"] = scores_from_probs(chosen, world[0][rows], world[1][rows])
                models["lexical"] = baseline_scores(chosen)
                return models

            everything = np.arange(len(pairs))
            entry = {
                "n": len(pairs),
                "equivalent": sum(p.equivalent for p in pairs),
                "answer_nli_seconds": seconds,
                "models": models_on(everything),
            }
            halves = {
                half: np.array([i for i, p in enumerate(pairs) if p.half == half], dtype=int)
                for half in HALVES
            }
            if all(rows.size for rows in halves.values()):
                entry["halves"] = {
                    half: {
                        "n": int(rows.size),
                        "equivalent": int(sum(pairs[i].equivalent for i in rows)),
                        "models": models_on(rows),
                    }
                    for half, rows in halves.items()
                }
            if dropped is not None:
                entry["dropped"] = dropped
            results["pair_sets"][name] = entry
            # Written after each pair set: a long one (smollm2 samples first) never loses the others.
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2), encoding="utf-8")
            dump += [
                {
                    "set": name,
                    **asdict(p),
                    "score": float((f[ENTAILMENT_INDEX] + b[ENTAILMENT_INDEX]) / 2),
                    "forward": [round(float(x), 6) for x in f],
                    "backward": [round(float(x), 6) for x in b],
                    **{f"refused:{label}": bool(r[i]) for label, r in refused.items()},
                }
                for i, (p, f, b) in enumerate(zip(pairs, forward, backward, strict=True))
            ]
    print(format_table(results))
    if trained:
        print("training wall seconds: " + json.dumps({k: round(v, 1) for k, v in trained.items()}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(f"wrote {args.out}")
    if args.pairs_out is not None:
        args.pairs_out.parent.mkdir(parents=True, exist_ok=True)
        with args.pairs_out.open("w", encoding="utf-8") as f:
            for row in dump:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"wrote {args.pairs_out}")


if __name__ == "__main__":
    main()
