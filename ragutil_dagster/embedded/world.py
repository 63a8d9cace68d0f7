"""A synthetic knowledge world with exact ground-truth retrieval utility.

Fictional people and companies with generated names (so no real-world knowledge can leak into a
reader), DPR-style passages stating their facts, MIRAGE-style hard negatives (MIRAGE §3: passages
"similar in content but lacking the key information": a person sharing the surname, and a passage
about the right entity that does not state the asked attribute), single-hop and two-hop
questions, and a knowledge split: a share of the entities is *known* (their facts go into the
reader's training text), the rest exist only in the corpus.

Ground-truth utility of a passage for a question follows SePer §4.1.2: 1 for the positive of an
unknown single-hop fact, 0 for the positive of a known fact and for every negative, and
1 / n_hops for each positive of a multi-hop question.

Everything is deterministic per seed. :func:`make_world` builds the evaluation world;
:func:`make_reading_world` builds the disjoint world the reader learns reading comprehension on,
drawing attribute values from the same pools (a value the reader never produced in training is
never copied at test time). :func:`write_world` writes the BEIR layout plus the extra JSONL files
documented in ``docs/synthetic_world.md``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ragutil_dagster.infra.files import write_text_atomic
from ragutil_dagster.metrics.answers import has_answer

QuestionType = Literal["single_hop", "two_hop"]
Role = Literal["positive", "hard_negative_surname", "hard_negative_attribute", "random_negative"]

SCHEMA_VERSION = 1

# --- value pools -----------------------------------------------------------------------------
# Occupations and industries are ordinary English words with synonyms as aliases; they say
# nothing about any fictional entity. Canonical forms are single words so every answer is one
# token of the reader's word-level vocabulary.
OCCUPATIONS: dict[str, tuple[str, ...]] = {
    "physician": ("doctor",),
    "lawyer": ("attorney",),
    "carpenter": ("woodworker",),
    "journalist": ("reporter",),
    "teacher": ("educator",),
    "pilot": ("aviator",),
    "sailor": ("seaman",),
    "chemist": (),
    "farmer": (),
    "baker": (),
    "nurse": (),
    "architect": (),
    "engineer": (),
    "painter": (),
    "musician": (),
    "librarian": (),
    "tailor": (),
    "plumber": (),
    "surgeon": (),
    "economist": (),
    "geologist": (),
    "botanist": (),
    "astronomer": (),
    "potter": (),
}
INDUSTRIES: dict[str, tuple[str, ...]] = {
    "shipping": ("freight",),
    "banking": ("finance",),
    "software": ("computing",),
    "textiles": ("clothing",),
    "mining": (),
    "insurance": (),
    "pharmaceuticals": (),
    "aviation": (),
    "publishing": (),
    "agriculture": (),
    "brewing": (),
    "logistics": (),
    "robotics": (),
    "tourism": (),
    "furniture": (),
    "ceramics": (),
}
YEARS: tuple[str, ...] = tuple(str(y) for y in range(1850, 2011))

_ONSETS = (
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "gr",
    "kr",
    "tr",
    "st",
    "th",
    "sh",
    "ch",
    "vl",
    "h",
    "j",
)
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ou", "ia")
_CODAS = ("", "", "n", "r", "l", "s", "th", "m", "k", "nd", "x")


@dataclass(frozen=True)
class Pools:
    """Generated name and value pools shared by the evaluation world and the reading world."""

    first_names: tuple[str, ...]
    surnames: tuple[str, ...]
    cities: tuple[str, ...]
    companies: tuple[str, ...]


def _word(rng: random.Random, syllables: int) -> str:
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
    return ("".join(parts) + rng.choice(_CODAS)).capitalize()


def make_pools(
    seed: int, n_first: int = 160, n_surnames: int = 400, n_cities: int = 48, n_companies: int = 160
) -> Pools:
    """Generate disjoint pools of invented words (first names, surnames, cities, companies).

    Names are 2–3 random syllables; every word is unique across all pools and never one of the
    fixed English words the templates use, so a name can only mean its one entity or value.
    """
    rng = random.Random(f"pools:{seed}")
    taken: set[str] = set()

    def draw(n: int, syllables: tuple[int, ...]) -> tuple[str, ...]:
        out: list[str] = []
        while len(out) < n:
            w = _word(rng, rng.choice(syllables))
            if w not in taken and w.lower() not in _RESERVED and len(w) >= 4:
                taken.add(w)
                out.append(w)
        return tuple(out)

    return Pools(
        first_names=draw(n_first, (2,)),
        surnames=draw(n_surnames, (2, 3)),
        cities=draw(n_cities, (2, 3)),
        companies=draw(n_companies, (2, 3)),
    )


# --- world structures ------------------------------------------------------------------------
@dataclass(frozen=True)
class Attribute:
    """One attribute of an entity kind: its value pool, how a passage states it, how it is asked."""

    name: str
    kind: Literal["person", "company"]
    pool: Literal["city", "occupation", "company", "year", "industry"]
    group: int  # which of the entity's two passages states it
    sentences: tuple[str, ...]  # str.format with {name}, {value} and {a} (its indefinite article)
    question: str  # str.format with {name}
    two_hop_question: str | None = None  # for company attributes: asked through a person's employer


ATTRIBUTES: tuple[Attribute, ...] = (
    Attribute(
        "birthplace",
        "person",
        "city",
        0,
        ("{name} was born in {value}.", "{name} was born in the city of {value}."),
        "Where was {name} born?",
    ),
    Attribute(
        "occupation",
        "person",
        "occupation",
        0,
        ("{name} works as {a} {value}.", "By profession {name} is {a} {value}."),
        "What is the occupation of {name}?",
    ),
    Attribute(
        "employer",
        "person",
        "company",
        1,
        ("{name} is employed by {value}.", "{name} works for the company {value}."),
        "Which company does {name} work for?",
    ),
    Attribute(
        "residence",
        "person",
        "city",
        1,
        ("{name} lives in {value}.", "{name} has a home in the city of {value}."),
        "In which city does {name} live?",
    ),
    Attribute(
        "founded",
        "company",
        "year",
        0,
        ("{name} was founded in {value}.", "The company {name} was established in {value}."),
        "In which year was {name} founded?",
        "In which year was the employer of {name} founded?",
    ),
    Attribute(
        "industry",
        "company",
        "industry",
        0,
        ("{name} operates in the {value} industry.", "{name} is a firm in {value}."),
        "In which industry does {name} operate?",
        "In which industry does the employer of {name} operate?",
    ),
    Attribute(
        "headquarters",
        "company",
        "city",
        1,
        ("{name} is headquartered in {value}.", "The head office of {name} is in {value}."),
        "Where is {name} headquartered?",
        "Where is the employer of {name} headquartered?",
    ),
)
ATTRIBUTE_BY_NAME: dict[str, Attribute] = {a.name: a for a in ATTRIBUTES}

# Fact-free sentences that pad passages to DPR-like length (30–60 words). They mention only the
# entity, so they can never answer anything.
_FILLERS: dict[str, tuple[str, ...]] = {
    "person": (
        "Colleagues describe {name} as patient and precise.",
        "{name} enjoys long walks and quiet evenings with friends.",
        "In interviews {name} rarely talks about private matters.",
        "{name} has given several public talks over the years.",
        "Many people remember {name} for a generous and calm manner.",
        "{name} keeps a small garden and a large collection of books.",
        "Early in life {name} showed a strong interest in music and maps.",
        "{name} is known for careful work and a dry sense of humour.",
    ),
    "company": (
        "{name} has grown steadily since its early days.",
        "The staff of {name} often speak of a friendly working culture.",
        "{name} publishes a short annual report for its partners.",
        "Over the years {name} has opened several regional offices.",
        "{name} is owned by a small group of private investors.",
        "Customers of {name} praise its reliable service.",
        "{name} sponsors a number of local sports clubs.",
    ),
}

_RESERVED = (
    {
        w.lower().strip(".,?")
        for a in ATTRIBUTES
        for s in (*a.sentences, a.question, a.two_hop_question or "")
        for w in s.split()
    }
    | {w.lower().strip(".,?") for fs in _FILLERS.values() for s in fs for w in s.split()}
    | {*OCCUPATIONS, *INDUSTRIES, "city", "group", "doc", "title", "question", "answer"}
)


@dataclass(frozen=True)
class Entity:
    """A fictional person or company with its attribute values and name aliases."""

    id: str
    kind: Literal["person", "company"]
    name: str
    aliases: tuple[str, ...]
    attributes: dict[str, str]
    known: bool


@dataclass(frozen=True)
class Passage:
    """A DPR-style passage stating some of one entity's attributes."""

    id: str
    title: str
    text: str
    entity_id: str
    attributes: tuple[str, ...]


