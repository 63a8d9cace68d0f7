"""Adaptive sampling's stop rule and rounds (``evaluation/prompt_sampling.py``), with a generator that
records its calls and a standard error chosen per prompt: no model runs."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl
import pytest

from ragutil_dagster.assets.generations import sample_count_check
from ragutil_dagster.config import AdaptiveSamplingConfig, SamplingConfig
from ragutil_dagster.config.sampling import CLOSED_BOOK_ALWAYS_N
from ragutil_dagster.evaluation.prompt_sampling import (
    continues,
    off_schedule_groups,
    round_sizes,
    sample_prompts,
    sample_prompts_adaptive,
    sample_schedule,
    samples_drawn,
    sampling_mismatch,
)
from ragutil_dagster.models.generation import Sample
from ragutil_dagster.sampling import SamplingParams

DEFAULTS = AdaptiveSamplingConfig()


class RecordingGenerator:
    """Answers ``"<prompt>@<seed>#<i>"``; remembers every (prompts, params) call."""

    identity = "recording"
    settings: dict = {}
    context_length = None

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], SamplingParams]] = []

    def count_prompt_tokens(self, prompts: Sequence[str]) -> list[int]:
        return [1] * len(prompts)

    def sample(self, prompts: Sequence[str], params: SamplingParams) -> list[list[Sample]]:
        self.calls.append((list(prompts), params))
        # sample i of a prompt's stream, as a backend seeding samples by (seed, prompt, i) draws it
        return [
            [
                Sample(f"{p}@{params.seed}#{params.first_index + i}", (1,), (-0.5,), "stop", 1)
                for i in range(params.n)
            ]
            for p in prompts
        ]


def prompt_table(*rows: tuple[str, str, str | None, str]) -> pl.DataFrame:
    return pl.DataFrame(
        rows,
        schema={
            "query_id": pl.String,
            "condition": pl.String,
            "doc_id": pl.String,
            "prompt": pl.String,
        },
        orient="row",
    )


@pytest.mark.parametrize(
    ("se", "condition", "drawn", "expected"),
    [
        (0.25, "rag", 4, True),  # imprecise, below N_max: another round
        (0.24, "rag", 4, False),  # at the target: precise enough (the rule is SE > target)
        (0.10, "per_doc", 4, False),
        (0.40, "rag", 10, False),  # N_max reached whatever the SE
        (0.122, "rag", 4, False),  # four agreeing samples with context stop ...
        (0.122, "closed_book", 4, True),  # ... the closed-book prompt's go on: it draws all N
        (0.06, "closed_book", 8, True),
        (0.06, "closed_book", 10, False),
    ],
)
def test_stop_rule(se: float, condition: str, drawn: int, expected: bool) -> None:
    assert continues(se, condition, drawn, 10, DEFAULTS) is expected


def test_the_closed_book_draws_all_n_by_default_and_half_the_target_when_null() -> None:
    assert DEFAULTS.target_for("closed_book") == CLOSED_BOOK_ALWAYS_N
    assert DEFAULTS.target_for("oracle") == DEFAULTS.target_for("rag") == 0.24
    assert AdaptiveSamplingConfig(closed_book_target_se=None).target_for("closed_book") == 0.12
    explicit = AdaptiveSamplingConfig(target_se=0.3, closed_book_target_se=0.2)
    assert (explicit.target_for("closed_book"), explicit.target_for("per_doc")) == (0.2, 0.3)
    assert explicit.key == "first_round=4,round_size=2,target_se=0.3,closed_book_target_se=0.2"


@pytest.mark.parametrize(
    ("n_max", "first", "size", "expected"),
    [
        (10, 4, 2, [4, 2, 2, 2]),
        (9, 4, 2, [4, 2, 2, 1]),  # the last round reaches N_max exactly
        (4, 4, 2, [4]),
        (20, 5, 5, [5, 5, 5, 5]),
    ],
)
def test_round_sizes_reach_n_max(n_max: int, first: int, size: int, expected: list[int]) -> None:
    assert (
        round_sizes(n_max, AdaptiveSamplingConfig(first_round=first, round_size=size)) == expected
    )


def test_prompts_stop_when_precise_and_shared_prompts_follow_every_group() -> None:
    """q1's prompt is shared by rag and per_doc (k = 1): it goes on while either group is
    imprecise; q2 is precise after the first round; q3 never is and reaches N_max."""
    prompts = prompt_table(
        ("q1", "rag", None, "P1"),
        ("q1", "per_doc", "d1", "P1"),
        ("q2", "rag", None, "P2"),
        ("q3", "rag", None, "P3"),
    )
    sampling = SamplingConfig(n=10, adaptive={}, labels="most_likely")
    seen: list[int] = []

    def standard_errors(rows: pl.DataFrame) -> dict[tuple, float]:
        counts = rows.group_by("query_id", "condition", "doc_id").len()
        seen.append(rows.height)
        table = {}
        for qid, condition, doc_id, n in counts.iter_rows():
            precise = {"q2": True, "q1": condition == "rag" or n >= 6, "q3": False}[qid]
            table[(qid, condition, doc_id)] = 0.1 if precise else 0.3
        return table

    generator = RecordingGenerator()
    rows = sample_prompts_adaptive(prompts, generator, "g", sampling, 7, standard_errors)
    drawn = {(q, c): n for q, c, n in rows.group_by("query_id", "condition").len().iter_rows()}
    assert drawn == {("q1", "rag"): 6, ("q1", "per_doc"): 6, ("q2", "rag"): 4, ("q3", "rag"): 10}
    # Every round continues the streams of the experiment's seed where the last one stopped.
    assert [
        (call, params.n, params.seed, params.first_index) for call, params in generator.calls
    ] == [
        (["P1", "P2", "P3"], 4, 7, 0),
        (["P1", "P3"], 2, 7, 4),
        (["P3"], 2, 7, 6),
        (["P3"], 2, 7, 8),
    ]
    q3 = rows.filter(pl.col("query_id") == "q3").sort("sample_index")
    assert q3["sample_index"].to_list() == list(range(10)) and set(rows["seed"]) == {7}
    assert q3["text"].to_list() == [f"P3@7#{i}" for i in range(10)]
    # The standard errors are asked only of prompts still drawing.
    assert seen == [16, 18, 8]


def test_adaptive_samples_are_the_start_of_a_fixed_n_draw_and_closed_book_compares() -> None:
    """A prompt's adaptive samples are the fixed-N draw's first ones (in a backend seeding
    sample i by (seed, prompt, i)); adaptive rows pass the ΔSePer comparability check."""
    prompts = prompt_table(("q1", "closed_book", None, "C1"))
    fixed = sample_prompts(prompts, RecordingGenerator(), "g", SamplingConfig(n=10), 3)
    adaptive = sample_prompts_adaptive(
        prompts,
        RecordingGenerator(),
        "g",
        SamplingConfig(n=10, adaptive={"closed_book_target_se": 0.2}),
        3,
        lambda rows: {("q1", "closed_book", None): 0.0},
    )
    assert (
        adaptive.filter(pl.col("decoding") == "sample")["text"].to_list()
        == fixed["text"].to_list()[:4]
    )
    assert adaptive.filter(pl.col("decoding") == "greedy").height == 1
    assert sampling_mismatch(fixed, adaptive) is None
    table = samples_drawn(adaptive, 10).row(0, named=True)
    assert table == {
        "condition": "closed_book",
        "prompts": 1,
        "samples_drawn": 4,
        "sample_fraction": 0.4,
    }


def test_a_prompt_no_count_short_of_n_can_stop_draws_n_at_once_as_fixed_n_does() -> None:
    """At the defaults the closed-book prompt's target (0.01) is below the least standard error of
    the 8 samples before the last round, so it draws its 10 in one call — the call of a fixed-N
    run, so an engine whose samples depend on their batch mates gives fixed N's samples — and no
    standard error is asked of it; the rag prompt beside it goes in rounds."""
    prompts = prompt_table(("q1", "closed_book", None, "C1"), ("q1", "rag", None, "R1"))
    sampling = SamplingConfig(n=10, adaptive={}, labels="most_likely")
    asked: list[set] = []

    def standard_errors(rows: pl.DataFrame) -> dict[tuple, float]:
        asked.append(set(rows["condition"]))
        return {("q1", condition, None): 0.3 for condition in set(rows["condition"])}

    generator = RecordingGenerator()
    rows = sample_prompts_adaptive(prompts, generator, "g", sampling, 3, standard_errors)
    calls = [(prompts, p.n, p.first_index) for prompts, p in generator.calls]
    assert calls == [
        (["C1"], 10, 0),
        (["R1"], 4, 0),
        (["R1"], 2, 4),
        (["R1"], 2, 6),
        (["R1"], 2, 8),
    ]
    assert generator.calls[0][1] == sampling.params(3)  # exactly fixed N's call
    assert asked == [{"rag"}] * 3
    fixed = sample_prompts(
        prompts, RecordingGenerator(), "g", sampling.model_copy(update={"adaptive": None}), 3
    )
    assert rows.sort("condition", "sample_index").equals(fixed.sort("condition", "sample_index"))
    # With a target some count short of N meets, the closed book goes in rounds again.
    reachable = SamplingConfig(n=10, adaptive={"closed_book_target_se": 0.1}, labels="most_likely")
    generator = RecordingGenerator()
    sample_prompts_adaptive(prompts, generator, "g", reachable, 3, standard_errors)
    assert generator.calls[0][0] == ["C1", "R1"]


def test_first_round_above_n_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="first_round 4 is more than n = 3"):
        SamplingConfig(n=3, adaptive={})


def test_sample_schedule_is_n_or_the_end_of_a_round() -> None:
    assert sample_schedule(SamplingConfig(n=10)) == [10]
    assert sample_schedule(SamplingConfig(n=9, adaptive={})) == [4, 6, 8, 9]


def adaptive_rows(labels: str) -> tuple[pl.DataFrame, pl.DataFrame, SamplingConfig]:
    """Prompts, their adaptive rows and the sampling: q1 stops after the first round (4 samples),
    q2 after the second (6), q3 reaches N = 10."""
    prompts = prompt_table(
        ("q1", "rag", None, "P1"), ("q2", "per_doc", "d2", "P2"), ("q3", "rag", None, "P3")
    )
    sampling = SamplingConfig(n=10, adaptive={}, labels=labels)

    def standard_errors(rows: pl.DataFrame) -> dict[tuple, float]:
        stops_at = {"q1": 4, "q2": 6, "q3": 11}
        return {
            (q, c, d): 0.0 if n >= stops_at[q] else 1.0
            for q, c, d, n in rows.group_by("query_id", "condition", "doc_id").len().iter_rows()
        }

    return (
        prompts,
        sample_prompts_adaptive(prompts, RecordingGenerator(), "g", sampling, 0, standard_errors),
        sampling,
    )


@pytest.mark.parametrize("labels", ["greedy", "most_likely"])
def test_the_sample_count_check_passes_on_rows_that_follow_the_rounds(labels: str) -> None:
    prompts, rows, sampling = adaptive_rows(labels)
    drawn = dict(rows.filter(pl.col("decoding") == "sample").group_by("query_id").len().iter_rows())
    assert drawn == {"q1": 4, "q2": 6, "q3": 10}
    assert off_schedule_groups(prompts, rows, sampling).is_empty()
    assert sample_count_check(prompts, rows, sampling).passed


@pytest.mark.parametrize(
    ("labels", "broken", "expected"),
    [
        # one sample of q2 lost: 5 is no round's end (under most_likely labels the old check compared
        # the row count with itself and passed)
        (
            "most_likely",
            lambda rows: rows.filter(
                ~((pl.col("query_id") == "q2") & (pl.col("sample_index") == 5))
            ),
            [("q2", "per_doc", "d2", 5, 0, True)],
        ),
        # q3 drew one round too many: 12 > N
        (
            "most_likely",
            lambda rows: pl.concat(
                [rows, rows.filter((pl.col("query_id") == "q3") & (pl.col("sample_index") < 2))]
            ),
            [("q3", "rag", None, 12, 0, True)],
        ),
        # q1's greedy answer missing, and rows of a group no prompt asked for
        (
            "greedy",
            lambda rows: pl.concat(
                [
                    rows.filter(~((pl.col("query_id") == "q1") & (pl.col("decoding") == "greedy"))),
                    rows.filter(pl.col("query_id") == "q3").with_columns(query_id=pl.lit("q9")),
                ]
            ),
            [("q1", "rag", None, 4, 0, True), ("q9", "rag", None, 10, 1, False)],
        ),
    ],
)
def test_the_sample_count_check_fails_on_a_count_off_the_rounds(labels, broken, expected) -> None:
    prompts, rows, sampling = adaptive_rows(labels)
    rows = broken(rows)
    assert off_schedule_groups(prompts, rows, sampling).rows() == expected
    check = sample_count_check(prompts, rows, sampling)
    assert not check.passed
    assert check.metadata["groups_off_schedule"].value == str(len(expected))
    assert check.metadata["sample_counts_allowed"].value == "[4, 6, 8, 10]"
    assert "off_schedule_groups" in check.metadata


def test_the_sample_count_check_at_fixed_n_wants_exactly_n() -> None:
    prompts = prompt_table(("q1", "rag", None, "P1"), ("q2", "rag", None, "P2"))
    sampling = SamplingConfig(n=4)
    rows = sample_prompts(prompts, RecordingGenerator(), "g", sampling, 0)
    assert sample_count_check(prompts, rows, sampling).passed
    short = rows.filter(~((pl.col("query_id") == "q2") & (pl.col("sample_index") == 3)))
    assert off_schedule_groups(prompts, short, sampling).rows() == [("q2", "rag", None, 3, 1, True)]
    assert not sample_count_check(prompts, short, sampling).passed
