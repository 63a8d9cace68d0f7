"""Input validation shared by the model backends."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["check_texts"]


def check_texts(texts: Sequence[str], what: str = "texts") -> list[str]:
    """``texts`` as a list, or a TypeError naming the first entry that is not a string."""
    if isinstance(texts, str):
        raise TypeError(f"{what} must be a sequence of strings, not a single string")
    out = list(texts)
    for i, text in enumerate(out):
        if not isinstance(text, str):
            raise TypeError(f"{what}[{i}] is {type(text).__name__}, expected str")
    return out
