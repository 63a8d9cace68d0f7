"""How generations are sampled: one value that travels from the experiment config to every
generator backend and into the generation cache key, validated here and nowhere else (the
config validates each of its fields with :func:`check_sampling_field`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace


def _valid_stop(stop: tuple[str, ...]) -> str | None:
    for i, s in enumerate(stop):
        if not isinstance(s, str) or not s:
            return f"stop[{i}] must be a non-empty string, got {s!r}"
    return None


# field -> (the value is valid, what a valid value is); stop has its own per-item check.
_RULES: dict[str, tuple[Callable[[object], bool], str]] = {
    "n": (lambda v: v >= 1, "must be at least 1"),
    "temperature": (lambda v: v >= 0, "must be >= 0 (0 is greedy decoding)"),
    "top_p": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "top_k": (lambda v: v >= 0, "must be >= 0 (0 disables it)"),
    "max_new_tokens": (lambda v: v >= 1, "must be at least 1"),
    # vLLM seeds a request's j-th sample with its seed + j, in a range with 2**16 to spare
    "first_index": (lambda v: 0 <= v < 2**15, "must be in [0, 32768)"),
}


def check_sampling_field(name: str, value: object) -> None:
    """Raise ``ValueError`` (the message without the field name) unless ``value`` is valid for
    the sampling field ``name``."""
    if name == "stop":
        problem = _valid_stop(tuple(value))
        if problem:
            raise ValueError(problem)
        return
    if name in _RULES:
        valid, rule = _RULES[name]
        if not valid(value):
            raise ValueError(f"{rule} (got {value!r})")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: ``n`` responses per prompt, drawn from the temperature-scaled, top-k and
    top-p filtered distribution (``temperature == 0`` is greedy; ``top_k == 0`` and
    ``top_p == 1`` disable those filters), at most ``max_new_tokens`` each, cut at the first of
    the ``stop`` strings, reproducible from ``seed``.

    Each prompt has one stream of samples per seed; a request returns its samples
    ``first_index`` … ``first_index + n − 1``, so a request from ``first_index = m`` continues one
    of ``n = m`` (adaptive sampling's later rounds) with the samples a single larger request
    would have drawn."""

    n: int = 10
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 512
    stop: tuple[str, ...] = ()
    seed: int = 0
    first_index: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        for field in fields(self):
            try:
                check_sampling_field(field.name, getattr(self, field.name))
            except ValueError as err:
                raise ValueError(
                    f"{field.name} {err}" if field.name != "stop" else str(err)
                ) from None


def check_rounds(rounds: Sequence[SamplingParams]) -> None:
    """Raise ``ValueError`` unless ``rounds`` are rounds of one sample stream per prompt: at least
    one, each starting where the last ended (``first_index``), and alike in every other setting
    but ``n``."""
    if not rounds:
        raise ValueError("rounds: at least one round is needed")
    for i, (last, this) in enumerate(zip(rounds, rounds[1:]), start=1):
        if this.first_index != last.first_index + last.n:
            raise ValueError(
                f"rounds[{i}].first_index is {this.first_index}; it must continue round {i - 1} "
                f"at {last.first_index + last.n}"
            )
        if replace(this, n=last.n, first_index=last.first_index) != last:
            raise ValueError(
                f"rounds[{i}] differs from round {i - 1} in more than n and first_index"
            )
