"""Adaptive sampling's stop rule and rounds (``evaluation/sampling.py``), with a generator that
records its calls and a standard error chosen per prompt: no model runs."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl
import pytest

from ragutil_dagster.config import AdaptiveSamplingConfig, SamplingConfig
from ragutil_dagster.evaluation.sampling import (
    continues, round_sizes, sample_prompts, sample_prompts_adaptive, samples_drawn, sampling_mismatch,
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
        return [[Sample(f"{p}@{params.seed}#{params.first_index + i}", (1,), (-0.5,), "stop", 1)
                 for i in range(params.n)] for p in prompts]


def prompt_table(*rows: tuple[str, str, str | None, str]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"query_id": pl.String, "condition": pl.String, "doc_id": pl.String,
                                      "prompt": pl.String}, orient="row")


@pytest.mark.parametrize(("se", "condition", "drawn", "expected"), [
    (0.30, "rag", 4, True),           # imprecise, below N_max: another round
    (0.22, "rag", 4, False),          # at the target: precise enough (the rule is SE > target)
    (0.10, "per_doc", 4, False),
    (0.40, "rag", 10, False),         # N_max reached whatever the SE
    (0.122, "rag", 4, False),         # four agreeing samples with context stop ...
    (0.122, "closed_book", 4, True),  # ... the closed-book prompt's go on: its target is half
    (0.11, "closed_book", 6, False),
])
def test_stop_rule(se: float, condition: str, drawn: int, expected: bool) -> None:
    assert continues(se, condition, drawn, 10, DEFAULTS) is expected


def test_the_closed_book_target_is_half_unless_set() -> None:
    assert DEFAULTS.target_for("closed_book") == DEFAULTS.target_se / 2 == 0.11
    assert DEFAULTS.target_for("oracle") == DEFAULTS.target_for("rag") == 0.22
    explicit = AdaptiveSamplingConfig(target_se=0.3, closed_book_target_se=0.2)
    assert (explicit.target_for("closed_book"), explicit.target_for("per_doc")) == (0.2, 0.3)
    assert explicit.key == "first_round=4,round_size=2,target_se=0.3,closed_book_target_se=0.2"


@pytest.mark.parametrize(("n_max", "first", "size", "expected"), [
    (10, 4, 2, [4, 2, 2, 2]),
    (9, 4, 2, [4, 2, 2, 1]),   # the last round reaches N_max exactly
    (4, 4, 2, [4]),
    (20, 5, 5, [5, 5, 5, 5]),
])
def test_round_sizes_reach_n_max(n_max: int, first: int, size: int, expected: list[int]) -> None:
    assert round_sizes(n_max, AdaptiveSamplingConfig(first_round=first, round_size=size)) == expected


def test_prompts_stop_when_precise_and_shared_prompts_follow_every_group() -> None:
    """q1's prompt is shared by rag and per_doc (k = 1): it goes on while either group is
    imprecise; q2 is precise after the first round; q3 never is and reaches N_max."""
    prompts = prompt_table(("q1", "rag", None, "P1"), ("q1", "per_doc", "d1", "P1"),
                           ("q2", "rag", None, "P2"), ("q3", "rag", None, "P3"))
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
    assert [(call, params.n, params.seed, params.first_index) for call, params in generator.calls] == [
        (["P1", "P2", "P3"], 4, 7, 0), (["P1", "P3"], 2, 7, 4), (["P3"], 2, 7, 6), (["P3"], 2, 7, 8),
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
    adaptive = sample_prompts_adaptive(prompts, RecordingGenerator(), "g", SamplingConfig(n=10, adaptive={}), 3,
                                       lambda rows: {("q1", "closed_book", None): 0.0})
    assert adaptive.filter(pl.col("decoding") == "sample")["text"].to_list() == fixed["text"].to_list()[:4]
    assert adaptive.filter(pl.col("decoding") == "greedy").height == 1
    assert sampling_mismatch(fixed, adaptive) is None
    table = samples_drawn(adaptive, 10).row(0, named=True)
    assert table == {"condition": "closed_book", "prompts": 1, "samples_drawn": 4, "sample_fraction": 0.4}


def test_first_round_above_n_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="first_round 4 is more than n = 3"):
        SamplingConfig(n=3, adaptive={})
