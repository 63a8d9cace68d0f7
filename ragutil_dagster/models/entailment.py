"""NLI entailment probabilities for semantic clustering (SePer §3.3, after Kuhn et al., 2023).

:class:`Entailment` is the ``entail(premises, hypotheses) -> (n, 3)`` callable that
``ragutil_dagster.metrics.seper`` takes: probabilities in the order
[contradiction, neutral, entailment], whatever order the model's own labels are in (read from
its ``id2label``, never assumed). Duplicate pairs are computed once per call, and every computed
pair is stored in an SQLite cache keyed by the model identity and the pair, so clustering the
same answers again (other metric, other run, other process) costs nothing.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from ragutil_dagster.errors import ModelUnavailableError
from ragutil_dagster.infra.failpoints import failpoint
from ragutil_dagster.infra.files import cache_root
from ragutil_dagster.infra.locks import exclusive_file_lock
from ragutil_dagster.metrics.answers import lexical_entailment, shares_answer_content
from ragutil_dagster.models.device import (
    default_nli_dtype,
    resolve_device,
    resolve_dtype,
    warm_up_on_cpu,
    warn_if_bf16_emulated,
)
from ragutil_dagster.models.identity import ModelRef, error_summary
from ragutil_dagster.models.inputs import check_texts, length_batches
from ragutil_dagster.models.resolver import LEXICAL_NLI_IDENTITY, resolve

__all__ = [
    "NLI_LABELS",
    "ContentCheckedJudge",
    "Entailment",
    "EntailmentStats",
    "LexicalJudge",
    "NLICache",
    "nli_label_order",
]

NLI_LABELS: tuple[str, str, str] = ("contradiction", "neutral", "entailment")
NEUTRAL = np.array([0.0, 1.0, 0.0])
"""The row of a pair the content check rejects: [contradiction, neutral, entailment]."""
COMPILE_AFTER_SECONDS = {torch.float32: 40.0, torch.bfloat16: 140.0}
"""On CPU, the model is compiled (``torch.compile``, Inductor; once per instance) as soon as the
eager pace measured so far says the rest of a call would take longer than this, by dtype: where
compiling pays for itself (bench/nli_runtime.py; docs/performance.md). Compiling costs about 20 s
(19.3 s for ``embedded:world-nli`` on a 2-core EPYC, bench/results/nli_runtime_world_nli.json)
and runs float32 1.96× the eager pairs/s there, so it pays when the eager rest exceeds
19.3 / (1 − 1 / 1.96) ≈ 40 s; native bfloat16 gains 1.17× on an AMX Xeon, ≈ 140 s. A rule in
seconds, not pairs: a small cross-encoder judges thousands of pairs a second, a large one tens."""
_PREFIXES = {"contradiction": "contradict", "neutral": "neutral", "entailment": "entail"}


def nli_label_order(
    id2label: Mapping[int | str, str], model_name: str = "the NLI model"
) -> list[int]:
    """Output indices of contradiction, neutral and entailment in a model's ``id2label``.

    Names match case-insensitively by prefix (``CONTRADICTION``, ``contradicts``, ``Entailment``
    ...); a two-way (``not_entailment``) or unnamed (``LABEL_0``) head is an error.
    """
    names = {int(i): str(label).strip().lower() for i, label in id2label.items()}
    order = []
    for label in NLI_LABELS:
        hits = [i for i, name in names.items() if name.startswith(_PREFIXES[label])]
        if len(hits) != 1:
            raise ValueError(
                f"{model_name}: cannot find a unique {label!r} label in id2label {dict(id2label)}; "
                "an NLI model needs contradiction / neutral / entailment outputs"
            )
        order.append(hits[0])
    if len(names) != 3:
        raise ValueError(
            f"{model_name} has {len(names)} labels {dict(id2label)}; expected 3 NLI labels"
        )
    return order


@dataclass
class EagerPace:
    """Padded tokens the eager model ran and the seconds they took, to project a call's rest."""

    tokens: int = 0
    seconds: float = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds

    def seconds_for(self, tokens: int) -> float:
        """Projected eager seconds for ``tokens``; 0 before any batch was timed."""
        return tokens * self.seconds / self.tokens if self.tokens else 0.0


