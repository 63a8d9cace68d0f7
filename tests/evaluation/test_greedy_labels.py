"""Labels by greedy decoding (issue 17, item 1): one greedy answer per prompt beside the N
samples; SePer reads the samples only, the judged answer is the greedy one."""

from __future__ import annotations

import polars as pl
import pytest

from ragutil_dagster.config import SamplingConfig
from ragutil_dagster.evaluation.groups import judged_answers
from ragutil_dagster.evaluation.prompt_sampling import (
    off_schedule_groups,
    sample_prompts,
    sampling_mismatch,
)
from ragutil_dagster.models.generation import Sample
from ragutil_dagster.sampling import SamplingParams
from ragutil_dagster.tables import DECODING_GREEDY, DECODING_SAMPLE, PROMPT_SCHEMA


class ScriptedGenerator:
    """Answers "greedy" at temperature 0 and "sample <i>" otherwise; records every call."""

    identity = "scripted@1"

    def __init__(self) -> None:
        self.calls: list[SamplingParams] = []

    def sample(self, prompts: list[str], params: SamplingParams) -> list[list[Sample]]:
        self.calls.append(params)
        text = (lambda i: "greedy") if params.temperature == 0 else (lambda i: f"sample {i}")
        return [
            [Sample(text(i), (1, 2), (-0.1 * (i + 1), -0.2), "stop", 3) for i in range(params.n)]
            for _ in prompts
        ]


PROMPTS = pl.DataFrame(
    {
        "query_id": ["q1", "q2"],
        "condition": ["rag", "rag"],
        "doc_id": [None, None],
        "doc_ids": [["d1"], ["d2"]],
        "prompt": ["p1", "p2"],
        "passages_dropped": [0, 0],
        "last_passage_chars": [None, None],
    },
    schema=PROMPT_SCHEMA,
)


def test_greedy_labels_add_one_greedy_answer_per_prompt() -> None:
    generator = ScriptedGenerator()
    sampling = SamplingConfig(n=3, max_new_tokens=8)
    rows = sample_prompts(PROMPTS, generator, "g", sampling, seed=5)
    assert rows.height == PROMPTS.height * (sampling.n + 1) == 8
    assert off_schedule_groups(PROMPTS, rows, sampling).is_empty()
    greedy = rows.filter(pl.col("decoding") == DECODING_GREEDY)
    assert greedy["text"].to_list() == ["greedy", "greedy"] and set(greedy["temperature"]) == {0.0}
    assert rows.filter(pl.col("decoding") == DECODING_SAMPLE).height == 6
    assert [(p.n, p.temperature, p.max_new_tokens) for p in generator.calls] == [
        (3, 1.0, 8),
        (1, 0.0, 8),
    ]
    assert judged_answers(rows, "rag") == {"q1": "greedy", "q2": "greedy"}


def test_most_likely_labels_sample_nothing_more_and_judge_the_most_likely_sample() -> None:
    generator = ScriptedGenerator()
    sampling = SamplingConfig(n=3, labels="most_likely")
    rows = sample_prompts(PROMPTS, generator, "g", sampling, seed=5)
    assert rows.height == 6 and len(generator.calls) == 1
    # Sample 0 has the highest mean token log-prob (-0.1, -0.2).
    assert judged_answers(rows, "rag") == {"q1": "sample 0", "q2": "sample 0"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"seed": 6}, "seed"),
        ({"temperature": 0.7}, "temperature"),
        ({"top_p": 0.9}, "top_p"),
        ({"top_k": 40}, "top_k"),
        ({"max_new_tokens": 9}, "max_new_tokens"),
    ],
)
def test_closed_book_and_context_samples_must_share_every_sampling_setting(change, field) -> None:
    base = SamplingConfig(n=2, max_new_tokens=8)
    closed = sample_prompts(PROMPTS, ScriptedGenerator(), "g", base, seed=5)
    assert (
        sampling_mismatch(closed, sample_prompts(PROMPTS, ScriptedGenerator(), "g", base, seed=5))
        is None
    )
    seed = change.pop("seed", 5)
    other = sample_prompts(
        PROMPTS, ScriptedGenerator(), "g", base.model_copy(update=change), seed=seed
    )
    assert field in (sampling_mismatch(closed, other) or "")


def test_samples_without_greedy_answers_cannot_meet_greedy_ones() -> None:
    closed = sample_prompts(
        PROMPTS, ScriptedGenerator(), "g", SamplingConfig(n=2, labels="most_likely"), seed=0
    )
    context = sample_prompts(PROMPTS, ScriptedGenerator(), "g", SamplingConfig(n=2), seed=0)
    assert "greedy" in (sampling_mismatch(closed, context) or "")


def test_the_token_that_ended_an_answer_does_not_weigh_in() -> None:
    # SePer's weights (and the most likely sample) use the answer's own tokens, as the authors'
    # code: "a" is likelier by its answer token (-0.1 vs -0.5) though its end-of-sequence
    # token is far less likely. A cut-off answer ("length") keeps every token.
    rows = sample_prompts(
        PROMPTS.head(1), ScriptedGenerator(), "g", SamplingConfig(n=2, labels="most_likely"), 0
    )
    rows = rows.with_columns(
        text=pl.Series(["a", "b"]),
        token_logprobs=pl.Series([[-0.1, -5.0], [-0.5, -0.01]]),
        finish_reason=pl.Series(["stop", "stop"]),
    )
    assert judged_answers(rows, "rag") == {"q1": "a"}
    assert judged_answers(rows.with_columns(finish_reason=pl.lit("length")), "rag") == {"q1": "b"}
