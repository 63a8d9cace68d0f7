"""Does ΔSePer_S tell a question's gold paragraph from an unrelated one? Per-context ΔSePer_S of
``ragutil score`` output on SQuAD records whose ``contexts`` are [the gold paragraph, a paragraph of
another article] (``/work/shared/data/squad/beir/records_200.jsonl``): the mean for each, and the
ROC AUC of ΔSePer_S separating gold (positive) from unrelated (negative) contexts; and whether the
judge inflates SePer: mean SePer_S closed book beside the closed-book accuracy the lexical judge
gives (``has_answer`` of the greedy closed-book answer against the gold answers); and how often the
generator reads: the share of judged (greedy) answers holding a gold answer closed book, with the
gold paragraph alone, with the unrelated one alone, and with both in one rag prompt.

    ragutil score /work/shared/data/squad/beir/records_200.jsonl --config examples/squad.yaml \\
        --generator smollm2 --out scored.jsonl
    python bench/squad_records.py scored.jsonl /work/shared/data/squad/beir/records_200.jsonl \\
        --label smollm2 --json bench/results/squad_records_smollm2.json

Prints a Markdown table; ``--json`` also writes the figures. ``--split dev`` / ``test`` keeps the
records of one half of the articles (:func:`split_of`, ``ragutil_dagster.data.splits``):
templates and rules are tuned on ``dev`` and reported on ``test``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

from ragutil_dagster.data.splits import article_half


def split_of(record: dict) -> str:
    """``dev`` or ``test``: the half of the articles a record's gold paragraph (its first
    context, id ``<article slug>_<paragraph>``) belongs to (``data.splits.article_half``)."""
    return article_half(record["contexts"][0]["id"])


def paired_rows(scored: Path, records: Path) -> list[tuple[dict, dict]]:
    """(scored row, record) of every record of ``records``, matched by id (a scored row of a record
    left out, e.g. by ``--split``, is skipped)."""
    by_id = {
        record["id"]: record
        for record in map(json.loads, records.read_text(encoding="utf-8").splitlines())
    }
    rows = map(json.loads, scored.read_text(encoding="utf-8").splitlines())
    return [(row, by_id[row["id"]]) for row in rows if row["id"] in by_id]


def per_context(row: dict, record: dict, field: str) -> tuple[object, object]:
    """``field`` of the record's gold (first) and unrelated (second) context, by context id."""
    by_id = {c["id"]: c[field] for c in row["per_context"]}
    first, second = (c["id"] for c in record["contexts"])
    return by_id[first], by_id[second]


def context_scores(pairs: list[tuple[dict, dict]]) -> tuple[np.ndarray, np.ndarray]:
    """(ΔSePer_S of the gold contexts, of the unrelated ones)."""
    gold, unrelated = zip(*(per_context(row, record, "delta_seper_s") for row, record in pairs))
    return np.array(gold, dtype=float), np.array(unrelated, dtype=float)


def closed_book(pairs: list[tuple[dict, dict]]) -> tuple[float, float]:
    """(mean SePer_S closed book, share of greedy closed-book answers holding a gold answer)."""
    from ragutil_dagster.metrics.answers import has_answer

    seper = [row["seper_s_without_context"] for row, _ in pairs]
    lexical = [
        has_answer(row["answer_without_context"], record["answers"]) for row, record in pairs
    ]
    return float(np.mean(seper)), float(np.mean(lexical))


