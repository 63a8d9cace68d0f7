"""Labelled answer pairs for an answer-equivalence NLI model, generated from templates and word lists.

Nothing here comes from a downloaded data set or from an evaluation set (SQuAD is one): the values
are drawn from the word lists below — generic or made-up names, never an entity, phrase or error
read in SQuAD or in a model's answers on it (``tests/embedded/test_answer_pairs_sources.py`` checks
the composed names against the SQuAD files) — and written in the surface forms real answers take. Each pair is two
answers to one question, labelled as SePer's clustering reads NLI labels:

* ``entailment`` — the same answer: ``identical`` (the same string up to case, articles and
  punctuation), ``alias`` (an abbreviation, another name, another number or date format, a part
  of a date, an approximate "about …", a qualifier or detail added: :func:`elaboration`) and
  ``sentence`` (a sentence
  stating the answer against the bare answer: "The capital of France is Paris." vs "Paris");
* ``contradiction`` — another answer of the same type: ``other_value`` (another year, city,
  person …) and ``partial_overlap`` (sharing words or digits: "Paris" vs "Paris, Texas",
  "1887" vs "1787", "John Smith" vs "Mary Smith", "5 km" vs "5 miles");
* ``neutral`` — ``unrelated``: an answer of another type ("Paris" vs "1887"); ``non_answer``:
  an answer against a text that answers nothing (:func:`non_answer`) — the question restated or
  continued, a sentence cut off before its answer, a sentence about the question's subject
  without the answer, a refusal, an entity copied from the question. A small LLM's samples are
  full of these, and an NLI that calls them equivalent to the gold answer inflates SePer.

Every answer type (:class:`AnswerType`) knows how to draw a value, write it in an equivalent
form, change it into a hard non-equivalent, and which questions ask for it. :func:`answer_pairs`
is deterministic for a given ``random.Random``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ragutil_dagster.metrics.answers import normalize_answer
from ragutil_dagster.metrics.seper import nli_text

ENTAILMENT, NEUTRAL, CONTRADICTION = "entailment", "neutral", "contradiction"
CATEGORY_LABELS: dict[str, str] = {
    "identical": ENTAILMENT,
    "alias": ENTAILMENT,
    "extension": ENTAILMENT,
    "sentence": ENTAILMENT,
    "other_value": CONTRADICTION,
    "partial_overlap": CONTRADICTION,
    "unrelated": NEUTRAL,
    "non_answer": NEUTRAL,
}
# Shares of the categories in a stream of pairs: the three labels about equally often.
CATEGORY_SHARES: dict[str, float] = {
    "identical": 0.06,
    "alias": 0.16,
    "extension": 0.11,
    "sentence": 0.10,
    "other_value": 0.12,
    "partial_overlap": 0.12,
    "unrelated": 0.09,
    "non_answer": 0.24,
}

# --- word lists --------------------------------------------------------------------------------
# (country, its other names, regions of it)
COUNTRIES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    (
        "United States",
        ("USA", "U.S.", "US", "America", "United States of America"),
        ("Texas", "California", "Ohio", "Georgia", "Maine", "Oregon"),
    ),
    (
        "United Kingdom",
        ("UK", "U.K.", "Britain", "Great Britain"),
        ("England", "Scotland", "Wales"),
    ),
    ("France", ("French Republic",), ("Normandy", "Brittany", "Provence")),
    ("Germany", ("Federal Republic of Germany",), ("Bavaria", "Saxony", "Hesse")),
    ("Canada", (), ("Ontario", "Quebec", "Alberta")),
    ("Australia", ("Commonwealth of Australia",), ("Queensland", "Tasmania", "Western Australia")),
    ("Italy", ("Italian Republic",), ("Tuscany", "Sicily", "Lombardy")),
    ("Spain", ("Kingdom of Spain",), ("Catalonia", "Andalusia", "Galicia")),
    ("Japan", (), ("Hokkaido", "Kyushu")),
    ("China", ("PRC", "People's Republic of China"), ("Sichuan", "Yunnan", "Guangdong")),
    ("India", ("Republic of India",), ("Kerala", "Punjab", "Gujarat")),
    ("Brazil", (), ("Bahia", "Minas Gerais")),
    ("Russia", ("Russian Federation",), ("Siberia", "Tatarstan")),
    ("Netherlands", ("Holland", "the Netherlands"), ("Zeeland", "Friesland")),
    ("Mexico", ("United Mexican States",), ("Sonora", "Yucatan", "Jalisco")),
    ("Egypt", (), ("Sinai",)),
    ("Ghana", (), ("Ashanti",)),
    ("Norway", (), ("Finnmark",)),
    ("Portugal", ("Portuguese Republic",), ("Algarve", "Alentejo")),
    ("Argentina", (), ("Patagonia", "Mendoza")),
)
# (city, its country, its other names)
CITIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Paris", "France", ()),
    ("Lyon", "France", ()),
    ("Marseille", "France", ("Marseilles",)),
    ("London", "United Kingdom", ()),
    ("Manchester", "United Kingdom", ()),
    ("Edinburgh", "United Kingdom", ()),
    ("Berlin", "Germany", ()),
    ("Munich", "Germany", ("München",)),
    ("Hamburg", "Germany", ()),
    ("New York", "United States", ("New York City", "NYC")),
    ("Los Angeles", "United States", ("LA", "L.A.")),
    ("Chicago", "United States", ()),
    ("Boston", "United States", ()),
    ("San Francisco", "United States", ("SF",)),
    ("Seattle", "United States", ()),
    ("Toronto", "Canada", ()),
    ("Montreal", "Canada", ("Montréal",)),
    ("Sydney", "Australia", ()),
    ("Melbourne", "Australia", ()),
    ("Rome", "Italy", ("Roma",)),
    ("Milan", "Italy", ("Milano",)),
    ("Madrid", "Spain", ()),
    ("Barcelona", "Spain", ()),
    ("Tokyo", "Japan", ()),
    ("Osaka", "Japan", ()),
    ("Beijing", "China", ("Peking",)),
    ("Shanghai", "China", ()),
    ("Mumbai", "India", ("Bombay",)),
    ("Delhi", "India", ()),
    ("Rio de Janeiro", "Brazil", ("Rio",)),
    ("Moscow", "Russia", ()),
    ("Saint Petersburg", "Russia", ("St. Petersburg", "Leningrad")),
    ("Amsterdam", "Netherlands", ()),
    ("Mexico City", "Mexico", ()),
    ("Cairo", "Egypt", ()),
    ("Accra", "Ghana", ()),
    ("Oslo", "Norway", ()),
    ("Lisbon", "Portugal", ("Lisboa",)),
    ("Buenos Aires", "Argentina", ()),
    ("Athens", "Greece", ()),
    ("Vienna", "Austria", ("Wien",)),
)
FIRST_NAMES = (
    "John",
    "Mary",
    "James",
    "Elizabeth",
    "Robert",
    "Anna",
    "Walter",
    "Margaret",
    "Charles",
    "Sarah",
    "George",
    "Helen",
    "Thomas",
    "Alice",
    "Henry",
    "Catherine",
    "Edward",
    "Emma",
    "Richard",
    "Julia",
    "Peter",
    "Laura",
    "David",
    "Maria",
    "Frank",
    "Clara",
    "Samuel",
    "Louise",
    "Arthur",
    "Grace",
)
# Surnames: common ones and made-up ones ("Varnell", "Quillfeather"), so that the names the
# generator composes are nobody's in particular.
SURNAMES = (
    "Smith",
    "Brown",
    "Miller",
    "Hartwell",
    "Varnell",
    "Okafor",
    "Lindqvist",
    "Marchetti",
    "Dunmore",
    "Pellham",
    "Quillfeather",
    "Ashcombe",
    "Brannigan",
    "Castellane",
    "Dovecote",
    "Ellsworth",
    "Fairbrook",
    "Grendall",
    "Holloway",
    "Ibsworth",
    "Jarrow",
    "Kettering",
    "Larkspur",
    "Merriweather",
    "Norbury",
    "Ollerton",
    "Penhallow",
    "Redgrave",
    "Stanwick",
    "Thornbury",
    "Umberley",
    "Vexley",
    "Whitcombe",
    "Yardley",
    "Fischer",
    "Weber",
    "Rossi",
    "Tanaka",
    "Kowalski",
    "Novak",
)
TITLES = ("Dr.", "Professor", "Sir", "President", "General", "Senator")
ORG_ADJECTIVES = (
    "National",
    "International",
    "Royal",
    "American",
    "European",
    "Pacific",
    "Northern",
    "United",
    "Global",
    "Federal",
    "Central",
    "Atlantic",
    "Eastern",
)
ORG_SUBJECTS = (
    "Science",
    "Health",
    "Trade",
    "Energy",
    "Railway",
    "Aviation",
    "Textile",
    "Maritime",
    "Steel",
    "Mining",
    "Orchard",
    "Pottery",
    "Chemical",
    "Film",
    "Rowing",
    "Lighthouse",
    "Water",
    "Telephone",
)
ORG_KINDS = (
    "Organization",
    "Institute",
    "Association",
    "Company",
    "Corporation",
    "Trust",
    "Agency",
    "Foundation",
    "Society",
    "Guild",
    "Bank",
    "League",
    "Board",
)
ORG_KIND_ABBREVIATIONS = {
    "Company": "Co.",
    "Corporation": "Corp.",
    "Association": "Assn.",
    "Institute": "Inst.",
}
# Categories of common nouns; the tuples in each are one thing's names.
THINGS: dict[str, tuple[tuple[str, ...], ...]] = {
    "occupation": (
        ("physician", "doctor", "medical doctor"),
        ("lawyer", "attorney"),
        ("carpenter",),
        ("journalist", "reporter"),
        ("teacher", "schoolteacher"),
        ("pilot", "aviator"),
        ("sailor", "seaman"),
        ("chemist",),
        ("farmer",),
        ("architect",),
        ("engineer",),
        ("painter", "artist"),
        ("surgeon",),
        ("economist",),
        ("astronomer",),
        ("police officer", "policeman"),
    ),
    "material": (
        ("gold",),
        ("silver",),
        ("copper",),
        ("iron",),
        ("steel",),
        ("marble",),
        ("granite",),
        ("wood", "timber"),
        ("glass",),
        ("bronze",),
        ("limestone",),
        ("aluminium", "aluminum"),
        ("clay",),
        ("concrete",),
    ),
    "language": (
        ("English", "the English language"),
        ("French", "the French language"),
        ("German",),
        ("Spanish", "Castilian"),
        ("Latin",),
        ("Greek",),
        ("Arabic",),
        ("Mandarin", "Mandarin Chinese"),
        ("Portuguese",),
        ("Russian",),
        ("Hindi",),
        ("Japanese",),
        ("Dutch",),
        ("Swahili", "Kiswahili"),
    ),
    "sport": (
        ("football", "soccer", "association football"),
        ("basketball",),
        ("tennis",),
        ("cricket",),
        ("rugby",),
        ("baseball",),
        ("golf",),
        ("ice hockey", "hockey"),
        ("swimming",),
        ("cycling",),
        ("boxing",),
        ("volleyball",),
    ),
    "animal": (
        ("horse",),
        ("dog", "hound"),
        ("cat",),
        ("elephant",),
        ("lion",),
        ("wolf",),
        ("eagle",),
        ("salmon",),
        ("whale",),
        ("bear",),
        ("tiger",),
        ("deer",),
    ),
    "instrument": (
        ("piano", "pianoforte"),
        ("violin", "fiddle"),
        ("guitar",),
        ("cello",),
        ("flute",),
        ("trumpet",),
        ("drums",),
        ("organ",),
        ("harp",),
        ("clarinet",),
    ),
}
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
MONTH_ABBREVIATIONS = (
    "Jan.",
    "Feb.",
    "Mar.",
    "Apr.",
    "May",
    "Jun.",
    "Jul.",
    "Aug.",
    "Sept.",
    "Oct.",
    "Nov.",
    "Dec.",
)
# (unit symbol, names; the value reads "5 km", "5 kilometres", "5 kilometers")
UNITS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("km", ("kilometres", "kilometers")),
    ("m", ("metres", "meters")),
    ("kg", ("kilograms", "kilos")),
    ("mi", ("miles",)),
    ("ft", ("feet",)),
    ("lb", ("pounds",)),
    ("°C", ("degrees Celsius", "degrees C")),
    ("km²", ("square kilometres", "square kilometers")),
    ("t", ("tonnes", "metric tons")),
    ("ha", ("hectares",)),
)
CURRENCIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("$", ("dollars", "US dollars")),
    ("£", ("pounds sterling", "pounds")),
    ("€", ("euros",)),
)
SCALES = (("thousand", 1_000), ("million", 1_000_000), ("billion", 1_000_000_000))
# Noun phrases of no particular type ("gradual thrift", "coastal rivalry"): real answers are
# often such spans, and annotators cut them at different words.
PHRASE_ADJECTIVES = (
    "coastal",
    "upland",
    "tacit",
    "mercantile",
    "seasonal",
    "clerical",
    "informal",
    "rural",
    "provincial",
    "early",
    "northern",
    "ancient",
    "hasty",
    "quiet",
    "gradual",
    "orderly",
    "sudden",
    "severe",
    "lasting",
    "partial",
)
PHRASE_NOUNS = (
    "thrift",
    "rivalry",
    "patronage",
    "stagnation",
    "devotion",
    "surveying",
    "bartering",
    "dissent",
    "upkeep",
    "craftsmanship",
    "zoning",
    "kinship",
    "tithing",
    "drainage",
    "austerity",
    "quarrying",
    "folklore",
    "guardianship",
    "seclusion",
    "stewardship",
)
# Sports teams: a made-up place and a nickname ("Brackwater Otters", "the Otters").
TEAM_NICKNAMES = (
    "Otters",
    "Herons",
    "Comets",
    "Foxes",
    "Badgers",
    "Stags",
    "Ravens",
    "Wolves",
    "Hornets",
    "Mariners",
    "Pilgrims",
    "Quakers",
    "Thunder",
    "Blizzards",
    "Lynx",
    "Millers",
    "Ploughmen",
    "Harriers",
    "Kestrels",
    "Voyagers",
)
TEAM_PLACES = (
    "Brackwater",
    "Eastmoor",
    "Kelton",
    "Marrowby",
    "Port Ellery",
    "Stonebridge",
    "Hollin Vale",
    "Ashgrove",
    "Fernleigh",
    "Redcliffe Bay",
    "Wexmoor",
    "Dunhallow",
    "Larchfield",
    "North Haverly",
    "Glenrock",
    "Saltmarsh",
    "Oakhurst",
    "Cinder Falls",
    "Whitlow",
    "Caddon",
)
# Purposes and methods ("to reduce taxes", "by reducing taxes"): why / how answers.
VERBS = (
    ("reduce", "reducing"),
    ("increase", "increasing"),
    ("protect", "protecting"),
    ("build", "building"),
    ("expand", "expanding"),
    ("control", "controlling"),
    ("avoid", "avoiding"),
    ("improve", "improving"),
    ("defend", "defending"),
    ("collect", "collecting"),
    ("limit", "limiting"),
    ("support", "supporting"),
    ("replace", "replacing"),
    ("study", "studying"),
)
VERB_OBJECTS = (
    "taxes",
    "the toll roads",
    "trade routes",
    "the grain stores",
    "the harbour",
    "its borders",
    "the church",
    "food supplies",
    "water quality",
    "the economy",
    "the old bridge",
    "local farmers",
    "the railway network",
    "foreign influence",
    "the power of the king",
)
# What annotators add around the same answer: a qualifier before, a detail after.
ELABORATION_PREFIXES = (
    "only",
    "nearly",
    "almost",
    "mainly",
    "largely",
    "the famous",
    "the so-called",
    "a form of",
    "a team from",
    "what is known as",
    "a group called",
    "the new",
    "at least",
    "more than",
    "some",
    "the local",
    "his",
    "their",
)
ELABORATION_SUFFIXES = (
    "at the time",
    "in total",
    "in the region",
    "during the war",
    "according to the records",
    "and its surroundings",
    "of the period",
    "in the north",
    "by the end of the century",
    # trailing clauses: the answer span runs on into its sentence
    ", which was later rebuilt",
    ", who led the campaign",
    ", when the war ended",
    "because of the new law",
    ", as the records show",
    "after a long debate",
    ", the largest of its kind",
    ", despite opposition",
    "that year",
    "and the surrounding area",
    ", which is still in use today",
    "under the new government",
    "with the help of its allies",
)


# Words a span runs on with when annotators mark more of the sentence ("copper kept within the old
# workshop" vs "copper", "somewhere in Norway near an unknown harbour" vs "Norway").
EXTENSION_PARTICIPLES = (
    "found",
    "contained",
    "located",
    "used",
    "built",
    "held",
    "kept",
    "described",
    "produced",
    "seen",
    "recorded",
    "known",
    "made",
    "placed",
)
EXTENSION_PREPOSITIONS = (
    "in",
    "within",
    "of",
    "from",
    "near",
    "across",
    "during",
    "under",
    "at",
    "along",
    "throughout",
    "inside",
    "around",
    "for",
)
EXTENSION_ADJECTIVES = (
    "whole",
    "northern",
    "local",
    "old",
    "entire",
    "surrounding",
    "same",
    "main",
    "upper",
    "eastern",
    "new",
    "relevant",
    "unknown",
    "first",
)
EXTENSION_NOUNS = (
    "workshop",
    "region",
    "garden",
    "river",
    "coast",
    "empire",
    "church",
    "council",
    "army",
    "valley",
    "market",
    "harbour",
    "parliament",
    "village",
    "court",
    "province",
    "colony",
    "fleet",
    "capital",
    "country",
    "century",
    "period",
    "treaty",
    "committee",
    "location",
    "lines",
    "island",
    "system",
)
EXTENSION_PLURALS = (
    "soldiers",
    "people",
    "workers",
    "residents",
    "ships",
    "students",
    "troops",
    "members",
    "visitors",
    "copies",
    "settlers",
    "buildings",
)
EXTENSION_PREFIXES = (
    "somewhere in",
    "the relevant",
    "mostly",
    "his",
    "her",
    "its",
    "the main",
    "around",
    "both",
    "the use of",
    "the idea of",
    "the",
)
RELATIVE_VERBS = (
    "ruled",
    "joined",
    "crossed",
    "replaced",
    "defeated",
    "built",
    "founded",
    "described",
    "opposed",
    "supported",
    "financed",
    "surrounded",
)


# --- numbers -----------------------------------------------------------------------------------
ONES = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
)
TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")


def number_words(n: int, rng: random.Random | None = None) -> str:
    """English words of 0 ≤ n < 1,000,000 ("forty-five", "three hundred and twelve", "two
    thousand five hundred"); ``rng`` chooses whether "and" follows a hundred (British usage)."""
    if n < 20:
        return ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return TENS[tens] + (f"-{ONES[ones]}" if ones else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        joiner = " and " if rng is not None and rng.random() < 0.5 else " "
        return f"{ONES[hundreds]} hundred" + (f"{joiner}{number_words(rest)}" if rest else "")
    thousands, rest = divmod(n, 1000)
    return f"{number_words(thousands, rng)} thousand" + (
        f" {number_words(rest, rng)}" if rest else ""
    )


def _with_commas(n: int) -> str:
    return f"{n:,}"


def _number_forms(n: int) -> list[str]:
    """Equivalent spellings of the count ``n``."""
    forms = [str(n), _with_commas(n)]
    if n < 100 or (n < 1_000_000 and n % 100 == 0) or n < 1000:
        forms.append(number_words(n))
    for word, scale in SCALES:
        if n >= scale and n % (scale // 10) == 0:
            value = n / scale
            forms.append(f"{value:g} {word}")
            if value == int(value) and value < 100:
                forms.append(f"{number_words(int(value))} {word}")
    return forms


def _draw_count(rng: random.Random) -> int:
    kind = rng.random()
    if kind < 0.35:
        return rng.randint(2, 99)
    if kind < 0.7:
        return rng.randint(100, 99_999)
    scale = rng.choice(SCALES)[1]
    return rng.randint(11, 95) * scale // 10


def _other_count(n: int, rng: random.Random) -> int:
    """A different count close to ``n`` in value or in digits."""
    while True:
        kind = rng.random()
        if kind < 0.35:
            m = n + rng.choice((-1, 1)) * rng.randint(1, max(1, n // 5))
        elif kind < 0.6:
            m = n * 10 if rng.random() < 0.5 else n // 10  # "15" vs "150"
        elif kind < 0.8:
            digits = list(str(n))
            i = rng.randrange(len(digits))
            digits[i] = rng.choice([d for d in "0123456789" if d != digits[i]])
            m = int("".join(digits))
        else:
            m = n * 1000 if n < 1_000_000 else n // 1000  # "3 million" vs "3 billion"
        if m != n and m > 0:
            return m


# --- answer types -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Question:
    """A question asking for a value of one type, a sentence stating the answer, and the names
    the question mentions (its subjects: a person, an organisation, a city, a year)."""

    text: str
    sentence: str  # "{answer}" marks where the answer goes
    subjects: tuple[str, ...] = ()


QuestionTemplates = tuple[tuple[str, str], ...]
"""(question, sentence stating the answer) pairs; slots {person}, {org}, {city}, {year}, and
{answer} in the sentence."""


def _asker(templates: QuestionTemplates) -> Callable[[random.Random], Question]:
    """Draws one of ``templates`` with its slots filled from the word lists."""

    def ask(rng: random.Random) -> Question:
        text, sentence = _pick(rng, templates)
        slots = {
            "person": _person_name(rng),
            "org": _organisation_name(rng),
            "city": _pick(rng, CITIES)[0],
            "year": rng.randint(1896, 2024),
        }
        subjects = tuple(str(value) for name, value in slots.items() if f"{{{name}}}" in text)
        return Question(text.format(**slots), sentence.format(**slots, answer="{answer}"), subjects)

    return ask


@dataclass(frozen=True)
class AnswerType:
    """One kind of answer: how to draw a value, write it again, change it, and ask for it.

    ``draw`` returns a value's canonical text and its equivalent forms; ``alias`` writes one of
    those forms (or another legitimate rewrite); ``other`` returns a different value of the type
    as text; ``overlap`` returns a different value sharing words or digits with it.
    """

    name: str
    draw: Callable[[random.Random], tuple[str, ...]]
    other: Callable[[tuple[str, ...], random.Random], str]
    overlap: Callable[[tuple[str, ...], random.Random], str]
    questions: Callable[[random.Random], Question]


def _pick(rng: random.Random, items: Sequence):
    return items[rng.randrange(len(items))]


def _person_name(rng: random.Random) -> str:
    return f"{_pick(rng, FIRST_NAMES)} {_pick(rng, SURNAMES)}"


def _organisation_name(rng: random.Random) -> str:
    return f"{_pick(rng, ORG_ADJECTIVES)} {_pick(rng, ORG_SUBJECTS)} {_pick(rng, ORG_KINDS)}"


def _country_of(city: str) -> tuple[str, tuple[str, ...], tuple[str, ...]] | None:
    country = next(c for name, c, _ in CITIES if name == city)
    return next((entry for entry in COUNTRIES if entry[0] == country), None)


# City
def _draw_city(rng: random.Random) -> tuple[str, ...]:
    city, country, others = _pick(rng, CITIES)
    forms = [city, *others, f"{city}, {country}", f"the city of {city}", f"in {city}"]
    entry = _country_of(city)
    if entry is not None:
        forms += [f"{city}, {alias}" for alias in entry[1][:2]]
    return tuple(forms)


def _other_city(forms: tuple[str, ...], rng: random.Random) -> str:
    same_country = [
        c for c, country, _ in CITIES if forms[0] != c and _country_of(c) == _country_of(forms[0])
    ]
    if same_country and rng.random() < 0.5:
        return _pick(rng, same_country)
    return _pick(rng, [c for c, _, _ in CITIES if c != forms[0]])


def _city_overlap(forms: tuple[str, ...], rng: random.Random) -> str:
    """The same name somewhere else ("Paris, Texas"), or a place named after the city."""
    city = forms[0]
    if rng.random() < 0.6:
        own = _country_of(city)
        country, _, regions = _pick(rng, [c for c in COUNTRIES if c is not own])
        return f"{city}, {_pick(rng, regions)}" if rng.random() < 0.7 else f"{city}, {country}"
    return f"{city} {_pick(rng, ('County', 'Airport', 'University', 'Street', 'Harbour', 'Bay'))}"


_CITY_QUESTIONS = (
    ("Where was {person} born?", "{person} was born in {answer}."),
    ("In which city is the {org} based?", "The {org} is based in {answer}."),
    ("Where did {person} die?", "{person} died in {answer}."),
    ("What city hosted the {year} games?", "The games were hosted by {answer}."),
    ("Where is the headquarters of the {org}?", "Its headquarters are in {answer}."),
)


# Country
def _draw_country(rng: random.Random) -> tuple[str, ...]:
    name, aliases, _ = _pick(rng, COUNTRIES)
    return (name, *aliases, f"the {name}" if " " in name else name)


def _other_country(forms: tuple[str, ...], rng: random.Random) -> str:
    return _pick(rng, [c for c, _, _ in COUNTRIES if c != forms[0]])


def _country_overlap(forms: tuple[str, ...], rng: random.Random) -> str:
    """A region of the country, or a country sharing a word ("South Korea" vs "North Korea")."""
    entry = next(c for c in COUNTRIES if c[0] == forms[0])
    if rng.random() < 0.5:
        return _pick(rng, entry[2])
    return f"{_pick(rng, ('North', 'South', 'East', 'West', 'New'))} {forms[0]}"


_COUNTRY_QUESTIONS = (
    ("What country did {person} represent?", "{person} represented {answer}."),
    ("Which country founded the {org}?", "The {org} was founded by {answer}."),
    ("Where did {person} emigrate to?", "{person} emigrated to {answer}."),
)


# Person
def _draw_person(rng: random.Random) -> tuple[str, ...]:
    first, surname = _pick(rng, FIRST_NAMES), _pick(rng, SURNAMES)
    middle = rng.choice("ABCDEFGHJKLMPRSTW")
    return (
        f"{first} {surname}",
        surname,
        f"{first[0]}. {surname}",
        f"{first} {middle}. {surname}",
        f"{_pick(rng, TITLES)} {first} {surname}",
        f"{_pick(rng, TITLES)} {surname}",
    )


def _redrawn(draw: Callable[[random.Random], str], current: str, rng: random.Random) -> str:
    """A value of ``draw`` other than ``current``."""
    while (value := draw(rng)) == current:
        pass
    return value


def _one_word_swapped(
    text: str,
    first_words: Sequence[str],
    second_words: Sequence[str],
    first_share: float,
    rng: random.Random,
) -> str:
    """Two-word ``text`` with its first word (at ``first_share``) or its second replaced."""
    first, second = text.split(" ", 1)
    if rng.random() < first_share:
        return f"{_pick(rng, [w for w in first_words if w != first])} {second}"
    return f"{first} {_pick(rng, [w for w in second_words if w != second])}"


def _other_person(forms: tuple[str, ...], rng: random.Random) -> str:
    return _redrawn(_person_name, forms[0], rng)


def _person_overlap(forms: tuple[str, ...], rng: random.Random) -> str:
    """A namesake: the same surname with another first name, or the reverse."""
    return _one_word_swapped(forms[0], FIRST_NAMES, SURNAMES, 0.6, rng)


_PERSON_QUESTIONS = (
    ("Who founded the {org}?", "The {org} was founded by {answer}."),
    ("Who was the first president of the {org}?", "The first president of the {org} was {answer}."),
    ("Who wrote the novel?", "The novel was written by {answer}."),
    ("Who discovered the comet?", "The comet was discovered by {answer}."),
    ("Who succeeded {person} as chairman?", "{answer} succeeded {person}."),
)


# Organisation
def _acronym(name: str) -> str:
    return "".join(word[0] for word in name.split() if word[0].isupper())


def _draw_organisation(rng: random.Random) -> tuple[str, ...]:
    name = _organisation_name(rng)
    kind = name.split()[-1]
    forms = [
        name,
        f"the {name}",
        _acronym(name),
        f"the {name} ({_acronym(name)})",
        f"the {name} in {_pick(rng, CITIES)[0]}",
    ]
    if kind in ORG_KIND_ABBREVIATIONS:
        forms.append(name.replace(kind, ORG_KIND_ABBREVIATIONS[kind]))
    return tuple(forms)


def _other_organisation(forms: tuple[str, ...], rng: random.Random) -> str:
    return _redrawn(_organisation_name, forms[0], rng)


def _organisation_overlap(forms: tuple[str, ...], rng: random.Random) -> str:
    """One word of the name changed ("National Health Institute" vs "National Health Council")."""
    words = forms[0].split()
    i = rng.randrange(len(words))
    pool = (ORG_ADJECTIVES, ORG_SUBJECTS, ORG_KINDS)[i]
    words[i] = _pick(rng, [w for w in pool if w != words[i]])
    return " ".join(words)


_ORGANISATION_QUESTIONS = (
    ("Which organisation did {person} join?", "{person} joined {answer}."),
    ("Who employed {person}?", "{person} worked for {answer}."),
    ("Which company built the bridge?", "The bridge was built by {answer}."),
    ("Which body awards the prize?", "The prize is awarded by {answer}."),
)


# Year
def _draw_year(rng: random.Random) -> tuple[str, ...]:
    y = rng.randint(1000, 2030)
    return (str(y), f"in {y}", f"the year {y}", f"in the year {y}", f"{y} AD", f"around {y}")


def _other_year(forms: tuple[str, ...], rng: random.Random) -> str:
    y = int(forms[0])
    return str(y + rng.choice((-1, 1)) * rng.choice((1, 2, 3, 5, 10, 20, 50)))


def _year_overlap(forms: tuple[str, ...], rng: random.Random) -> str:
    """One digit changed ("1887" vs "1787"), or a decade's other year."""
    digits = list(forms[0])
    i = rng.choice((1, 2, 3))
    digits[i] = rng.choice([d for d in "0123456789" if d != digits[i]])
    return "".join(digits)


_YEAR_QUESTIONS = (
    ("When was the {org} founded?", "The {org} was founded in {answer}."),
    ("In what year did {person} die?", "{person} died in {answer}."),
    ("What year was {person} born?", "{person} was born in {answer}."),
    ("When did the war end?", "The war ended in {answer}."),
    ("In which year was the treaty signed?", "The treaty was signed in {answer}."),
)


# Date
def _date_forms(y: int, m: int, d: int) -> tuple[str, ...]:
    month = MONTHS[m - 1]
    suffix = "th" if 10 <= d % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(d % 10, "th")
    return (
        f"{month} {d}, {y}",
        f"{d} {month} {y}",
        f"{month} {d}{suffix}, {y}",
        f"on {month} {d}, {y}",
        f"{MONTH_ABBREVIATIONS[m - 1]} {d}, {y}",
        f"{y}-{m:02d}-{d:02d}",
        f"the {d}{suffix} of {month} {y}",
        # A part of the date answers the question too (annotators give both).
        f"{month} {y}",
        f"{month} {d}",
    )


def _draw_date(rng: random.Random) -> tuple[str, ...]:
    return _date_forms(rng.randint(1700, 2030), rng.randint(1, 12), rng.randint(1, 28))


def _parse_date(forms: tuple[str, ...]) -> tuple[int, int, int]:
    y, m, d = forms[5].split("-")
    return int(y), int(m), int(d)


def _other_date(forms: tuple[str, ...], rng: random.Random) -> str:
    y, m, d = _parse_date(forms)
    field = rng.randrange(3)
    if field == 0:
        y += rng.choice((-1, 1)) * rng.randint(1, 30)
    elif field == 1:
        m = rng.choice([x for x in range(1, 13) if x != m])
    else:
        d = rng.choice([x for x in range(1, 29) if x != d])
    return rng.choice(_date_forms(y, m, d)[:7])


def _date_overlap(forms: tuple[str, ...], rng: random.Random) -> str:
    """The same day and month of another year, or the same month and year on another day."""
    y, m, d = _parse_date(forms)
    if rng.random() < 0.5:
        return _date_forms(y + rng.choice((-1, 1)) * rng.randint(1, 5), m, d)[0]
    return _date_forms(y, m, rng.choice([x for x in range(1, 29) if x != d]))[0]


_DATE_QUESTIONS = (
    ("On what date was {person} born?", "{person} was born on {answer}."),
    ("When was the agreement signed?", "The agreement was signed on {answer}."),
    ("When did the ship sink?", "The ship sank on {answer}."),
)


# Count
def _draw_number(rng: random.Random) -> tuple[str, ...]:
    n = _draw_count(rng)
    forms = _number_forms(n)
    return (str(n), *forms[1:], f"about {forms[0]}", f"approximately {_pick(rng, forms)}")


def _other_number(forms: tuple[str, ...], rng: random.Random) -> str:
    return _pick(rng, _number_forms(_other_count(int(forms[0]), rng)))


def _number_overlap(forms: tuple[str, ...], rng: random.Random) -> str:
    n = int(forms[0])
    return (
        str(n * 10 + rng.randint(0, 9))
        if rng.random() < 0.5
        else _number_forms(_other_count(n, rng))[0]
    )


_NUMBER_QUESTIONS = (
    ("How many people work for the {org}?", "The {org} employs {answer} people."),
    ("What is the population of {city}?", "{city} has a population of {answer}."),
    ("How many students attend the university?", "The university has {answer} students."),
    ("How many copies of the album were sold?", "The album sold {answer} copies."),
)


# Quantity with a unit or a currency
def _draw_quantity(rng: random.Random) -> tuple[str, ...]:
    value = rng.randint(2, 9999) if rng.random() < 0.8 else round(rng.uniform(1, 99), 1)
    text = f"{value:,}" if isinstance(value, int) else f"{value}"
    if rng.random() < 0.7:
        symbol, names = _pick(rng, UNITS)
        return (f"{text} {symbol}", *(f"{text} {n}" for n in names), f"about {text} {names[0]}")
    symbol, names = _pick(rng, CURRENCIES)
    return (f"{symbol}{text}", *(f"{text} {n}" for n in names), f"nearly {symbol}{text}")


def _quantity_parts(text: str) -> tuple[str, str]:
    """(number, unit or currency) of a canonical quantity ("5 km" / "$12")."""
    if text[0] in {c for c, _ in CURRENCIES}:
        return text[1:], text[0]
    number, unit = text.split(" ", 1)
    return number, unit


def _other_quantity(forms: tuple[str, ...], rng: random.Random) -> str:
    number, unit = _quantity_parts(forms[0])
    value = float(number.replace(",", ""))
    other = value + rng.choice((-1, 1)) * max(1.0, round(value * rng.uniform(0.05, 0.5)))
    text = f"{other:,.0f}" if other == int(other) else f"{other:.1f}"
    return f"{unit}{text}" if unit in {c for c, _ in CURRENCIES} else f"{text} {unit}"


def _quantity_overlap(forms: tuple[str, ...], rng: random.Random) -> str:
    """The same number in another unit ("5 km" vs "5 miles")."""
    number, unit = _quantity_parts(forms[0])
    if unit in {c for c, _ in CURRENCIES}:
        return f"{_pick(rng, [c for c, _ in CURRENCIES if c != unit])}{number}"
    return f"{number} {_pick(rng, [names[0] for symbol, names in UNITS if symbol != unit])}"


_QUANTITY_QUESTIONS = (
    ("How long is the river?", "The river is {answer} long."),
    ("How much did the painting cost?", "The painting cost {answer}."),
    ("How heavy is the bell?", "The bell weighs {answer}."),
    ("How high is the summit?", "The summit is {answer} high."),
    ("What was the price of a ticket?", "A ticket cost {answer}."),
)


# Percentage
def _draw_percent(rng: random.Random) -> tuple[str, ...]:
    p = rng.randint(1, 99)
    return (f"{p}%", f"{p} percent", f"{p} per cent", f"{number_words(p)} percent", f"about {p}%")


def _other_percent(forms: tuple[str, ...], rng: random.Random) -> str:
    p = int(forms[0].rstrip("%"))
    return f"{_pick(rng, [x for x in range(1, 100) if x != p])}%"


def _percent_overlap(forms: tuple[str, ...], rng: random.Random) -> str:
    """A percentage sharing a digit ("45%" vs "4.5%" or "54%")."""
    p = forms[0].rstrip("%")
    swapped = p[::-1]
    if len(p) == 2 and swapped != p and rng.random() < 0.5:
        return f"{swapped}%"
    return f"{int(p) / 10:g}%"


_PERCENT_QUESTIONS = (
    (
        "What share of {city}'s residents are foreign-born?",
        "{answer} of {city}'s residents are foreign-born.",
    ),
    ("By how much did sales fall?", "Sales fell by {answer}."),
    ("What percentage of the vote did the party win?", "The party won {answer} of the vote."),
)


# Common nouns of one category
def _thing_type(
    category: str, question_texts: QuestionTemplates, countable: bool = False
) -> AnswerType:
    items = THINGS[category]

    def draw(rng: random.Random) -> tuple[str, ...]:
        names = _pick(rng, items)
        if not countable:
            return names
        return (*names, f"an {names[0]}" if names[0][0] in "aeiou" else f"a {names[0]}")

    def other(forms: tuple[str, ...], rng: random.Random) -> str:
        return _pick(rng, [names for names in items if forms[0] not in names])[0]

    def overlap(forms: tuple[str, ...], rng: random.Random) -> str:
        """A compound naming something else ("horse" vs "horse museum")."""
        return f"{forms[0]} {_pick(rng, ('museum', 'festival', 'club', 'shop', 'award', 'school'))}"

    return AnswerType(category, draw, other, overlap, _asker(question_texts))


# Noun phrase
def _phrase(rng: random.Random) -> str:
    return f"{_pick(rng, PHRASE_ADJECTIVES)} {_pick(rng, PHRASE_NOUNS)}"


def _draw_phrase(rng: random.Random) -> tuple[str, ...]:
    phrase = _phrase(rng)
    return phrase, f"the {phrase}"


def _other_phrase(forms: tuple[str, ...], rng: random.Random) -> str:
    return _redrawn(_phrase, forms[0], rng)


def _phrase_overlap(forms: tuple[str, ...], rng: random.Random) -> str:
    """One word swapped: "civil war" is not "cold war" ("civil reform" vs "civil growth")."""
    return _one_word_swapped(forms[0], PHRASE_ADJECTIVES, PHRASE_NOUNS, 0.5, rng)


_PHRASE_QUESTIONS = (
    ("What did {person} argue for?", "{person} argued for {answer}."),
    ("What caused the unrest?", "The unrest was caused by {answer}."),
    ("What is the period known for?", "The period is known for {answer}."),
    ("Why did {person} resign?", "{person} resigned because of {answer}."),
)


# Team
def _draw_team(rng: random.Random) -> tuple[str, ...]:
    place, nickname = _pick(rng, TEAM_PLACES), _pick(rng, TEAM_NICKNAMES)
    return (
        f"{place} {nickname}",
        f"the {nickname}",
        nickname,
        f"the {place} {nickname}",
        f"the {place} {nickname} team",
    )


def _split_team(name: str) -> tuple[str, str]:
    place, nickname = name.rsplit(" ", 1)
    return place, nickname


def _other_team(forms: tuple[str, ...], rng: random.Random) -> str:
    place, nickname = _split_team(forms[0])
    other = _pick(rng, [n for n in TEAM_NICKNAMES if n != nickname])
    if rng.random() < 0.4:
        return f"the {other}"
    return f"{_pick(rng, [p for p in TEAM_PLACES if p != place])} {other}"


def _team_overlap(forms: tuple[str, ...], rng: random.Random) -> str:
    """The same place with another nickname ("Brackwater Comets"), or the reverse ("Eastmoor Otters")."""
    place, nickname = _split_team(forms[0])
    if rng.random() < 0.5:
        return f"{place} {_pick(rng, [n for n in TEAM_NICKNAMES if n != nickname])}"
    return f"{_pick(rng, [p for p in TEAM_PLACES if p != place])} {nickname}"


_TEAM_QUESTIONS = (
    ("Which team won the {year} final?", "The {year} final was won by {answer}."),
    ("Who did the {city} side beat in the semi-final?", "They beat {answer} in the semi-final."),
    ("Which team did {person} play for?", "{person} played for {answer}."),
    ("Who represented the conference in the {year} game?", "{answer} represented the conference."),
)


# Purpose or method
def _draw_purpose(rng: random.Random) -> tuple[str, ...]:
    (verb, gerund), obj = _pick(rng, VERBS), _pick(rng, VERB_OBJECTS)
    return (
        f"to {verb} {obj}",
        f"{verb} {obj}",
        f"in order to {verb} {obj}",
        f"by {gerund} {obj}",
        f"{gerund} {obj}",
        f"so as to {verb} {obj}",
    )


def _purpose_parts(text: str) -> tuple[str, str]:
    verb, obj = text.removeprefix("to ").split(" ", 1)
    return verb, obj


def _other_purpose(forms: tuple[str, ...], rng: random.Random) -> str:
    verb, obj = _purpose_parts(forms[0])
    other_verb = _pick(rng, [v for v, _ in VERBS if v != verb])
    return f"to {other_verb} {_pick(rng, [o for o in VERB_OBJECTS if o != obj])}"


def _purpose_overlap(forms: tuple[str, ...], rng: random.Random) -> str:
    """The same verb on another object, or another verb on the same object."""
    verb, obj = _purpose_parts(forms[0])
    if rng.random() < 0.5:
        return f"to {verb} {_pick(rng, [o for o in VERB_OBJECTS if o != obj])}"
    return f"to {_pick(rng, [v for v, _ in VERBS if v != verb])} {obj}"


_PURPOSE_QUESTIONS = (
    ("Why did the {org} raise funds?", "The {org} raised funds {answer}."),
    ("What was the purpose of the new law?", "The new law was passed {answer}."),
    ("How did {person} try to win support?", "{person} tried to win support {answer}."),
    ("What did the {year} reform aim to do?", "The {year} reform aimed {answer}."),
)


def _noun_phrase(rng: random.Random) -> str:
    adjective = f"{_pick(rng, EXTENSION_ADJECTIVES)} " if rng.random() < 0.5 else ""
    return f"the {adjective}{_pick(rng, EXTENSION_NOUNS)}"


def extension(answer: str, rng: random.Random) -> str:
    """``answer`` as a longer span of its sentence: a participle and a place, a prepositional
    phrase, a relative clause, a parenthesis, a noun after a number, words before it — all
    composed from word lists, so the model learns the shape rather than the words."""
    kind = rng.randrange(7)
    if kind == 0:
        return f"{answer} {_pick(rng, EXTENSION_PARTICIPLES)} {_pick(rng, EXTENSION_PREPOSITIONS)} {_noun_phrase(rng)}"
    if kind == 1:
        tail = _noun_phrase(rng) if rng.random() < 0.7 else _pick(rng, CITIES)[0]
        return f"{answer} {_pick(rng, EXTENSION_PREPOSITIONS)} {tail}"
    if kind == 2:
        joiner = rng.choice((", which", " which", ", who", " that"))
        return f"{answer}{joiner} {_pick(rng, RELATIVE_VERBS)} {_noun_phrase(rng)}"
    if kind == 3:
        inner = rng.choice(
            (
                f"{rng.randint(2, 99)} {_pick(rng, UNITS)[0]}",
                f"{rng.randint(1700, 2020)}",
                _pick(rng, EXTENSION_NOUNS),
                f"founded {rng.randint(1700, 2020)}",
            )
        )
        rest = f" {_pick(rng, EXTENSION_NOUNS)}" if rng.random() < 0.4 else ""
        return f"{answer} ({inner}){rest}"
    if kind == 4 and any(c.isdigit() for c in answer):
        adjective = (
            f"{_pick(rng, ('British', 'French', 'local', 'new', 'armed', 'young'))} "
            if rng.random() < 0.5
            else ""
        )
        return f"{answer} {adjective}{_pick(rng, EXTENSION_PLURALS)}"
    if kind == 5:
        return f"{_pick(rng, EXTENSION_PREFIXES)} {answer} {_pick(rng, EXTENSION_PREPOSITIONS)} {_noun_phrase(rng)}"
    return f"{_pick(rng, EXTENSION_PREFIXES)} {answer}"


def elaboration(answer: str, rng: random.Random) -> str:
    """``answer`` with a qualifier or a detail added: still the same answer to annotators
    ("17" vs "17 times between 1604 and 1689", "Eastmoor Otters" vs "a team from Eastmoor
    Otters")."""
    if rng.random() < 0.5:
        return f"{_pick(rng, ELABORATION_PREFIXES)} {answer}"
    if rng.random() < 0.1:
        start = rng.randint(1100, 1950)
        return f"{answer} between {start} and {start + rng.randint(20, 200)}"
    suffix = _pick(rng, ELABORATION_SUFFIXES)
    return f"{answer}{suffix}" if suffix.startswith(",") else f"{answer} {suffix}"


TYPES: tuple[AnswerType, ...] = (
    AnswerType("city", _draw_city, _other_city, _city_overlap, _asker(_CITY_QUESTIONS)),
    AnswerType(
        "country", _draw_country, _other_country, _country_overlap, _asker(_COUNTRY_QUESTIONS)
    ),
    AnswerType("person", _draw_person, _other_person, _person_overlap, _asker(_PERSON_QUESTIONS)),
    AnswerType(
        "organisation",
        _draw_organisation,
        _other_organisation,
        _organisation_overlap,
        _asker(_ORGANISATION_QUESTIONS),
    ),
    AnswerType("year", _draw_year, _other_year, _year_overlap, _asker(_YEAR_QUESTIONS)),
    AnswerType("date", _draw_date, _other_date, _date_overlap, _asker(_DATE_QUESTIONS)),
    AnswerType("number", _draw_number, _other_number, _number_overlap, _asker(_NUMBER_QUESTIONS)),
    AnswerType(
        "quantity", _draw_quantity, _other_quantity, _quantity_overlap, _asker(_QUANTITY_QUESTIONS)
    ),
    AnswerType(
        "percent", _draw_percent, _other_percent, _percent_overlap, _asker(_PERCENT_QUESTIONS)
    ),
    AnswerType("phrase", _draw_phrase, _other_phrase, _phrase_overlap, _asker(_PHRASE_QUESTIONS)),
    AnswerType("team", _draw_team, _other_team, _team_overlap, _asker(_TEAM_QUESTIONS)),
    AnswerType(
        "purpose", _draw_purpose, _other_purpose, _purpose_overlap, _asker(_PURPOSE_QUESTIONS)
    ),
    _thing_type(
        "occupation",
        (
            ("What was {person}'s profession?", "{person} worked as {answer}."),
            ("What did {person} train as?", "{person} trained as {answer}."),
        ),
        countable=True,
    ),
    _thing_type(
        "material",
        (
            ("What is the statue made of?", "The statue is made of {answer}."),
            ("What material was used for the roof?", "The roof was made of {answer}."),
        ),
    ),
    _thing_type(
        "language",
        (
            ("What language did {person} write in?", "{person} wrote in {answer}."),
            ("What is the official language?", "The official language is {answer}."),
        ),
    ),
    _thing_type(
        "sport",
        (
            ("What sport did {person} play?", "{person} played {answer}."),
            ("Which sport is the stadium used for?", "The stadium is used for {answer}."),
        ),
    ),
    _thing_type(
        "animal",
        (
            ("What animal appears on the flag?", "The flag shows {answer}."),
            ("Which animal is the team named after?", "The team is named after {answer}."),
        ),
        countable=True,
    ),
    _thing_type(
        "instrument",
        (
            ("What instrument did {person} play?", "{person} played the {answer}."),
            (
                "Which instrument is the concerto written for?",
                "The concerto is written for {answer}.",
            ),
        ),
    ),
)
TYPE_BY_NAME = {t.name: t for t in TYPES}


# --- non-answers --------------------------------------------------------------------------------
# What a small instruction-tuned LLM writes instead of an answer: kinds of text (refusals, talk
# around the answer, talk about the task), each written here from scratch in generic words —
# none is a sample read in a model's answers on an evaluation set.
REFUSALS = (
    "I don't know",
    "I do not know",
    "I'm not sure",
    "Unknown",
    "Not mentioned",
    "None",
    "N/A",
    "No answer",
    "There is no answer",
    "The text does not say",
    "The document does not mention it",
    "The document does not say",
    "The passage does not provide this information",
    "This is not stated in the text",
    "I cannot answer that question",
    "I can't answer this",
    "I'm sorry, I cannot help with that",
    "I do not have that information",
    "The answer cannot be found",
    "There is not enough information to answer",
    "It is not clear from the document",
    "Nothing in the text says so",
    "No information is given",
    "I have no idea",
)
ANSWER_LEADS = (
    "The answer is",
    "The answer is:",
    "Answer:",
    "It is",
    "The correct answer is",
    "Based on the document,",
    "According to the text,",
    "The document states that",
)
QUESTION_CONTINUATIONS = (
    "specifically in the document",
    "according to the text",
    "and why",
    "in the passage above",
    "is the question",
    "The answer is",
    "is asked in the document",
    "and when",
    "This question is about",
)
QUESTION_LEADS = (
    "The question asks",
    "You asked:",
    "Question:",
    "The question is",
    "So,",
    "Let me answer:",
)
SUBJECT_SENTENCES = (
    "{subject} is mentioned in the document.",
    "The document is about {subject}.",
    "{subject} was important at the time.",
    "The text describes {subject} in detail.",
    "{subject} is well known.",
    "Information about {subject} is given above.",
    "{subject} played a role in this.",
    "The passage talks about {subject}.",
    "{subject} is discussed in the text.",
    "This is about {subject}.",
)
DANGLING = (
    "the",
    "a",
    "about",
    "in the",
    "approximately",
    "known as",
    "called",
    "the famous",
    "around",
    "at the",
)
# Talk a small LLM puts around its answer, or writes instead of one; none states a value.
RAMBLE_SENTENCES = (
    "{subject} comes up in the first document.",
    "This is mentioned in doc 2.",
    "The text has a lot to say about {subject}.",
    "Opinions differ on this point.",
    "It mattered a great deal to {subject}.",
    "The passage covers other matters as well.",
    "{subject} has a long history.",
    "People rarely think about this.",
    "The second paragraph goes into it.",
    "Much has been written about {subject}.",
    "The document has further details.",
    "Let me think about that.",
    "Each document looks at {subject} from another side.",
    "There is more on {subject} further down.",
    "Nobody can be completely sure.",
    "It helps to keep the question in mind.",
    "{subject} looked very different back then.",
)
# Talk about the answer, the document or the task instead of an answer ("The document contains
# the following:", "Doc 1: <subject>"): a subject and a predicate, neither stating a value.
META_SUBJECTS = (
    "The answer",
    "This answer",
    "The document",
    "The text above",
    "The passage",
    "Doc 2",
    "The second document",
    "The context",
    "This reply",
    "The question",
    "My reply",
    "What follows",
    "This",
)
META_PREDICATES = (
    "is right",
    "should be helpful",
    "lists these points:",
    "appears below",
    "comes from the document",
    "fits the question",
    "relies on the context",
    "is brief",
    "is in the text",
    "is spelled out in full",
    "was checked twice",
    "sums it up",
    "matches the passage",
    "is taken from the text",
    "deserves attention",
    "goes like this:",
    "is kept brief on purpose",
)
META_ADJECTIVES = ("A brief", "A fair", "A sound", "A fitting", "A plain", "A careful", "A likely")
NON_ANSWER_KINDS = (
    "restated",
    "cut",
    "subject",
    "refusal",
    "copied",
    "rambling",
    "gibberish",
    "meta",
)


def _question_subject(question: Question, rng: random.Random) -> str:
    """A name the question mentions, else its last words ("Who wrote the novel?" → "the novel")."""
    if question.subjects:
        return _pick(rng, question.subjects)
    words = question.text.rstrip("?").split()
    return " ".join(words[-rng.randint(1, min(3, len(words))) :])


def _restated(question: Question, rng: random.Random) -> str:
    """The question again: verbatim, without its mark, led in, or continued."""
    text = question.text
    kind = rng.randrange(4)
    if kind == 0:
        return text if rng.random() < 0.5 else text.rstrip("?")
    if kind == 1:
        return f"{_pick(rng, QUESTION_LEADS)} {text}"
    if kind == 2:
        return f"{text.rstrip('?')} {_pick(rng, QUESTION_CONTINUATIONS)}"
    return f'The answer to the question "{text}" is'


def _cut(question: Question, rng: random.Random) -> str:
    """The answer's sentence cut off before the answer ("The novel was written by the"), or an
    answer lead with nothing after it ("The answer is:")."""
    before, _, after = question.sentence.partition("{answer}")
    before = before.strip()
    if not before or rng.random() < 0.2:
        stem = before or after.strip().rstrip(".")
        if rng.random() < 0.5 or not stem:
            return _pick(rng, ANSWER_LEADS)
        return stem
    words = before.split()
    if len(words) > 2 and rng.random() < 0.3:
        words = words[: rng.randint(2, len(words) - 1)]
    text = " ".join(words)
    if rng.random() < 0.3:
        # Cut mid-word, as a token limit does ("The comet was discovered by Helen Var").
        return text[: rng.randint(max(1, len(text) // 2), len(text))]
    tail = f" {_pick(rng, DANGLING)}" if rng.random() < 0.35 else ""
    return text + tail


def _ramble(question: Question, rng: random.Random, sentences: int) -> list[str]:
    texts = [
        _pick(rng, RAMBLE_SENTENCES).format(subject=_question_subject(question, rng))
        for _ in range(sentences)
    ]
    return [text[:1].upper() + text[1:] for text in texts]


def _trailing_clause(rng: random.Random) -> str:
    """A clause a sentence may run on with (", which crossed the old river")."""
    kind = rng.randrange(3)
    if kind == 0:
        return f", which {_pick(rng, RELATIVE_VERBS)} {_noun_phrase(rng)}"
    if kind == 1:
        return f" {_pick(rng, EXTENSION_PREPOSITIONS)} {_noun_phrase(rng)}"
    return f", and {_pick(rng, RELATIVE_VERBS)} {_noun_phrase(rng)} {_pick(rng, ELABORATION_SUFFIXES).lstrip(', ')}"


def _token_limit_cut(text: str, rng: random.Random, keep: int) -> str:
    """``text`` cut where a token limit would stop it, never inside its first ``keep`` characters."""
    if len(text) <= keep + 8:
        return text
    return text[: rng.randint(keep, len(text))].rstrip()


def rambling(sentence: str, question: Question, rng: random.Random) -> str:
    """``sentence`` as a small LLM writes it at length: run on with a clause, between sentences
    that state nothing, and maybe cut off by the token limit after it."""
    if rng.random() < 0.5:
        sentence = f"{sentence.rstrip('.')}{_trailing_clause(rng)}."
    before = _ramble(question, rng, rng.choice((0, 0, 1)))
    after = _ramble(question, rng, rng.choice((0, 1, 2)))
    text = " ".join([*before, sentence, *after])
    if after and rng.random() < 0.4:
        text = _token_limit_cut(text, rng, len(text) - len(" ".join(after)))
    return text


def _gibberish(answer: str, rng: random.Random) -> str:
    """Words of the word lists strung together, none of them ``answer``."""
    pool = (
        *EXTENSION_NOUNS,
        *VERB_OBJECTS,
        *RELATIVE_VERBS,
        *PHRASE_NOUNS,
        *FIRST_NAMES,
        *TEAM_NICKNAMES,
        *EXTENSION_ADJECTIVES,
    )
    banned = set(normalize_answer(answer).split())
    words = [
        w
        for w in rng.sample(pool, rng.randint(3, 12))
        if not banned & set(normalize_answer(w).split())
    ]
    text = " ".join(words) or _pick(rng, REFUSALS)
    return text[:1].upper() + text[1:]


def _meta(question: Question, rng: random.Random) -> str:
    """Talk about the answer or the document that states no value: "The document lists these
    points:", "A fitting reply.", "Doc 2: <the question's subject>"."""
    kind = rng.randrange(3)
    if kind == 0:
        return f"{_pick(rng, META_SUBJECTS)} {_pick(rng, META_PREDICATES)}"
    if kind == 1:
        noun = rng.choice(("answer", "response", "reply", "summary"))
        return f"{_pick(rng, META_ADJECTIVES)} {noun}" + rng.choice(("", ".", ":"))
    return f"Doc {rng.randint(1, 5)}: {_question_subject(question, rng)}" + rng.choice(("", "."))


def non_answer(question: Question, answer: str, rng: random.Random) -> str:
    """A text that answers nothing to ``question`` (whose answer is ``answer``): the question
    restated or continued, its answer sentence cut off before the answer, a sentence about the
    question's subject, a refusal, an entity copied from the question, talk that states nothing
    (maybe after the question restated or a cut sentence), talk about the answer or the document,
    or a string of unrelated words."""
    kind = _pick(rng, NON_ANSWER_KINDS)
    subject = _question_subject(question, rng)
    if kind == "rambling":
        opening = rng.choice((_restated(question, rng), _cut(question, rng), ""))
        text = " ".join(filter(None, [opening, *_ramble(question, rng, rng.randint(1, 3))]))
        return _token_limit_cut(text, rng, len(text) // 2) if rng.random() < 0.3 else text
    if kind == "gibberish":
        return _gibberish(answer, rng)
    if kind == "meta":
        return _meta(question, rng)
    if kind == "copied" and normalize_answer(subject) != normalize_answer(answer):
        return subject if rng.random() < 0.7 else f"{subject}."
    if kind == "restated":
        return _restated(question, rng)
    if kind == "cut":
        return _cut(question, rng)
    if kind == "subject":
        return _pick(rng, SUBJECT_SENTENCES).format(subject=subject)
    refusal = _pick(rng, REFUSALS)
    return f"{refusal}." if rng.random() < 0.5 else refusal


def answer_sentence(question: Question, answer: str, rng: random.Random) -> str:
    """A sentence stating ``answer``: the question's answer sentence, sometimes led in ("Based
    on the document, …"), or an answer lead before the bare answer ("The answer is Paris.")."""
    u = rng.random()
    if u < 0.25:
        sentence = f"{_pick(rng, ANSWER_LEADS)} {answer}."
    elif u < 0.35:
        sentence = f'The answer to the question "{question.text}" is {answer}.'
    else:
        sentence = question.sentence.format(answer=answer)
        if rng.random() < 0.2:
            lead = _pick(
                rng,
                ("Based on the document,", "According to the text,", "The document states that"),
            )
            sentence = f"{lead} {sentence[:1].lower()}{sentence[1:]}"
    return rambling(sentence, question, rng) if rng.random() < 0.35 else sentence


# --- surface forms ------------------------------------------------------------------------------
def surface_variant(text: str, rng: random.Random) -> str:
    """``text`` as an answer may be typed: case changed, "the" added or dropped, a full stop or
    quotes around it. SQuAD normalisation maps every variant back to the same string."""
    u = rng.random()
    if u < 0.2:
        text = text.lower()
    elif u < 0.3:
        text = text.upper()
    elif u < 0.4 and text[:1].islower():
        text = text[:1].upper() + text[1:]
    v = rng.random()
    if v < 0.15 and not text.lower().startswith("the "):
        text = f"the {text}"
    elif v < 0.3 and text.lower().startswith("the "):
        text = text[4:]
    w = rng.random()
    if w < 0.15:
        text = f"{text}."
    elif w < 0.2:
        text = f'"{text}"'
    return text


# --- pairs --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AnswerPair:
    """Two answers to ``question`` with their NLI label and the category that made them."""

    question: str
    first: str
    second: str
    label: str
    category: str
    answer_type: str

    def texts(self, with_question: bool = True) -> tuple[str, str]:
        """The (premise, hypothesis) an NLI model sees: SePer's ``"{q}? {answer}"`` form, or the
        bare answers."""
        question = self.question if with_question else None
        return nli_text(self.first, question), nli_text(self.second, question)


def _pair_texts(
    category: str, kind: AnswerType, forms: tuple[str, ...], question: Question, rng: random.Random
) -> tuple[str, str, str]:
    """(first, second, answer type asked) of one pair of ``category``."""
    a = _pick(rng, forms)
    if category == "identical":
        return a, surface_variant(a, rng), kind.name
    if category == "alias":
        b = _pick(rng, [f for f in forms if f != a] or forms)
        if rng.random() < 0.35:
            b = elaboration(b, rng)
        return a, surface_variant(b, rng), kind.name
    if category == "extension":
        b = _pick(rng, forms) if rng.random() < 0.3 else a
        return a, surface_variant(extension(b, rng), rng), kind.name
    if category == "sentence":
        # The canonical form reads right in every sentence template ("born in Paris.").
        return _pick(rng, forms), answer_sentence(question, forms[0], rng), kind.name
    if category == "non_answer":
        gold = forms[0] if rng.random() < 0.7 else answer_sentence(question, forms[0], rng)
        return gold, non_answer(question, forms[0], rng), kind.name
    if category == "other_value":
        b = kind.other(forms, rng)
    elif category == "partial_overlap":
        b = kind.overlap(forms, rng)
    else:  # unrelated: a value of another type
        other = _pick(rng, [t for t in TYPES if t is not kind])
        b = _pick(rng, other.draw(rng))
    if rng.random() < 0.3:
        return a, answer_sentence(question, b, rng), kind.name
    return a, surface_variant(b, rng), kind.name


def answer_pair(
    rng: random.Random, category: str | None = None, answer_type: str | None = None
) -> AnswerPair:
    """One labelled pair; its category drawn at :data:`CATEGORY_SHARES` and its answer type
    uniformly, unless given."""
    if category is None:
        names = list(CATEGORY_SHARES)
        category = rng.choices(names, weights=[CATEGORY_SHARES[c] for c in names])[0]
    kind = _pick(rng, TYPES) if answer_type is None else TYPE_BY_NAME[answer_type]
    forms = kind.draw(rng)
    question = kind.questions(rng)
    first, second, answer_type = _pair_texts(category, kind, forms, question, rng)
    if rng.random() < 0.5:
        first, second = second, first
    return AnswerPair(
        question.text, first, second, CATEGORY_LABELS[category], category, answer_type
    )


def answer_pairs(rng: random.Random, n: int) -> list[AnswerPair]:
    """``n`` labelled pairs drawn from ``rng`` (deterministic for a seeded ``random.Random``)."""
    return [answer_pair(rng) for _ in range(n)]
