"""``ragutil score``: a user's own records scored without Dagster; bad records named precisely."""

from __future__ import annotations

import json

import polars as pl
import pytest
import yaml

from ragutil_dagster.cli import build_parser
from ragutil_dagster.data.records import read_records
from ragutil_dagster.errors import CorpusValidationError
from ragutil_dagster.evaluation.records import record_key
from ragutil_dagster.metrics import catalog
from ragutil_dagster.metrics.answers import has_answer
from ragutil_dagster.tables import DECODING_SAMPLE


def parse(argv):
    return build_parser().parse_args(argv)


def write_lines(path, lines):
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    )
    return path


RECORDS = [
    {
        "id": "r1",
        "question": "Where was Ada born?",
        "answers": ["Paris"],
        "contexts": ["Ada was born in Paris.", {"id": "d2", "text": "Rome is big."}],
    },
    {
        "id": 2,
        "question": "Who wrote it?",
        "answers": ["Bo Li", "Li"],
        "contexts": [{"text": "Bo Li wrote it."}],
    },
]


def test_score_writes_one_line_per_record(
    tiny_world, make_tiny_config, tmp_path, monkeypatch
) -> None:
    _, world, models = tiny_world
    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path / "home"))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(make_tiny_config(models, world)))
    records = write_lines(tmp_path / "records.jsonl", RECORDS)
    out = tmp_path / "scores.jsonl"
    args = parse(["score", str(records), "--config", str(config), "--out", str(out), "--quiet"])
    assert args.func(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["r1", "2"]
    first = rows[0]
    assert first["delta_seper_s"] == pytest.approx(
        first["seper_s_with_context"] - first["seper_s_without_context"]
    )
    assert [c["id"] for c in first["per_context"]] == ["r1#1", "d2"]
    assert len(rows[1]["per_context"]) == 1
    for row in rows:
        assert 0 <= row["seper_h_with_context"] <= 1 and 0 <= row["em_with_context"] <= 1
        assert {"consens", "f1_with_context", "f1_without_context", "answer_with_context"} <= set(
            row
        )
        # Every per-query metric of the catalogue that needs no relevance judgments, a condition's
        # named by what the record gave it.
        assert set(row) == {
            "id",
            "per_context",
            "answer_with_context",
            "answer_without_context",
        } | {
            record_key(m.name)
            for m in catalog.entries()
            if m.level == "query" and not m.needs_qrels
        }
        assert all(
            set(context) == {"id", "rank", "delta_seper_s", "delta_seper_h", "answer", "has_answer"}
            for context in row["per_context"]
        )
        for context in row[
            "per_context"
        ]:  # the judged answer with that context alone, judged lexically
            golds = RECORDS[[str(r["id"]) for r in RECORDS].index(row["id"])]["answers"]
            assert context["has_answer"] is has_answer(context["answer"], golds)


@pytest.mark.parametrize(("standard_error", "drawn"), [(0.0, 2), (0.4, 6)])
def test_score_follows_adaptive_sampling(
    tiny_world, make_tiny_config, tmp_path, monkeypatch, capsys, standard_error, drawn
) -> None:
    """``sampling.adaptive`` means in ``ragutil score`` what it means in the graph: every prompt
    stops after its first round when each group's standard error is under the target, and draws
    N_max when it never is (the standard errors are fixed here, so the counts are known)."""
    from ragutil_dagster.evaluation import prompt_sampling as sampling_module
    from ragutil_dagster.evaluation import records as records_module

    _, world, models = tiny_world
    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(
        sampling_module,
        "seper_standard_errors",
        lambda samples, queries, entail: {
            key: standard_error
            for key in samples.select("query_id", "condition", "doc_id").unique().iter_rows()
        },
    )
    counts: list[int] = []
    sample = records_module.sample_prompts_by_config

    def counted(*args, **kwargs):
        rows, seconds = sample(*args, **kwargs)
        counts.extend(
            rows.filter(pl.col("decoding") == DECODING_SAMPLE)
            .group_by("query_id", "condition", "doc_id")
            .len()["len"]
            .to_list()
        )
        return rows, seconds

    monkeypatch.setattr(records_module, "sample_prompts_by_config", counted)
    spec = make_tiny_config(models, world)
    spec["sampling"] = {
        **spec.get("sampling", {}),
        "n": 6,
        # A closed-book target a group of 2 or 4 can meet, so the closed book stops early too.
        "adaptive": {
            "first_round": 2,
            "round_size": 2,
            "target_se": 0.2,
            "closed_book_target_se": 0.2,
        },
    }
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(spec))
    records = write_lines(tmp_path / "records.jsonl", RECORDS)
    args = parse(
        [
            "score",
            str(records),
            "--config",
            str(config),
            "--out",
            str(tmp_path / "s.jsonl"),
            "--quiet",
        ]
    )
    assert args.func(args) == 0
    assert counts and set(counts) == {drawn}
    # Each record says what its scores cost, and the command says the estimator is biased.
    scored = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [row["sample_fraction"] for row in scored] == [pytest.approx(drawn / 6)] * len(RECORDS)
    assert "biases SePer and ΔSePer low" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("line", "field", "message"),
    [
        ("{not json", None, "invalid JSON"),
        ({"question": "q", "answers": ["a"], "contexts": ["c"]}, "id", "missing"),
        ({"id": "x", "question": "", "answers": ["a"], "contexts": ["c"]}, "question", "empty"),
        (
            {"id": "x", "question": 3, "answers": ["a"], "contexts": ["c"]},
            "question",
            "expected a string",
        ),
        (
            {"id": "x", "question": "q", "answers": [], "contexts": ["c"]},
            "answers",
            "non-empty list",
        ),
        ({"id": "x", "question": "q", "answers": [""], "contexts": ["c"]}, "answers[0]", "empty"),
        (
            {"id": "x", "question": "q", "answers": ["a"], "contexts": []},
            "contexts",
            "non-empty list",
        ),
        (
            {"id": "x", "question": "q", "answers": ["a"], "contexts": [{"id": "d"}]},
            "contexts[0].text",
            "missing",
        ),
        (
            {"id": "x", "question": "q", "answers": ["a"], "contexts": [7]},
            "contexts[0]",
            "expected a string or an object",
        ),
    ],
)
def test_bad_records_name_line_and_field(tmp_path, line, field, message) -> None:
    path = write_lines(tmp_path / "bad.jsonl", [RECORDS[0], line])
    with pytest.raises(CorpusValidationError, match=message) as info:
        read_records(path)
    assert info.value.line == 2 and info.value.field == field


def test_duplicate_ids_and_bad_bytes(tmp_path) -> None:
    with pytest.raises(CorpusValidationError, match="duplicate id") as info:
        read_records(write_lines(tmp_path / "dup.jsonl", [RECORDS[0], RECORDS[0]]))
    assert info.value.line == 2
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(json.dumps(RECORDS[0]).encode() + b"\n\xff\xfe{}\n")
    with pytest.raises(CorpusValidationError, match="not valid UTF-8"):
        read_records(path)
