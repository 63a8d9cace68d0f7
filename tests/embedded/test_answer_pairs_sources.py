"""The answer NLI's training templates hold no entity of the evaluation data: none of the names,
noun phrases and purposes ``embedded/answer_pairs.py`` composes from its word lists occurs in the
SQuAD files (``../shared/data/squad``: paragraphs, titles, questions and gold answers).

Real geography (countries, cities and their other names: "United States", "New York") is world
knowledge and occurs in any English corpus, SQuAD's too; it is left out of the check. A model's
errors on SQuAD ("A worthy answer", read in SmolLM2's samples) are not in these files and cannot
be checked here: the non-answer word lists are written from scratch (see the module's comments)."""

from __future__ import annotations

import json
import re
from itertools import product
from pathlib import Path

import pytest

from ragutil_dagster.embedded import answer_pairs as ap

SQUAD = Path(__file__).resolve().parents[2].parent / "shared/data/squad"
pytestmark = pytest.mark.slow  # reads and normalises all of SQuAD's text (a few seconds)


def _words(text: str) -> tuple[str, ...]:
    return tuple(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


LONGEST = 6  # words: longer than any composed entity


@pytest.fixture(scope="module")
def squad_ngrams() -> set[tuple[str, ...]]:
    """Every run of 2 to LONGEST words of SQuAD's paragraphs, titles, questions and answers."""
    beir = SQUAD / "beir"
    if not (beir / "corpus.jsonl").is_file():
        pytest.fail(f"the SQuAD files are missing at {SQUAD} (../shared/data/squad)")
    texts: list[str] = []
    with (beir / "corpus.jsonl").open(encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            texts += [record["text"], record["title"]]
    with (beir / "queries.jsonl").open(encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            texts += [record["text"], *record["answers"]]
    grams: set[tuple[str, ...]] = set()
    for text in texts:
        words = _words(text)
        for n in range(2, LONGEST + 1):
            grams.update(zip(*(words[i:] for i in range(n))))
    return grams


def composed_entities() -> dict[str, list[str]]:
    """Every multi-word name, phrase and purpose the generator composes from its word lists."""
    return {
        "team": [
            f"{place} {nickname}" for place, nickname in product(ap.TEAM_PLACES, ap.TEAM_NICKNAMES)
        ],
        "team place": [place for place in ap.TEAM_PLACES if " " in place],
        "person": [f"{first} {surname}" for first, surname in product(ap.FIRST_NAMES, ap.SURNAMES)],
        "organisation": [
            " ".join(words) for words in product(ap.ORG_ADJECTIVES, ap.ORG_SUBJECTS, ap.ORG_KINDS)
        ],
        "noun phrase": [f"{a} {n}" for a, n in product(ap.PHRASE_ADJECTIVES, ap.PHRASE_NOUNS)],
        "purpose": [f"{verb} {obj}" for (verb, _), obj in product(ap.VERBS, ap.VERB_OBJECTS)],
        "meta talk": [
            f"{a} {n}"
            for a, n in product(ap.META_ADJECTIVES, ("answer", "response", "reply", "summary"))
        ],
        "with digits": [
            text
            for name in dir(ap)
            if name.isupper() and isinstance(getattr(ap, name), tuple)
            for text in getattr(ap, name)
            if isinstance(text, str) and re.search(r"\d", text)
        ],
    }


def test_no_composed_entity_of_the_templates_occurs_in_squad(squad_ngrams: set) -> None:
    found = {}
    for kind, entities in composed_entities().items():
        words = [_words(e) for e in entities]
        assert all(len(w) <= LONGEST for w in words), kind
        found[kind] = [
            e for e, w in zip(entities, words, strict=True) if len(w) > 1 and w in squad_ngrams
        ]
    assert not any(found.values()), f"template entities that occur in SQuAD: {found}"


def test_the_check_sees_an_entity_that_does_occur(squad_ngrams: set) -> None:
    """The check itself: SQuAD dev's Super Bowl 50 teams, which the team lists used to start with."""
    assert _words("Denver Broncos") in squad_ngrams
    assert _words("Carolina Panthers") in squad_ngrams
