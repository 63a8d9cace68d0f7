"""Errors raised by the retrieval layer: bad input records and indexes that do not fit."""

from __future__ import annotations

from pathlib import Path


class CorpusValidationError(ValueError):
    """A corpus, query or qrels record is malformed.

    Carries the file, the 1-based line (or row, for Parquet) and the field at fault, so a
    user can open the file at the right place. ``line`` is ``None`` when the problem is
    with the file as a whole (for example a missing column).
    """

    def __init__(self, path: str | Path, line: int | None, field: str | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.message = message
        where = self.path if line is None else f"{self.path}:{line}"
        what = f" field {field!r}:" if field else ""
        super().__init__(f"{where}:{what} {message}")


class IndexMismatchError(ValueError):
    """A saved index was loaded against a different corpus, model or format than it was built for."""


class IndexFormatError(ValueError):
    """A saved index directory is incomplete or its manifest is unreadable."""
