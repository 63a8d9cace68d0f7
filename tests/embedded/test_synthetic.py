"""The synthetic world: determinism, structure, ground-truth utility and the files it writes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from ragutil_dagster.embedded.world import (
    ATTRIBUTE_BY_NAME,
    World,
    make_reading_world,
    make_world,
    write_world,
)
from ragutil_dagster.metrics.answers import has_answer


@pytest.fixture(scope="module")
def world() -> World:
    return make_world(0, "default")


@pytest.fixture(scope="module")
def ci_world() -> World:
    return make_world(0, "ci")


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_same_seed_same_world_other_seed_other_world(ci_world: World, tmp_path: Path) -> None:
    a = write_world(ci_world, tmp_path / "a")
    b = write_world(make_world(0, "ci"), tmp_path / "b")
    c = write_world(make_world(1, "ci"), tmp_path / "c")
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "utility.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "corpus.jsonl").read_bytes() != (c / "corpus.jsonl").read_bytes()


def test_default_world_is_big_enough_and_has_both_question_types(world: World) -> None:
    assert len(world.entities) >= 200
    assert len(world.passages) >= 1000
    types = Counter(q.type for q in world.questions)
    assert types["single_hop"] >= 200 and types["two_hop"] >= 100
    known = sum(e.known for e in world.entities) / len(world.entities)
    assert 0.35 <= known <= 0.45  # the default known share is 0.4


def test_positives_state_the_answer_and_negatives_never_do(world: World) -> None:
    for q in world.questions:
        final = q.positives[-1]
        assert has_answer(world.passage_by_id[final.passage_id].text, q.answers), q.id
        for j in q.judgements:
            if j.role != "positive":
                assert not has_answer(world.passage_by_id[j.passage_id].text, q.answers), (q.id, j)


def test_hard_negatives_are_hard(world: World) -> None:
    for q in world.questions:
        subject = world.entity_by_id[q.entity_id]
        for j in q.judgements:
            p = world.passage_by_id[j.passage_id]
            if j.role == "hard_negative_surname":
                other = world.entity_by_id[p.entity_id]
                assert other.id != subject.id
                assert other.name.split()[-1] == subject.name.split()[-1]
                asked = "employer" if q.type == "two_hop" else q.attribute
                assert asked in p.attributes
            if j.role == "hard_negative_attribute":
                assert q.attribute.split(".")[-1] not in p.attributes


def test_ground_truth_utility_follows_seper(world: World) -> None:
    for q in world.questions:
        for j in q.judgements:
            if j.role != "positive":
                assert j.utility == 0.0
            elif q.type == "two_hop":
                assert j.utility == pytest.approx(1 / q.n_hops) and q.n_hops == 2
            else:
                assert j.utility == (0.0 if q.known else 1.0)
    two_hop = [q for q in world.questions if q.type == "two_hop"]
    for q in two_hop:
        person = world.entity_by_id[q.entity_id]
        hops = {j.hop: world.passage_by_id[j.passage_id] for j in q.positives}
        assert hops[1].entity_id == person.id and "employer" in hops[1].attributes
        company = world.entity_by_id[hops[2].entity_id]
        assert company.name == person.attributes["employer"]
        assert q.answers[0] == company.attributes[q.attribute.split(".")[1]]


def test_every_passage_states_exactly_its_attributes(ci_world: World) -> None:
    for p in ci_world.passages:
        e = ci_world.entity_by_id[p.entity_id]
        assert p.text.startswith(e.name) or e.name in p.text
        for attr in p.attributes:
            assert e.attributes[attr] in p.text
            assert ATTRIBUTE_BY_NAME[attr].kind == e.kind
        assert 20 <= len(p.text.split()) <= 60


def test_reading_world_is_disjoint_but_shares_value_pools(world: World) -> None:
    reading = make_reading_world(world)
    test_people = {e.name for e in world.entities if e.kind == "person"}
    assert not test_people & {e.name for e in reading.entities if e.kind == "person"}
    assert not any(e.known for e in reading.entities)
    cities = set(world.pools.cities)
    for e in reading.entities:
        if e.kind == "person":
            assert e.attributes["birthplace"] in cities
    types = Counter(q.type for q in reading.questions)
    assert types["two_hop"] > 0 and types["single_hop"] > len(world.questions)


def test_written_files_follow_beir_and_document_ground_truth(
    ci_world: World, tmp_path: Path
) -> None:
    out = write_world(ci_world, tmp_path / "w")
    corpus = _read_jsonl(out / "corpus.jsonl")
    queries = _read_jsonl(out / "queries.jsonl")
    assert set(corpus[0]) == {"_id", "title", "text"} and set(queries[0]) == {"_id", "text"}
    lines = (out / "qrels" / "test.tsv").read_text().splitlines()
    assert lines[0] == "query-id\tcorpus-id\tscore"
    corpus_ids, query_ids = {c["_id"] for c in corpus}, {q["_id"] for q in queries}
    for line in lines[1:]:
        qid, cid, score = line.split("\t")
        assert qid in query_ids and cid in corpus_ids and score == "1"
    n_positives = sum(len(q.positives) for q in ci_world.questions)
    assert len(lines) - 1 == n_positives
    utility = _read_jsonl(out / "utility.jsonl")
    assert {u["query-id"] for u in utility} == query_ids
    assert sum(u["role"] == "positive" for u in utility) == n_positives
    questions = {q["_id"]: q for q in _read_jsonl(out / "questions.jsonl")}
    assert set(questions) == query_ids
    assert all(q["answers"] and q["type"] in ("single_hop", "two_hop") for q in questions.values())
    meta = json.loads((out / "world.json").read_text())
    assert meta["counts"]["passages"] == len(corpus) and meta["seed"] == 0
    assert not list(out.rglob("*.tmp"))