@dataclass
class EntailmentStats:
    """Counts accumulated over an :class:`Entailment`'s calls."""

    pairs: int = 0  # pairs asked for
    unique_pairs: int = 0  # distinct pairs among them (per call, summed)
    cache_hits: int = 0  # distinct pairs found in the on-disk cache
    computed: int = 0  # distinct pairs run through the model
    content_rejected: int = (
        0  # pairs the content check decided without the judge (ContentCheckedJudge)
    )


class NLICache:
    """SQLite store of NLI probabilities keyed by (model key, sha256 of the pair).

    WAL journaling lets many readers work while one process writes; every call opens its own
    short-lived connection, so instances are safe to use from several processes.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Switching a fresh file to WAL needs an exclusive lock that SQLite does not wait for
        # ("database is locked" when processes start together): set up one process at a time.
        with (
            exclusive_file_lock(self.path.with_name(self.path.name + ".lock")),
            closing(self._connect()) as db,
            db,
        ):
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS nli (model TEXT NOT NULL, pair TEXT NOT NULL, "
                "c REAL NOT NULL, n REAL NOT NULL, e REAL NOT NULL, PRIMARY KEY (model, pair)) "
                "WITHOUT ROWID"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=60)

    @staticmethod
    def pair_key(premise: str, hypothesis: str) -> str:
        return hashlib.sha256(f"{len(premise)}:{premise}\x00{hypothesis}".encode()).hexdigest()

    def get(self, model: str, keys: Sequence[str]) -> dict[str, np.ndarray]:
        """Stored probabilities for those ``keys`` that are present and valid."""
        found: dict[str, np.ndarray] = {}
        with closing(self._connect()) as db:
            for start in range(0, len(keys), 500):
                chunk = list(keys[start : start + 500])
                marks = ",".join("?" * len(chunk))
                rows = db.execute(
                    f"SELECT pair, c, n, e FROM nli WHERE model = ? AND pair IN ({marks})",
                    [model, *chunk],
                )
                for pair, c, n, e in rows:
                    probs = np.array([c, n, e], dtype=np.float64)
                    # A damaged row is treated as missing and recomputed.
                    if np.all(np.isfinite(probs)) and abs(probs.sum() - 1) < 1e-3:
                        found[pair] = probs
        return found

    def put(self, model: str, items: Iterable[tuple[str, np.ndarray]]) -> None:
        rows = [(model, key, *map(float, probs)) for key, probs in items]
        with closing(self._connect()) as db, db:
            db.executemany("INSERT OR REPLACE INTO nli VALUES (?, ?, ?, ?, ?)", rows)


class LexicalJudge:
    """The lexical answer judge (``nli: {model: lexical}``) behind the same interface as
    :class:`Entailment`: ``metrics.answers.lexical_entailment``, no model, no cache."""

    identity = LEXICAL_NLI_IDENTITY
    dtype = "none"

    def __init__(self) -> None:
        self.stats = EntailmentStats()

    def __call__(self, premises: Sequence[str], hypotheses: Sequence[str]) -> np.ndarray:
        premises = check_texts(premises, "premises")
        hypotheses = check_texts(hypotheses, "hypotheses")
        self.stats.pairs += len(premises)
        self.stats.computed += len(premises)
        return lexical_entailment(premises, hypotheses)


class ContentCheckedJudge:
    """A judge (:class:`Entailment` or :class:`LexicalJudge`) behind ragutil's content check
    (``nli: {answer_check: content}``): a pair whose answers share no content word
    (``metrics.answers.shares_answer_content``) is neutral, [0, 1, 0], without asking the judge;
    the other pairs get the judge's probabilities.

    Skipping the judge changes no score: the check is symmetric, so both directions of a rejected
    pair lack entailment whatever the judge would say, and SePer reads a pair only through its
    entailment (the soft kernel), entailment both ways (strict clusters) or "no contradiction
    either way and not neutral both ways" (loose), which a pair without entailment either way
    never is. On SQuAD with SmolLM2 the check rejects most of the pairs SePer reads (the NLI step's
    ``nli_pairs_content_rejected``), so most never reach the model."""

    def __init__(self, judge: Entailment | LexicalJudge) -> None:
        self.judge = judge
        self.stats = judge.stats
        self.dtype = judge.dtype
        self.identity = f"{judge.identity}|answer_check=content"

    def __call__(self, premises: Sequence[str], hypotheses: Sequence[str]) -> np.ndarray:
        shared = [shares_answer_content(p, h) for p, h in zip(premises, hypotheses, strict=True)]
        judged = [row for row, passes in enumerate(shared) if passes]
        probs = np.tile(NEUTRAL, (len(premises), 1))
        if judged:
            probs[judged] = self.judge(
                [premises[row] for row in judged], [hypotheses[row] for row in judged]
            )
        self.stats.content_rejected += len(premises) - len(judged)
        return probs


class Entailment:
    """NLI model as the ``entail`` callable of ``metrics.seper``.

    Args:
        model: hub id, local directory or :class:`ModelRef` of a sequence-pair classifier
            (``AutoModelForSequenceClassification``).
        device, dtype: CUDA + float16 when present, else CPU + float32
            (:func:`~ragutil_dagster.models.device.default_nli_dtype`).
        batch_size, max_batch_tokens: at most this many pairs, and padded tokens, per forward
            pass (pairs are batched by token length to limit padding).
        max_length: pairs are truncated to this many tokens.
        cache: ``True`` for the default SQLite file under the ragutil cache directory, a path for
            another file, ``False`` for none.
        trust_remote_code: off unless configured.
        compile_after_seconds: on CPU, compile the model once the eager pace says the rest of a
            call would take longer than this (0: before the first batch); ``"auto"``:
            :data:`COMPILE_AFTER_SECONDS` for the dtype; None never compiles.
    """

    def __init__(
        self,
        model: str | ModelRef,
        *,
        revision: str | None = None,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        batch_size: int = 64,
        max_batch_tokens: int = 4096,
        max_length: int = 512,
        cache: bool | str | Path = True,
        trust_remote_code: bool = False,
        show_progress: bool = True,
        compile_after_seconds: float | Literal["auto"] | None = "auto",
    ) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.ref = model if isinstance(model, ModelRef) else resolve(model, revision)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, default=default_nli_dtype(self.device))
        warn_if_bf16_emulated(self.dtype, self.device, f"NLI model {self.ref.name}")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(
                self.ref.path, trust_remote_code=trust_remote_code
            )
            self.model = AutoModelForSequenceClassification.from_pretrained(
                self.ref.path, dtype=self.dtype, trust_remote_code=trust_remote_code
            )
        except (OSError, ValueError, KeyError) as err:
            raise ModelUnavailableError(
                f"model {self.ref.name} ({self.ref.path}) could not be loaded as an NLI "
                f"classifier: {error_summary(err)}"
            ) from None
        self.model.to(self.device).eval()
        warm_up_on_cpu(self.model, self.device)
        self.order = nli_label_order(self.model.config.id2label, self.ref.name)
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_length = max_length
        self.show_progress = show_progress
        if compile_after_seconds == "auto":
            compile_after_seconds = COMPILE_AFTER_SECONDS.get(self.dtype)
        self.compile_after_seconds = compile_after_seconds if self.device.type == "cpu" else None
        self.eager_model = self.model
        self._eager_pace = EagerPace()
        self.cache = (
            None
            if cache is False
            else NLICache(cache_root() / "nli.sqlite" if cache is True else Path(cache))
        )
        self.stats = EntailmentStats()

    @property
    def identity(self) -> str:
        return self.ref.identity

    @property
    def cache_key(self) -> str:
        """What besides the pair determines the probabilities: weights, truncation, precision."""
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{self.identity}|max_length={self.max_length}|dtype={dtype}"

    def __call__(self, premises: Sequence[str], hypotheses: Sequence[str]) -> np.ndarray:
        """[P(contradiction), P(neutral), P(entailment)] per pair → float64 array (n, 3)."""
        premises = check_texts(premises, "premises")
        hypotheses = check_texts(hypotheses, "hypotheses")
        if len(premises) != len(hypotheses):
            raise ValueError(f"{len(premises)} premises but {len(hypotheses)} hypotheses")
        keys = [NLICache.pair_key(p, h) for p, h in zip(premises, hypotheses, strict=True)]
        first: dict[str, int] = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        known = self.cache.get(self.cache_key, list(first)) if self.cache is not None else {}
        missing = [key for key in first if key not in known]
        if missing:
            probs = self._predict(
                [premises[first[k]] for k in missing], [hypotheses[first[k]] for k in missing]
            )
            fresh = dict(zip(missing, probs, strict=True))
            if self.cache is not None:
                self.cache.put(self.cache_key, fresh.items())
                failpoint("nli")
            known = {**known, **fresh}
        self.stats.pairs += len(keys)
        self.stats.unique_pairs += len(first)
        self.stats.cache_hits += len(first) - len(missing)
        self.stats.computed += len(missing)
        if not keys:
            return np.zeros((0, 3), dtype=np.float64)
        return np.stack([known[key] for key in keys])

    @torch.inference_mode()
    def _predict(self, premises: list[str], hypotheses: list[str]) -> np.ndarray:
        """Model probabilities reordered to [contradiction, neutral, entailment].

        Pairs are tokenised once, sorted by token length and batched under ``batch_size`` rows
        and ``max_batch_tokens`` padded tokens: short pairs go many to a batch, long ones few,
        and no batch pads a short pair to a long one's width.
        """
        encoded = self.tokenizer(premises, hypotheses, truncation=True, max_length=self.max_length)
        lengths = [len(ids) for ids in encoded["input_ids"]]
        out = np.empty((len(premises), 3), dtype=np.float64)
        batches = length_batches(lengths, self.batch_size, self.max_batch_tokens)
        padded = [len(idx) * max(lengths[i] for i in idx) for idx in batches]
        still_to_run = sum(padded)
        for idx, tokens in zip(
            tqdm(
                batches,
                desc="entailment",
                unit="batch",
                disable=not self.show_progress or len(batches) < 2,
            ),
            padded,
            strict=True,
        ):
            self._compile_if_it_pays(still_to_run)
            still_to_run -= tokens
            batch = self.tokenizer.pad(
                [{key: values[i] for key, values in encoded.items()} for i in idx],
                return_tensors="pt",
            ).to(self.device)
            started = time.perf_counter()
            logits = self._logits(batch).float()
            if self.model is self.eager_model:
                self._eager_pace.add(tokens, time.perf_counter() - started)
            probs = torch.softmax(logits, dim=-1)[:, self.order]
            out[idx] = probs.cpu().numpy()
        return out

    def _compile_if_it_pays(self, padded_tokens: int) -> None:
        """Compile before a batch when the eager pace so far says the call's ``padded_tokens``
        still to run would take longer than ``compile_after_seconds`` (once per instance)."""
        limit = self.compile_after_seconds
        if limit is None or (limit > 0 and self._eager_pace.seconds_for(padded_tokens) <= limit):
            return
        self.compile_after_seconds = None
        self.model = torch.compile(self.eager_model, dynamic=True)

    def _logits(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The model's logits; a compiled model that fails (no C++ compiler, an unsupported
        operator) is dropped for the eager one, with a warning, and the batch rerun."""
        try:
            return self.model(**batch).logits
        except Exception as err:
            if self.model is self.eager_model:
                raise
            warnings.warn(
                f"NLI model {self.ref.name}: torch.compile failed ({error_summary(err)}); running it eagerly",
                RuntimeWarning,
                stacklevel=2,
            )
            self.model = self.eager_model
            return self.model(**batch).logits
