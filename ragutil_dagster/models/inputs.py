"""Input validation and length batching shared by the model backends."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["check_texts", "length_batches"]


def check_texts(texts: Sequence[str], what: str = "texts") -> list[str]:
    """``texts`` as a list, or a TypeError naming the first entry that is not a string."""
    if isinstance(texts, str):
        raise TypeError(f"{what} must be a sequence of strings, not a single string")
    out = list(texts)
    for i, text in enumerate(out):
        if not isinstance(text, str):
            raise TypeError(f"{what}[{i}] is {type(text).__name__}, expected str")
    return out


def length_batches(lengths: Sequence[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Indices of ``lengths`` sorted by length and cut into consecutive batches of at most
    ``max_rows`` rows and ``max_tokens`` padded tokens (rows × the batch's longest length; a
    single row longer than the budget is a batch of its own). Sorting keeps similar lengths
    together, so padding stays small."""
    batches: list[list[int]] = []
    current: list[int] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        # Ascending order: the newest row is the batch's widest.
        if current and (len(current) == max_rows or (len(current) + 1) * lengths[i] > max_tokens):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches
