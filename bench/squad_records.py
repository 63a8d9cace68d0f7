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
records of one half of the articles (:func:`split_of`): templates and rules are tuned on ``dev``
and reported on ``test``.
"""

from __future__ import annotations

import argparse
import json
import zlib
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score


def split_of(record: dict) -> str:
    """``dev`` or ``test``: the half of the articles a record's gold paragraph (its first
    context, id ``<article slug>_<paragraph>``) belongs to, by the CRC-32 of the article slug."""
    article = record["contexts"][0]["id"].rsplit("_", 1)[0]
    return "dev" if zlib.crc32(article.encode()) % 2 == 0 else "test"


def selected_records(records: Path, split: str) -> Path:
    """``records`` itself for ``all``; else a temporary copy holding the records of ``split``."""
    if split == "all":
        return records
    import tempfile

    lines = [line for line in records.read_text(encoding="utf-8").splitlines() if split_of(json.loads(line)) == split]
    handle = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8")
    handle.write("\n".join(lines) + "\n")
    handle.close()
    return Path(handle.name)


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
        if row["id"] not in contexts:
            continue
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
        if row["id"] not in golds:
            continue
        seper.append(row["seper_s_without_context"])
        lexical.append(has_answer(row["answer_without_context"], golds[row["id"]]))
    return float(np.mean(seper)), float(np.mean(lexical))


def reading(scored: Path, records: Path) -> dict[str, float]:
    """The share of judged answers holding a gold answer (``has_answer``): closed book, with the
    gold paragraph alone, the unrelated one alone, and both together (the rag prompt)."""
    from ragutil_dagster.metrics.answers import has_answer

    golds, contexts = {}, {}
    for line in records.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        golds[record["id"]] = record["answers"]
        contexts[record["id"]] = [c["id"] for c in record["contexts"]]
    hits: dict[str, list[bool]] = {"closed": [], "gold": [], "unrelated": [], "both": []}
    for line in scored.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["id"] not in golds:
            continue
        by_id = {c["id"]: c["has_answer"] for c in row["per_context"]}
        first, second = contexts[row["id"]]
        hits["closed"].append(has_answer(row["answer_without_context"], golds[row["id"]]))
        hits["gold"].append(by_id[first])
        hits["unrelated"].append(by_id[second])
        hits["both"].append(has_answer(row["answer_with_context"], golds[row["id"]]))
    return {name: float(np.mean(values)) for name, values in hits.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scored", type=Path, help="ragutil score output (JSONL)")
    parser.add_argument("records", type=Path, help="the records it scored (JSONL)")
    parser.add_argument("--label", default="", help="what was scored (the generator and its prompts), for the JSON")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--split", choices=("all", "dev", "test"), default="all",
                        help="the records of one half of the articles (dev: tuning; test: reporting)")
    args = parser.parse_args()
    args.records = selected_records(args.records, args.split)
    gold, unrelated = context_scores(args.scored, args.records)
    labels = np.r_[np.ones(gold.size), np.zeros(unrelated.size)]
    auc = roc_auc_score(labels, np.r_[gold, unrelated])
    seper_closed, lexical_closed = closed_book(args.scored, args.records)
    print("| records | mean ΔSePer_S, gold paragraph | mean ΔSePer_S, unrelated paragraph | difference "
          "| ROC AUC gold vs unrelated | SePer_S closed book | lexical accuracy closed book |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {gold.size} | {gold.mean():.3f} | {unrelated.mean():.3f} | {gold.mean() - unrelated.mean():.3f} "
          f"| {auc:.3f} | {seper_closed:.3f} | {lexical_closed:.3f} |")
    read = reading(args.scored, args.records)
    print()
    print("| has_answer closed book | gold paragraph alone | unrelated paragraph alone | gold + unrelated (rag) |")
    print("|---|---|---|---|")
    print(f"| {read['closed']:.3f} | {read['gold']:.3f} | {read['unrelated']:.3f} | {read['both']:.3f} |")
    if args.json:
        figures = {
            "label": args.label, "scored": str(args.scored), "split": args.split, "n": int(gold.size),
            "delta_seper_s_gold": float(gold.mean()), "delta_seper_s_unrelated": float(unrelated.mean()),
            "difference": float(gold.mean() - unrelated.mean()), "auc": float(auc),
            "seper_s_closed": seper_closed, "lexical_accuracy_closed": lexical_closed,
            "has_answer": read,
        }
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
