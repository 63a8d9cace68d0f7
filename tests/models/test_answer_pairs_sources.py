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


def _normalised(text: str) -> str:
    return " " + " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split()) + " "


@pytest.fixture(scope="module")
def squad_text() -> str:
    beir = SQUAD / "beir"
    texts: list[str] = []
    with (beir / "corpus.jsonl").open(encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            texts += [record["text"], record["title"]]
    with (beir / "queries.jsonl").open(encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            texts += [record["text"], *record["answers"]]
    return "\n".join(_normalised(text) for text in texts)


def composed_entities() -> dict[str, list[str]]:
    """Every multi-word name, phrase and purpose the generator composes from its word lists."""
    return {
        "team": [f"{place} {nickname}" for place, nickname in product(ap.TEAM_PLACES, ap.TEAM_NICKNAMES)],
        "team place": [place for place in ap.TEAM_PLACES if " " in place],
        "person": [f"{first} {surname}" for first, surname in product(ap.FIRST_NAMES, ap.SURNAMES)],
        "organisation": [" ".join(words) for words in product(ap.ORG_ADJECTIVES, ap.ORG_SUBJECTS, ap.ORG_KINDS)],
        "noun phrase": [f"{a} {n}" for a, n in product(ap.PHRASE_ADJECTIVES, ap.PHRASE_NOUNS)],
        "purpose": [f"{verb} {obj}" for (verb, _), obj in product(ap.VERBS, ap.VERB_OBJECTS)],
        "meta talk": [f"{a} {n}" for a, n in product(ap.META_ADJECTIVES, ("answer", "response", "reply", "summary"))],
        "with digits": [text for name in dir(ap) if name.isupper() and isinstance(getattr(ap, name), tuple)
                        for text in getattr(ap, name) if isinstance(text, str) and re.search(r"\d", text)],
    }


def test_no_composed_entity_of_the_templates_occurs_in_squad(squad_text: str) -> None:
    if not (SQUAD / "beir" / "corpus.jsonl").is_file():
        pytest.fail(f"the SQuAD files are missing at {SQUAD} (../shared/data/squad)")
    found = {kind: [e for e in entities if _normalised(e) in squad_text]
             for kind, entities in composed_entities().items()}
    assert not any(found.values()), f"template entities that occur in SQuAD: {found}"


def test_the_check_sees_an_entity_that_does_occur(squad_text: str) -> None:
    """The check itself: SQuAD dev's Super Bowl 50 teams, which the team lists used to start with."""
    assert _normalised("Denver Broncos") in squad_text
    assert _normalised("Carolina Panthers") in squad_text