def reading(pairs: list[tuple[dict, dict]]) -> dict[str, float]:
    """The share of judged answers holding a gold answer (``has_answer``): closed book, with the
    gold paragraph alone, the unrelated one alone, and both together (the rag prompt); and the
    token F1 and EM of the rag answer, beside them (a long answer holds the gold span more often)."""
    from ragutil_dagster.metrics.answers import has_answer

    alone = [per_context(row, record, "has_answer") for row, record in pairs]
    return {
        "closed": float(
            np.mean([has_answer(row["answer_without_context"], r["answers"]) for row, r in pairs])
        ),
        "gold": float(np.mean([gold for gold, _ in alone])),
        "unrelated": float(np.mean([unrelated for _, unrelated in alone])),
        "both": float(
            np.mean([has_answer(row["answer_with_context"], r["answers"]) for row, r in pairs])
        ),
        "f1_both": float(np.mean([row["f1_with_context"] for row, _ in pairs])),
        "em_both": float(np.mean([row["em_with_context"] for row, _ in pairs])),
        "answer_words_both": float(
            np.mean([len(row["answer_with_context"].split()) for row, _ in pairs])
        ),
    }


def figures(pairs: list[tuple[dict, dict]]) -> dict:
    """Every figure of one set of records (see the module docstring)."""
    gold, unrelated = context_scores(pairs)
    labels = np.r_[np.ones(gold.size), np.zeros(unrelated.size)]
    seper_closed, lexical_closed = closed_book(pairs)
    return {
        "n": int(gold.size),
        "delta_seper_s_gold": float(gold.mean()),
        "delta_seper_s_unrelated": float(unrelated.mean()),
        "difference": float(gold.mean() - unrelated.mean()),
        "auc": float(roc_auc_score(labels, np.r_[gold, unrelated])),
        "seper_s_closed": seper_closed,
        "lexical_accuracy_closed": lexical_closed,
        "has_answer": reading(pairs),
        # Under sampling.adaptive, what the figures cost: samples drawn over N per prompt.
        **(
            {"sample_fraction": float(np.mean([row["sample_fraction"] for row, _ in pairs]))}
            if all("sample_fraction" in row for row, _ in pairs)
            else {}
        ),
    }


def print_tables(split: str, f: dict) -> None:
    read = f["has_answer"]
    print(f"\n{split}:\n")
    print(
        "| records | mean ΔSePer_S, gold paragraph | mean ΔSePer_S, unrelated paragraph | difference "
        "| ROC AUC gold vs unrelated | SePer_S closed book | lexical accuracy closed book |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {f['n']} | {f['delta_seper_s_gold']:.3f} | {f['delta_seper_s_unrelated']:.3f} "
        f"| {f['difference']:.3f} | {f['auc']:.3f} | {f['seper_s_closed']:.3f} "
        f"| {f['lexical_accuracy_closed']:.3f} |"
    )
    print()
    print(
        "| has_answer closed book | gold paragraph alone | unrelated paragraph alone | gold + unrelated (rag) "
        "| rag token F1 | rag EM | rag answer words |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {read['closed']:.3f} | {read['gold']:.3f} | {read['unrelated']:.3f} | {read['both']:.3f} "
        f"| {read['f1_both']:.3f} | {read['em_both']:.3f} | {read['answer_words_both']:.1f} |"
    )
    if "sample_fraction" in f:
        print(f"\nadaptive sampling drew {f['sample_fraction']:.3f} of N per prompt on average")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scored", type=Path, help="ragutil score output (JSONL)")
    parser.add_argument("records", type=Path, help="the records it scored (JSONL)")
    parser.add_argument(
        "--label", default="", help="what was scored (the generator and its prompts), for the JSON"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--split",
        choices=("all", "dev", "test", "each"),
        default="each",
        help="the records of one half of the articles (dev: tuning; test: reporting), all of "
        "them, or each of the three (the default)",
    )
    args = parser.parse_args()
    rows = paired_rows(args.scored, args.records)
    splits = ("test", "dev", "all") if args.split == "each" else (args.split,)
    by_split = {
        split: figures(
            [(row, record) for row, record in rows if split == "all" or split_of(record) == split]
        )
        for split in splits
    }
    for split, f in by_split.items():
        print_tables(split, f)
    if args.json:
        written = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "command": " ".join(["python", "bench/squad_records.py", *sys.argv[1:]]),
            "label": args.label,
            "scored": str(args.scored),
            "splits": by_split,
        }
        args.json.write_text(json.dumps(written, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
