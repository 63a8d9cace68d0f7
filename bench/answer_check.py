"""The content check's cost, rule by rule: which equivalent answer pairs it refuses, and why.

The check (``metrics.answers.shares_answer_content``, ``nli: {answer_check: content}``) refuses a
pair of answers that share no content before the NLI is asked. This bench compares the check as it
is with the check as it was at a given commit (``--baseline``, read with ``git show``, default
1170daf: the hand-rolled number words up to 99, the 5-letter prefix rule and the longer
function-word list) on

* the example pairs of issue 52 (correct answers the old check refused, and wrong values of the
  right type that pass to the NLI), both directions;
* ``bench/nli_real.py``'s SQuAD annotator pairs (1,000 pairs of one question's distinct annotator
  answers = equivalent, 1,000 first answers of two questions about one paragraph = not), on the
  development half, the report half (``ragutil_dagster.data.splits``) and all: the equivalent
  pairs refused, by cause, and the not-equivalent pairs passed to the NLI (an upper bound of the
  false positives the check lets through; the NLI's own rate behind the check is
  ``bench/nli_real.py --answer-check``); and the equivalent pairs split by whether the two
  annotators' spans overlap in the paragraph (SQuAD's ``answer_start``): the same span cut
  differently, or two places of the paragraph — often two different answers (a list's other item,
  another candidate), which the pair set counts as equivalent.

Rule only (no model), seconds:

    python bench/answer_check.py --json bench/results/answer_check.json
    python bench/answer_check.py --show dev     # the refused dev-half pairs, to read (never the report half)
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nli_real import SQUAD, Pair, squad_pairs  # noqa: E402

from ragutil_dagster.data.splits import HALVES  # noqa: E402
from ragutil_dagster.metrics import answers  # noqa: E402
from ragutil_dagster.metrics.seper import nli_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "1170daf"

# (question, gold, other answer, equivalent): issue 52's pairs.
EXAMPLES: tuple[tuple[str, str, str, bool], ...] = (
    ("How many were there?", "200", "two hundred", True),
    ("How many people live there?", "1,500,000", "1.5 million", True),
    ("Where did the team finish?", "2nd", "second", True),
    ("Which country led the alliance?", "the US", "the United States", True),
    ("When did the war in Europe end?", "May", "May 1945", True),
    ("What nationality was the ship?", "British", "Britain", True),
    ("Which country did the settlers come from?", "France", "French", True),
    ("Where was the porcelain made?", "China", "Chinese", True),
    ("When was the record released?", "1990s", "1990", True),
    ("Who wrote the report?", "Richards", "Richardson", False),
    ("Who wrote the report?", "John Smith", "Mary Smith", False),
    ("Which team won?", "Denver Broncos", "Denver Nuggets", False),
    ("Which war was it?", "World War I", "World War II", False),
    ("How long is the trail?", "5 km", "5 miles", False),
)

# Why the baseline refused an equivalent pair the current check passes, by the current check's
# reason for passing it (and, for a shared word, whether the words are the same or inflections).
RECOVERED_BY = {
    "shared number": "number words, scales, ordinals, decades, Roman numerals",
    "country or demonym": "country names and demonyms (countryinfo)",
    "acronym": "acronyms",
    "no content either side": "answers without content words",
}


def check_at(commit: str):
    """``shares_answer_content`` as it was at ``commit`` (its ``metrics/answers.py``, via git show)."""
    source = subprocess.run(
        ["git", "show", f"{commit}:ragutil_dagster/metrics/answers.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType(f"answers_at_{commit}")
    exec(compile(source, f"{commit}:ragutil_dagster/metrics/answers.py", "exec"), module.__dict__)
    return module


def shares_at(commit: str):
    """``shares_answer_content`` as it was at ``commit``."""
    return check_at(commit).shares_answer_content


def _texts(pair: Pair) -> tuple[str, str]:
    return nli_text(pair.first, pair.question), nli_text(pair.second, pair.question)


def _shared_words(premise: str, hypothesis: str) -> list[tuple[str, str]]:
    """(word, word) pairs of the two answers that share a stem: what made the current check pass."""
    first, second = answers._answer_parts(premise, hypothesis)
    return [
        (u.word, v.word)
        for u in answers._units(first)
        for v in answers._units(second)
        if not u.function
        and not v.function
        and {k for k in u.keys & v.keys if k.startswith("word:")}
    ]


def recovery_cause(premise: str, hypothesis: str, old) -> str:
    """Why the baseline check refused a pair the current one passes."""
    reason = answers.content_match(premise, hypothesis).reason
    if reason != "shared word":
        return RECOVERED_BY.get(reason, reason)
    shared = _shared_words(premise, hypothesis)
    if any(a != b for a, b in shared) and not any(a == b for a, b in shared):
        return "inflections (Snowball stemmer)"
    if any(a in old._FUNCTION_WORDS for a, _ in shared):
        return "answer-bearing words the old function-word list dropped"
    return "tokenisation (clitics, abbreviations with dots, accents)"


def regression_cause(premise: str, hypothesis: str) -> str:
    """Why the current check refuses a pair the baseline passed."""
    reason = answers.content_match(premise, hypothesis).reason
    if reason == "numbers differ":
        return "numbers differ now (number parsing)"
    return "no shared content now (no 5-letter prefix rule; words in one country name)"


def examples_table(old) -> list[dict]:
    rows = []
    for question, gold, other, same in EXAMPLES:
        a, b = nli_text(gold, question), nli_text(other, question)
        rows.append(
            {
                "question": question,
                "gold": gold,
                "other": other,
                "equivalent": same,
                "before": [old.shares_answer_content(a, b), old.shares_answer_content(b, a)],
                "after": [answers.shares_answer_content(a, b), answers.shares_answer_content(b, a)],
                "after_reason": answers.content_match(a, b).reason,
            }
        )
    return rows


def annotator_spans(root: Path) -> dict[tuple[str, str], set[tuple[int, int]]]:
    """(question, answer text) → the character spans annotators marked for it in the paragraph
    (SQuAD's ``answer_start``), from the official JSON beside the BEIR folder."""
    data = json.loads((root / "dev-v1.1-public.json").read_text(encoding="utf-8"))
    spans: dict[tuple[str, str], set[tuple[int, int]]] = collections.defaultdict(set)
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                for answer in qa["answers"]:
                    start = answer["answer_start"]
                    spans[(qa["question"], answer["text"])].add(
                        (start, start + len(answer["text"]))
                    )
    return spans


def spans_overlap(pair: Pair, spans: dict) -> bool:
    """Whether the two annotators' spans of an equivalent pair share a character of the paragraph:
    the same span cut differently ("Denver Broncos" / "the Broncos"), not two places of it (a
    list's other item, another candidate, the same name mentioned twice)."""
    first, second = spans[(pair.question, pair.first)], spans[(pair.question, pair.second)]
    return any(a < d and c < b for a, b in first for c, d in second)


def refusals(pairs: list[Pair], old, spans: dict | None = None) -> dict:
    """Refused equivalent pairs and passed not-equivalent pairs, before and after, by cause."""
    out = {
        "n_equivalent": 0,
        "n_not_equivalent": 0,
        "refused_before": 0,
        "refused_after": 0,
        "passed_not_equivalent_before": 0,
        "passed_not_equivalent_after": 0,
        "refused_after_by_reason": collections.Counter(),
        "recovered_by": collections.Counter(),
        "newly_refused_by": collections.Counter(),
        "newly_passed_not_equivalent_by_reason": collections.Counter(),
        "equivalent_by_spans": collections.Counter(),
    }
    for pair in pairs:
        a, b = _texts(pair)
        before, after = old.shares_answer_content(a, b), answers.shares_answer_content(a, b)
        if pair.equivalent:
            if spans is not None:
                where = "overlapping spans" if spans_overlap(pair, spans) else "disjoint spans"
                out["equivalent_by_spans"][f"{where}: pairs"] += 1
                out["equivalent_by_spans"][f"{where}: refused before"] += not before
                out["equivalent_by_spans"][f"{where}: refused after"] += not after
            out["n_equivalent"] += 1
            out["refused_before"] += not before
            out["refused_after"] += not after
            if not after:
                out["refused_after_by_reason"][answers.content_match(a, b).reason] += 1
            if not before and after:
                out["recovered_by"][recovery_cause(a, b, old)] += 1
            if before and not after:
                out["newly_refused_by"][regression_cause(a, b)] += 1
        else:
            out["n_not_equivalent"] += 1
            out["passed_not_equivalent_before"] += before
            out["passed_not_equivalent_after"] += after
            if after and not before:
                out["newly_passed_not_equivalent_by_reason"][
                    answers.content_match(a, b).reason
                ] += 1
    for key in ("refused_before", "refused_after"):
        out[f"{key}_share"] = out[key] / max(1, out["n_equivalent"])
    for key in ("passed_not_equivalent_before", "passed_not_equivalent_after"):
        out[f"{key}_share"] = out[key] / max(1, out["n_not_equivalent"])
    return {
        k: dict(v.most_common()) if isinstance(v, collections.Counter) else v
        for k, v in out.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--squad", type=Path, default=SQUAD)
    parser.add_argument(
        "--max-pairs", type=int, default=1000, help="per class, as bench/nli_real.py"
    )
    parser.add_argument("--baseline", default=BASELINE, help="the commit whose check is 'before'")
    parser.add_argument(
        "--show",
        choices=HALVES,
        help="print that half's pairs the current check refuses, "
        "and its not-equivalent pairs it newly passes (read dev only)",
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    old = check_at(args.baseline)
    pairs = squad_pairs(args.squad, args.max_pairs)
    spans = annotator_spans(args.squad)
    results = {
        "baseline": args.baseline,
        "command": " ".join(["python", *sys.argv]),
        "pairs": "bench/nli_real.py squad: 1,000 equivalent + 1,000 not-equivalent SQuAD v1.1 dev pairs",
        "examples": examples_table(old),
        "squad": {
            "all": refusals(pairs, old, spans),
            **{half: refusals([p for p in pairs if p.half == half], old, spans) for half in HALVES},
        },
    }
    print("| gold | other | equivalent | before (both ways) | after (both ways) | after: reason |")
    print("|---|---|---|---|---|---|")
    for row in results["examples"]:
        fmt = lambda pair: " / ".join("passes" if x else "refused" for x in pair)  # noqa: E731
        print(
            f"| {row['gold']} | {row['other']} | {'yes' if row['equivalent'] else 'no'} | {fmt(row['before'])} "
            f"| {fmt(row['after'])} | {row['after_reason']} |"
        )
    print()
    for part in ("dev", "test", "all"):
        r = results["squad"][part]
        print(
            f"{part}: equivalent refused {r['refused_before']}/{r['n_equivalent']} ({r['refused_before_share']:.1%}) "
            f"→ {r['refused_after']}/{r['n_equivalent']} ({r['refused_after_share']:.1%}); "
            f"not-equivalent passed {r['passed_not_equivalent_before']}/{r['n_not_equivalent']} "
            f"({r['passed_not_equivalent_before_share']:.1%}) → {r['passed_not_equivalent_after']} "
            f"({r['passed_not_equivalent_after_share']:.1%})"
        )
        print(f"   recovered by: {r['recovered_by']}")
        print(
            f"   newly refused: {r['newly_refused_by']}; still refused: {r['refused_after_by_reason']}"
        )
        print(f"   not-equivalent newly passed: {r['newly_passed_not_equivalent_by_reason']}")
        print(f"   equivalent pairs by the annotators' spans: {r['equivalent_by_spans']}")
    if args.show:
        print(f"\n{args.show} half: equivalent pairs the current check refuses")
        for pair in pairs:
            a, b = _texts(pair)
            if (
                pair.half == args.show
                and pair.equivalent
                and not answers.shares_answer_content(a, b)
            ):
                print(
                    f"  {pair.question!r}: {pair.first!r} / {pair.second!r} — {answers.content_match(a, b).reason}"
                )
        print(
            f"\n{args.show} half: not-equivalent pairs the current check passes and the baseline refused"
        )
        for pair in pairs:
            a, b = _texts(pair)
            if (
                pair.half == args.show
                and not pair.equivalent
                and answers.shares_answer_content(a, b)
                and not old.shares_answer_content(a, b)
            ):
                print(
                    f"  {pair.question!r}: {pair.first!r} / {pair.second!r} — {answers.content_match(a, b).reason}"
                )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