@dataclass(frozen=True)
class Judgement:
    """A passage judged for a question: its role, the hop it serves (positives) and its utility."""

    passage_id: str
    role: Role
    hop: int | None
    utility: float


@dataclass(frozen=True)
class Question:
    """A single-hop or two-hop question with its gold answers (canonical first, then aliases)."""

    id: str
    text: str
    type: QuestionType
    attribute: str
    entity_id: str
    answers: tuple[str, ...]
    known: bool
    n_hops: int
    judgements: tuple[Judgement, ...]

    @property
    def positives(self) -> tuple[Judgement, ...]:
        return tuple(j for j in self.judgements if j.role == "positive")


@dataclass
class World:
    """A generated world: entities, corpus passages and judged questions."""

    seed: int
    pools: Pools
    entities: list[Entity]
    passages: list[Passage]
    questions: list[Question]
    entity_by_id: dict[str, Entity] = field(init=False, repr=False)
    passage_by_id: dict[str, Passage] = field(init=False, repr=False)

    _by_entity: dict[str, list[Passage]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.entity_by_id = {e.id: e for e in self.entities}
        self.passage_by_id = {p.id: p for p in self.passages}
        self._by_entity = {}
        for p in self.passages:
            self._by_entity.setdefault(p.entity_id, []).append(p)

    def passages_of(self, entity_id: str) -> list[Passage]:
        """The passages about one entity, in passage-group order."""
        return list(self._by_entity.get(entity_id, ()))

    def passage_stating(self, entity_id: str, attribute: str) -> Passage:
        """The passage of ``entity_id`` that states ``attribute``."""
        for p in self.passages_of(entity_id):
            if attribute in p.attributes:
                return p
        raise KeyError(f"entity {entity_id} has no passage stating {attribute!r}")


# --- aliases -----------------------------------------------------------------------------------
def value_aliases(pool: str, value: str) -> tuple[str, ...]:
    """Gold answer strings for one attribute value: the canonical form first, then its aliases."""
    if pool == "occupation":
        return (value, *OCCUPATIONS[value])
    if pool == "industry":
        return (value, *INDUSTRIES[value])
    if pool == "city":
        return (value, f"{value} City")
    if pool == "company":
        return (value, f"{value} Group")
    return (value,)


def _person_aliases(first: str, surname: str) -> tuple[str, ...]:
    return (f"{first[0]}. {surname}", surname)


# --- generation --------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorldSize:
    """How big a world is: entity counts, the known share and the questions drawn."""

    n_persons: int
    n_companies: int
    known_share: float
    n_two_hop: int
    n_random_negatives: int = 2


SIZES: dict[str, WorldSize] = {
    "default": WorldSize(n_persons=400, n_companies=100, known_share=0.4, n_two_hop=150),
    "ci": WorldSize(n_persons=80, n_companies=20, known_share=0.4, n_two_hop=30),
}


def _article(word: str) -> str:
    return "an" if word[0].lower() in "aeiou" else "a"


def _build_passage(rng: random.Random, entity: Entity, group: int, pid: str) -> Passage:
    attrs = [a for a in ATTRIBUTES if a.kind == entity.kind and a.group == group]
    facts = [
        rng.choice(a.sentences).format(name=entity.name, value=v, a=_article(v))
        for a in attrs
        for v in (entity.attributes[a.name],)
    ]
    fillers = list(_FILLERS[entity.kind])
    rng.shuffle(fillers)
    sentences = facts[:]
    # Pad with fact-free sentences to at least 24 words, so a passage reads like a short DPR
    # passage (shorter than DPR's 100 words: every token costs the CPU-trained reader time).
    while len(" ".join(sentences).split()) < 24 or len(sentences) < len(facts) + 1:
        sentences.append(fillers.pop().format(name=entity.name))
    rng.shuffle(sentences)
    return Passage(
        id=pid,
        title=entity.name,
        text=" ".join(sentences),
        entity_id=entity.id,
        attributes=tuple(a.name for a in attrs),
    )


def _make_entities(
    rng: random.Random,
    pools: Pools,
    size: WorldSize,
    prefix: str,
    exclude_names: set[str],
    all_unknown: bool,
) -> list[Entity]:
    companies: list[Entity] = []
    for i, cname in enumerate(rng.sample(pools.companies, size.n_companies)):
        attrs = {
            "founded": rng.choice(YEARS),
            "industry": rng.choice(sorted(INDUSTRIES)),
            "headquarters": rng.choice(pools.cities),
        }
        companies.append(
            Entity(
                id=f"{prefix}c{i:04d}",
                kind="company",
                name=cname,
                aliases=(f"{cname} Group",),
                attributes=attrs,
                known=False,
            )
        )
    persons: list[Entity] = []
    # Surname families of two or three people give every person a same-surname hard negative.
    surnames = rng.sample(pools.surnames, size.n_persons // 2)
    names: list[tuple[str, str]] = []
    family = 0
    while len(names) < size.n_persons:
        surname = surnames[family % len(surnames)]
        first = rng.choice(pools.first_names)
        if f"{first} {surname}" not in exclude_names and (first, surname) not in names:
            names.append((first, surname))
            family += 1
    for i, (first, surname) in enumerate(names):
        attrs = {
            "birthplace": rng.choice(pools.cities),
            "occupation": rng.choice(sorted(OCCUPATIONS)),
            "employer": rng.choice(companies).name,
            "residence": rng.choice(pools.cities),
        }
        persons.append(
            Entity(
                id=f"{prefix}p{i:04d}",
                kind="person",
                name=f"{first} {surname}",
                aliases=_person_aliases(first, surname),
                attributes=attrs,
                known=False,
            )
        )
    entities = persons + companies
    if all_unknown:
        return entities
    known_ids = {e.id for e in rng.sample(persons, round(size.known_share * len(persons)))}
    known_ids |= {e.id for e in rng.sample(companies, round(size.known_share * len(companies)))}
    return [
        Entity(e.id, e.kind, e.name, e.aliases, e.attributes, e.id in known_ids) for e in entities
    ]


def _surname(entity: Entity) -> str:
    return entity.name.split()[-1]


def _negatives(
    rng: random.Random,
    passages: Sequence[Passage],
    by_entity: dict[str, list[Passage]],
    answers: Sequence[str],
    *,
    relatives: Sequence[Entity],
    relative_attribute: str,
    subject: Entity,
    asked: str,
    avoid: set[str],
    n_random: int,
) -> list[Judgement]:
    """Hard and random negatives for one question; none contains a gold answer string.

    The surname negative is a same-surname relative's passage stating ``relative_attribute``;
    the attribute negative is ``subject``'s passage that does not state ``asked``. A candidate
    that happens to mention a gold answer (say, a relative born in the same city) is skipped.
    """

    def clean(p: Passage) -> bool:
        return not has_answer(p.text, answers)

    out: list[Judgement] = []
    for other in rng.sample(list(relatives), len(relatives)):
        p = next(p for p in by_entity[other.id] if relative_attribute in p.attributes)
        if clean(p):
            out.append(Judgement(p.id, "hard_negative_surname", None, 0.0))
            break
    p = next(p for p in by_entity[subject.id] if asked not in p.attributes)
    if clean(p):
        out.append(Judgement(p.id, "hard_negative_attribute", None, 0.0))
    used = {j.passage_id for j in out}
    candidates = [p for p in passages if p.id not in used and p.entity_id not in avoid]
    # Seeded draws until enough clean ones: checking only the drawn passages keeps this cheap.
    while len(out) - len(used) < n_random and candidates:
        p = candidates.pop(rng.randrange(len(candidates)))
        if clean(p):
            out.append(Judgement(p.id, "random_negative", None, 0.0))
    return out


def _build_world(
    seed: int,
    pools: Pools,
    size: WorldSize,
    prefix: str,
    exclude_names: set[str],
    all_unknown: bool,
    all_questions: bool,
) -> World:
    rng = random.Random(f"world:{prefix}:{seed}")
    entities = _make_entities(rng, pools, size, prefix, exclude_names, all_unknown)
    passages: list[Passage] = []
    by_entity: dict[str, list[Passage]] = {}
    for e in entities:
        for g in (0, 1):
            p = _build_passage(rng, e, g, f"{e.id}-{g}")
            passages.append(p)
            by_entity.setdefault(e.id, []).append(p)
    persons = [e for e in entities if e.kind == "person"]
    companies = {e.name: e for e in entities if e.kind == "company"}
    families: dict[str, list[Entity]] = {}
    for e in persons:
        families.setdefault(_surname(e), []).append(e)

    questions: list[Question] = []
    single = [(e, a) for e in entities for a in ATTRIBUTES if a.kind == e.kind]
    if not all_questions:
        # One single-hop question per entity keeps the query set small but covers every kind.
        single = [(e, rng.choice([a for a in ATTRIBUTES if a.kind == e.kind])) for e in entities]
    for e, a in single:
        positive = next(p for p in by_entity[e.id] if a.name in p.attributes)
        # Companies have no surname: their only hard negative is their other passage.
        same = (
            [o for o in families.get(_surname(e), []) if o.id != e.id] if e.kind == "person" else []
        )
        answers = value_aliases(a.pool, e.attributes[a.name])
        negs = _negatives(
            rng,
            passages,
            by_entity,
            answers,
            relatives=same,
            relative_attribute=a.name,
            subject=e,
            asked=a.name,
            avoid={e.id},
            n_random=size.n_random_negatives,
        )
        utility = 0.0 if e.known else 1.0
        questions.append(
            Question(
                id=f"{prefix}q{len(questions):05d}",
                text=a.question.format(name=e.name),
                type="single_hop",
                attribute=a.name,
                entity_id=e.id,
                answers=answers,
                known=e.known,
                n_hops=1,
                judgements=(Judgement(positive.id, "positive", 1, utility), *negs),
            )
        )

    # Two-hop questions go through the person's employer. Only people and companies that are both
    # unknown are asked, so each hop's passage carries half of the needed information (1/n_hops).
    candidates = [
        e for e in persons if not e.known and not companies[e.attributes["employer"]].known
    ]
    two_hop_attrs = [a for a in ATTRIBUTES if a.two_hop_question]
    chosen = (
        candidates
        if all_questions
        else rng.sample(candidates, min(size.n_two_hop, len(candidates)))
    )
    for e in chosen:
        a = rng.choice(two_hop_attrs)
        company = companies[e.attributes["employer"]]
        hop1 = next(p for p in by_entity[e.id] if "employer" in p.attributes)
        hop2 = next(p for p in by_entity[company.id] if a.name in p.attributes)
        same = [o for o in families.get(_surname(e), []) if o.id != e.id]
        answers = value_aliases(a.pool, company.attributes[a.name])
        # Twice the random negatives of a single-hop question: there are two positives to balance.
        negs = _negatives(
            rng,
            passages,
            by_entity,
            answers,
            relatives=same,
            relative_attribute="employer",
            subject=company,
            asked=a.name,
            avoid={e.id, company.id},
            n_random=2 * size.n_random_negatives,
        )
        questions.append(
            Question(
                id=f"{prefix}q{len(questions):05d}",
                text=a.two_hop_question.format(name=e.name),
                type="two_hop",
                attribute=f"employer.{a.name}",
                entity_id=e.id,
                answers=answers,
                known=False,
                n_hops=2,
                judgements=(
                    Judgement(hop1.id, "positive", 1, 0.5),
                    Judgement(hop2.id, "positive", 2, 0.5),
                    *negs,
                ),
            )
        )
    return World(seed=seed, pools=pools, entities=entities, passages=passages, questions=questions)


def make_world(
    seed: int = 0, size: str | WorldSize = "default", pools: Pools | None = None
) -> World:
    """Build the evaluation world for ``seed``: entities, corpus, questions and ground truth.

    ``size`` is a preset name from :data:`SIZES` or a :class:`WorldSize`. The same seed always
    gives the same world.
    """
    spec = SIZES[size] if isinstance(size, str) else size
    return _build_world(
        seed, pools or make_pools(seed), spec, "", set(), all_unknown=False, all_questions=False
    )


def make_reading_world(world: World, size: str | WorldSize = "default", draw: int = 0) -> World:
    """Build a disjoint world the reader learns reading comprehension on.

    It shares ``world``'s value pools (so every answer the reader must copy at test time is a
    token it has produced in training) but no person, and asks every attribute of every entity,
    all unknown, with every two-hop question its people allow. Each ``draw`` is a different
    world with the same properties: a reader that sees a new one every few thousand examples
    cannot memorise reading-world answers and must learn to read them off the context.
    """
    spec = SIZES[size] if isinstance(size, str) else size
    return _build_world(
        world.seed,
        world.pools,
        spec,
        f"rc{draw}-",
        {e.name for e in world.entities if e.kind == "person"},
        all_unknown=True,
        all_questions=True,
    )


# --- writing -----------------------------------------------------------------------------------
def _write_lines(path: Path, lines: Iterable[str]) -> None:
    write_text_atomic(path, "".join(f"{line}\n" for line in lines))


def _jsonl(rows: Iterable[dict]) -> Iterable[str]:
    return (json.dumps(r, ensure_ascii=False) for r in rows)


def write_world(world: World, out_dir: str | Path) -> Path:
    """Write ``world`` as a BEIR folder plus its ground-truth files; return the folder.

    Files (schemas in ``docs/synthetic_world.md``): ``corpus.jsonl``, ``queries.jsonl``,
    ``qrels/test.tsv`` (BEIR), ``questions.jsonl``, ``utility.jsonl``, ``entities.jsonl`` and
    ``world.json``. Each file is written atomically.
    """
    out = Path(out_dir)
    _write_lines(
        out / "corpus.jsonl",
        _jsonl({"_id": p.id, "title": p.title, "text": p.text} for p in world.passages),
    )
    _write_lines(
        out / "queries.jsonl", _jsonl({"_id": q.id, "text": q.text} for q in world.questions)
    )
    _write_lines(
        out / "qrels" / "test.tsv",
        [
            "query-id\tcorpus-id\tscore",
            *(f"{q.id}\t{j.passage_id}\t1" for q in world.questions for j in q.positives),
        ],
    )
    _write_lines(
        out / "questions.jsonl",
        _jsonl(
            {
                "_id": q.id,
                "text": q.text,
                "type": q.type,
                "attribute": q.attribute,
                "entity_id": q.entity_id,
                "answers": list(q.answers),
                "known": q.known,
                "n_hops": q.n_hops,
            }
            for q in world.questions
        ),
    )
    _write_lines(
        out / "utility.jsonl",
        _jsonl(
            {
                "query-id": q.id,
                "corpus-id": j.passage_id,
                "role": j.role,
                "hop": j.hop,
                "utility": j.utility,
            }
            for q in world.questions
            for j in q.judgements
        ),
    )
    _write_lines(
        out / "entities.jsonl",
        _jsonl(
            {
                "_id": e.id,
                "kind": e.kind,
                "name": e.name,
                "aliases": list(e.aliases),
                "attributes": e.attributes,
                "known": e.known,
            }
            for e in world.entities
        ),
    )
    counts = {
        "entities": len(world.entities),
        "passages": len(world.passages),
        "questions": len(world.questions),
        "single_hop": sum(q.type == "single_hop" for q in world.questions),
        "two_hop": sum(q.type == "two_hop" for q in world.questions),
        "known_entities": sum(e.known for e in world.entities),
    }
    _write_lines(
        out / "world.json",
        [
            json.dumps(
                {"schema_version": SCHEMA_VERSION, "seed": world.seed, "counts": counts}, indent=2
            )
        ],
    )
    return out
