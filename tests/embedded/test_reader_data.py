"""The reader's training stream: what it may show the reader, and the mix it is asked to draw."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from ragutil_dagster.embedded.training import ReaderData
from ragutil_dagster.embedded.world import Question, World, make_reading_world, make_world

CURRICULUM = (("employer", 0.3), ("founded", 0.2))
MIXED = (("industry", 0.25), ("headquarters", 0.1))


@pytest.fixture(scope="module")
def world() -> World:
    return make_world(0, "ci")


def _data(world: World, **options) -> ReaderData:
    return ReaderData(
        world,
        lambda draw: make_reading_world(world, "ci", draw),
        random.Random("reader-data-test"),
        **options,
    )


def test_no_example_reveals_an_unknown_fact(world: World) -> None:
    """Unknown facts must reach the reader only through a test-time context: no training example,
    in any stream, names an unknown person or quotes an unknown entity's passage."""
    data = _data(world, curriculum_shares=CURRICULUM, answer_shares=MIXED)
    examples = (
        data.gold_alone(300) + data.with_context(1500) + data.questions(600) + data.facts(300)
    )
    known = {e.id for e in world.entities if e.known}
    unknown_people = [e.name for e in world.entities if e.kind == "person" and not e.known]
    unknown_passages = [p.text for p in world.passages if p.entity_id not in known]
    for ex in examples:
        text = f"{ex.prompt} {ex.target}"
        assert not [n for n in unknown_people if n in text], ex
        assert not [p for p in unknown_passages if p in text], ex


@pytest.mark.parametrize(("stream", "shares"), [("curriculum", CURRICULUM), ("mixed", MIXED)])
def test_each_phase_draws_its_own_attribute_shares(
    world: World, stream: str, shares: tuple[tuple[str, float], ...]
) -> None:
    data = _data(world, curriculum_shares=CURRICULUM, answer_shares=MIXED)
    data._examples_left = 10**6  # one reading world throughout
    natural = Counter(q.attribute for q in data.single)
    if stream == "curriculum":
        drawn = Counter(_question_of(data, ex.prompt).attribute for ex in data.gold_alone(4000))
    else:
        drawn = Counter(data._single_question(data.answer_shares).attribute for _ in range(4000))
    listed = dict(shares)
    for attribute, count in natural.items():
        expected = listed.get(attribute, 0.0) + (1 - sum(listed.values())) * count / sum(
            natural.values()
        )
        assert drawn[attribute] / 4000 == pytest.approx(expected, abs=0.03), attribute


def _question_of(data: ReaderData, prompt: str) -> Question:
    return next(q for q in data.single if f"Question: {q.text}\n" in prompt)
