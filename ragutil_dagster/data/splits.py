"""The development and report halves of a dataset whose passages belong to articles (SQuAD:
passage id ``<article slug>_<paragraph index>``, docs/datasets.md "Development and report halves").

Every rule, threshold or word list of the judge that is chosen by reading its errors on SQuAD is
chosen on the ``dev`` half only, and the figures the docs quote for it are on the ``test`` (report)
half, beside the dev half's. The halves are whole articles — a question, its paragraph and the
other questions about that article fall on one side — and fixed: the CRC-32 of the article slug,
even → ``dev``, odd → ``test`` (no seed to choose; on SQuAD v1.1 dev's 36 articles in
``shared/data/squad``: 22 articles / 828 paragraphs dev, 14 / 729 test).
"""

from __future__ import annotations

import zlib
from typing import Literal

Half = Literal["dev", "test"]
HALVES: tuple[Half, ...] = ("dev", "test")


def article_of(passage_id: str) -> str:
    """The article slug of a passage id ``<article slug>_<paragraph index>``."""
    return passage_id.rsplit("_", 1)[0]


def article_half(passage_id: str) -> Half:
    """``dev`` or ``test``: the half of the articles ``passage_id``'s article belongs to (the
    CRC-32 of its slug, even → ``dev``)."""
    return "dev" if zlib.crc32(article_of(passage_id).encode()) % 2 == 0 else "test"
