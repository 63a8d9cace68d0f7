"""Does ΔSePer_S tell a question's gold paragraph from an unrelated one? Per-context ΔSePer_S of
``ragutil score`` output on SQuAD records whose ``contexts`` are [the gold paragraph, a paragraph of
another article] (``/work/shared/data/squad/beir/records_200.jsonl``): the mean for each, and the
ROC AUC of ΔSePer_S separating gold (positive) from unrelated (negative) contexts; and whether the
judge inflates SePer: mean SePer_S closed book beside the closed-book accuracy the lexical judge
gives (``has_answer`` of the greedy closed-book answer against the gold answers).

    ragutil score /work/shared/data/squad/beir/records_200.jsonl --config examples/squad.yaml \\
        --generator smollm2 --out scored.jsonl
    python bench/squad_records.py scored.jsonl /work/shared/data/squad/beir/records_200.jsonl

Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score


def context_scores(scored: Path, records: Path) -> tuple[np.ndarray, np.ndarray]:
    """(ΔSePer_S of the gold contexts, of the unrelated ones): the first and second context of
    each record, matched by record id and context id."""
    contexts = {}
    for line in records.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        contexts[record["id"]] = [c["id"] for c in record["contexts"]]
    gold, unrelated = [], []
    for line in scored.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        by_id = {c["id"]: c["delta_seper_s"] for c in row["per_context"]}
        first, second = contexts[row["id"]]
        gold.append(by_id[first])
        unrelated.append(by_id[second])
    return np.array(gold, dtype=float), np.array(unrelated, dtype=float)


def closed_book(scored: Path, records: Path) -> tuple[float, float]:
    """(mean SePer_S closed book, share of greedy closed-book answers holding a gold answer)."""
    from ragutil_dagster.metrics.answers import has_answer

    golds = {}
    for line in records.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        golds[record["id"]] = record["answers"]
    seper, lexical = [], []
    for line in scored.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        seper.append(row["seper_s_without_context"])
        lexical.append(has_answer(row["answer_without_context"], golds[row["id"]]))
    return float(np.mean(seper)), float(np.mean(lexical))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scored", type=Path, help="ragutil score output (JSONL)")
    parser.add_argument("records", type=Path, help="the records it scored (JSONL)")
    args = parser.parse_args()
    gold, unrelated = context_scores(args.scored, args.records)
    labels = np.r_[np.ones(gold.size), np.zeros(unrelated.size)]
    auc = roc_auc_score(labels, np.r_[gold, unrelated])
    seper_closed, lexical_closed = closed_book(args.scored, args.records)
    print("| records | mean ΔSePer_S, gold paragraph | mean ΔSePer_S, unrelated paragraph | difference "
          "| ROC AUC gold vs unrelated | SePer_S closed book | lexical accuracy closed book |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {gold.size} | {gold.mean():.3f} | {unrelated.mean():.3f} | {gold.mean() - unrelated.mean():.3f} "
          f"| {auc:.3f} | {seper_closed:.3f} | {lexical_closed:.3f} |")


if __name__ == "__main__":
    main()
