"""The metric catalogue: one entry per metric ragutil reports, carrying what every consumer needs —
the asset checks (bounds), the summary (which per-query columns are averaged), the reports and the
``ragutil run`` table (labels, headline), MLflow logging (bootstrap CIs), the comparison tables and
plots (MIRAGE's symbols, cut-off names) and the score tables' schemas (:func:`score_schema`).
A built-in metric is computed in ``evaluation/paper_scores`` or ``evaluation/summary`` and has one
entry here; a metric computed from the per-query table's columns is one module — its function
and a :class:`Metric` with ``query_column`` — and one :func:`register` call (docs/architecture.md).

Names are the columns of a partition's per-query table (per-query metrics) and name the numbers
of its summary. A name ending in ``_{k}`` is a template: the number is at a cut-off. A summary
number's key is a :class:`SummaryKey` — the metric, its cut-off, and whether it is the value, its
n or (MIRAGE) its count — written as a flat name once (:attr:`SummaryKey.flat`: ``erag_P_5``,
``n_erag_P_at_k``) and read back by the one parser beside it (:meth:`SummaryKey.parse`) where
flat names come from outside: summaries logged to MLflow, by older versions too.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import polars as pl

from ragutil_dagster.metrics.erag import ERAG_MEASURES, ERAGMeasure
from ragutil_dagster.metrics.utility import RANKING_METHODS, SELECTION_METHODS, VERBALIZED_METHODS
from ragutil_dagster.tables import (
    DOCUMENT_SCORE_COLUMNS,
    DOCUMENT_SCORE_OPTIONAL_COLUMNS,
    GROUP_SCORE_SCHEMA,
    QUERY_SCORE_COLUMNS,
    QUERY_SCORE_OPTIONAL_COLUMNS,
)

Level = Literal["query", "partition"]


@dataclass(frozen=True)
class Metric:
    """One reported metric.

    Attributes:
        name: the metric's name in its summary keys (:class:`SummaryKey`) and its per-query
            column (level ``query``); a trailing ``_{k}`` marks a cut-off.
        label: short column header in printed tables.
        paper: the paper it comes from, with the equation / section that defines it.
        bounds: the closed interval every value lies in (checked per query), or None.
        higher_is_better: the direction of "better" (plots and comparisons).
        level: ``query`` — a column of the per-query table (``metric_scores``) whose mean over
            queries is the summary value; ``partition`` — a number of the whole partition only.
        per_document: also a column of the per-document table (``document_scores``): the
            metric with the document alone as the context.
        dtype: the column's type in the score tables (level ``query`` / ``per_document``).
        optional: a column only some partitions have (where it was computed).
        query_column: for a metric computed from the per-query table's other columns: the
            function giving its column (:func:`register`); None for a built-in one, which
            ``evaluation/paper_scores`` computes.
        headline: shown in Dagster metadata, reports and the ``ragutil run`` table.
        ci: its mean is logged with a bootstrap 95 % interval over queries.
        symbol: the paper's own symbol (MIRAGE's NV / CA / CI / CM), when tables use it.
        needs_qrels: computed only where the dataset has relevance judgments (never by
            ``ragutil score``, whose records have none).
        compression_only: says something only of a compressed context (SePer's RQ3); tables
            leave it out when no setting compresses.
    """

    name: str
    label: str
    paper: str
    bounds: tuple[float, float] | None = None
    higher_is_better: bool = True
    level: Level = "partition"
    per_document: bool = False
    dtype: pl.DataType = pl.Float64
    optional: bool = False
    headline: bool = False
    ci: bool = False
    symbol: str = ""
    needs_qrels: bool = False
    compression_only: bool = False
    query_column: Callable[[pl.DataFrame], pl.Series] | None = None

    def __post_init__(self) -> None:
        if "{k}" in self.name.removesuffix("_{k}"):
            raise ValueError(f"metric {self.name!r}: a cut-off is marked by a trailing _{{k}}")
        if self.query_column is not None and self.level != "query":
            raise ValueError(f"metric {self.name!r}: a query_column makes a metric of level query")


_SEPER = "SePer (Dai et al., ICLR 2025)"
_MIRAGE = "MIRAGE (Park et al.) §4.2 eqs. 2–5"
_MIRAGE_RETRIEVER = "MIRAGE (Park et al.) Table 2, retriever metrics (retrieval_run metadata)"
_ERAG = "eRAG (Salemi & Zamani, SIGIR 2024) eq. 1 aggregated"
_UTILITY = "LLM-specific utility (Zhang et al., 2025) §3.4"
_UTILITY_RAG = "LLM-specific utility (Zhang et al., 2025) Tables 3 and 7: has_answer of RAG"
_SOURCE_LABELS = {
    "candidates": "all",
    "likelihood": "lik",
    "attention": "att",
    "pointwise": "pt",
    "pointwise_answer": "pt+a",
    "listwise": "lw",
    "listwise_answer": "lw+a",
    "ranking": "rk",
    "ranking_answer": "rk+a",
}


def _utility_paper(source: str) -> str:
    if source == "likelihood":
        return f"{_UTILITY}; selection by ragutil's rule log P(a | q, d) > log P(a | q), not the paper's"
    return _UTILITY


_CONSENS = "ConSens (Vankov et al.) §2"
_CONSENS_EXPERIMENT_3 = "ConSens (Vankov et al.) §3.3, Experiment 3 (leave one document out)"
_QA = "SQuAD-style answer matching (EM / F1 / has_answer)"
_COMPRESSION = f"{_SEPER} §5.4 (RQ3: prompt compression), App. D.1"
UTILITY_SUBSETS = ("", "known", "unknown", "empty_gold", "nonempty_gold")
"""The query subsets LLM-specific utility is reported over: all (""), then the paper's split (§3.4:
answered closed book or not), then the authors' code's (evaluation/known_unknown_performance.py:
the gold-utility set empty or not)."""
VALIDITY_QUESTIONS = ("", "single_hop", "multi_hop")
"""SePer Table 2's question types: all (""), single- and multi-hop."""
MIRAGE_RETRIEVER_MEASURES = {
    "precision": "P",
    "recall": "R",
    "f1": "F1",
    "ndcg": "NDCG",
    "ndcg_retrieved": "NDCG-ret",
}
"""MIRAGE Table 2's retriever measures (``retrieval.runs.mirage_retrieval``'s columns) and labels."""


def _subset_suffix(subset: str) -> str:
    return f"_{subset}" if subset else ""


def utility_metric(source: str, part: str, subset: str = "", at_k: bool = False) -> str:
    """The name of LLM-specific utility's ``part`` (``f1``, ``ndcg``, ``rag_has_answer``,
    ``parse_failure_rate`` …) of ``source`` (a signal or a verbalized method) over the queries of
    ``subset`` (:data:`UTILITY_SUBSETS`), with the cut-off last for a ranking metric:
    ``utility_likelihood_ndcg_known_{k}``."""
    return f"utility_{source}_{part}{_subset_suffix(subset)}{'_{k}' if at_k else ''}"


def validity_metric(kernel: str, questions: str = "") -> str:
    """The name of SePer Table 2's Pearson r of ΔSePer (kernel ``s`` / ``h``) with ground-truth
    utility over the questions of type ``questions`` (:data:`VALIDITY_QUESTIONS`)."""
    return f"pearson_delta_seper_{kernel}_true_utility{_subset_suffix(questions)}"


def mirage_retriever_metric(measure: str) -> str:
    """The name of MIRAGE Table 2's ``measure`` of the retriever, at the setting's k."""
    return f"mirage_retriever_{measure}_{{k}}"


def erag_metric(measure: ERAGMeasure) -> str:
    """The name of eRAG's aggregate ``measure``: ``erag_P_{k}``, ``erag_map``."""
    return f"erag_{measure.name}{'_{k}' if measure.at_k else ''}"


CATALOG: tuple[Metric, ...] = (
    Metric(
        "delta_seper_s",
        "ΔSePer_S",
        f"{_SEPER} eq. 11, soft kernel",
        (-1, 1),
        level="query",
        per_document=True,
        headline=True,
        ci=True,
    ),
    Metric(
        "delta_seper_h",
        "ΔSePer_H",
        f"{_SEPER} eq. 11, hard kernel",
        (-1, 1),
        level="query",
        per_document=True,
        headline=True,
        ci=True,
    ),
    Metric(
        "seper_s_closed",
        "SePer_S cb",
        f"{_SEPER} eq. 9, closed book",
        (0, 1),
        level="query",
        headline=True,
        ci=True,
    ),
    Metric(
        "seper_s_rag",
        "SePer_S rag",
        f"{_SEPER} eq. 9, with context",
        (0, 1),
        level="query",
        headline=True,
        ci=True,
    ),
    Metric(
        "seper_h_closed",
        "SePer_H cb",
        f"{_SEPER} eq. 9, hard kernel, closed book",
        (0, 1),
        level="query",
        ci=True,
    ),
    Metric(
        "seper_h_rag",
        "SePer_H rag",
        f"{_SEPER} eq. 9, hard kernel, with context",
        (0, 1),
        level="query",
        ci=True,
    ),
    Metric(
        "semantic_entropy_closed",
        "SE cb",
        f"{_SEPER} Table 2 baseline (Kuhn et al.)",
        higher_is_better=False,
        level="query",
    ),
    Metric(
        "semantic_entropy_rag",
        "SE rag",
        f"{_SEPER} Table 2 baseline (Kuhn et al.)",
        higher_is_better=False,
        level="query",
    ),
    Metric("em_closed", "EM cb", _QA, (0, 1), level="query"),
    Metric("em_rag", "EM rag", _QA, (0, 1), level="query", headline=True, ci=True),
    Metric("f1_closed", "F1 cb", _QA, (0, 1), level="query"),
    Metric("f1_rag", "F1 rag", _QA, (0, 1), level="query", ci=True),
    Metric("has_answer_closed", "has cb", _QA, (0, 1), level="query"),
    Metric("has_answer_rag", "has rag", _QA, (0, 1), level="query", ci=True),
    Metric(
        "mirage_context_acceptability", "MIRAGE CA", _MIRAGE, (0, 1), headline=True, symbol="CA"
    ),
    Metric(
        "mirage_noise_vulnerability",
        "MIRAGE NV",
        _MIRAGE,
        (0, 1),
        higher_is_better=False,
        headline=True,
        symbol="NV",
    ),
    Metric(
        "mirage_context_insensitivity",
        "MIRAGE CI",
        _MIRAGE,
        (0, 1),
        higher_is_better=False,
        symbol="CI",
    ),
    Metric(
        "mirage_context_misinterpretation",
        "MIRAGE CM",
        _MIRAGE,
        (0, 1),
        higher_is_better=False,
        symbol="CM",
    ),
    *(
        Metric(mirage_retriever_metric(name), f"MIRAGE {label}@k", _MIRAGE_RETRIEVER, (0, 1))
        for name, label in MIRAGE_RETRIEVER_MEASURES.items()
    ),
    *(
        Metric(
            erag_metric(measure),
            f"eRAG {measure.label}",
            _ERAG,
            (0, 1),
            headline=measure.name == "map",
        )
        for measure in ERAG_MEASURES
    ),
    Metric(
        "consens",
        "ConSens",
        _CONSENS,
        (-1, 1),
        level="query",
        optional=True,
        headline=True,
        ci=True,
    ),
    # The rag context's cost and the utility it keeps per token (evaluation/compression.py): every
    # setting counts its context; a compressed one shows fewer tokens. Tables show them beside a
    # compressed setting only: without one they restate k.
    Metric(
        "context_tokens_before",
        "ctx tok",
        f"{_COMPRESSION}: the rag context's tokens as retrieved",
        higher_is_better=False,
        level="query",
        dtype=pl.Int32,
        optional=True,
        headline=True,
        compression_only=True,
    ),
    Metric(
        "context_tokens_after",
        "ctx tok kept",
        f"{_COMPRESSION}: the rag context's tokens as shown (compressed)",
        higher_is_better=False,
        level="query",
        dtype=pl.Int32,
        optional=True,
        headline=True,
        compression_only=True,
    ),
    Metric(
        "compression_ratio",
        "kept",
        f"{_COMPRESSION}: context tokens after / before, summed over queries",
        higher_is_better=False,
        headline=True,
        compression_only=True,
    ),
    Metric(
        "delta_seper_s_per_100_context_tokens",
        "ΔSePer_S/100tok",
        f"{_SEPER} eq. 11 per 100 context tokens (§5.4, RQ3): 100 · mean ΔSePer_S / mean context tokens kept",
        headline=True,
        compression_only=True,
    ),
    Metric(
        "delta_seper_h_per_100_context_tokens",
        "ΔSePer_H/100tok",
        f"{_SEPER} eq. 11, hard kernel, per 100 context tokens (§5.4, RQ3)",
        compression_only=True,
    ),
    # Only with sampling.adaptive (evaluation/prompt_sampling.py): the estimator's cost beside its numbers.
    Metric(
        "sample_fraction",
        "samples drawn",
        "ragutil's adaptive sampling (docs/metrics.md): samples drawn over "
        "N per prompt, both conditions; early stopping biases SePer low",
        (0, 1),
        higher_is_better=False,
        headline=True,
    ),
    # Experiment 3 (consens.leave_one_out): each passage left out of the context in turn, over the
    # retrieval hits (a relevant passage and another among those scored).
    Metric(
        "consens_loo_auc",
        "ConSens LOO AUC",
        f"{_CONSENS_EXPERIMENT_3}, ROC AUC as Fig. 3 pairs the contexts",
        (0, 1),
    ),
    Metric(
        "consens_loo_lowest",
        "ConSens LOO lowest",
        f"{_CONSENS_EXPERIMENT_3}: removing the relevant passage gives the lowest ConSens",
        (0, 1),
        level="query",
        optional=True,
        ci=True,
        needs_qrels=True,
    ),
    Metric(
        "consens_loo_attribution_auc",
        "ConSens attr AUC",
        f"{_CONSENS_EXPERIMENT_3}; ROC AUC of the per-passage "
        "attribution ConSens(C) − ConSens(C \\ d), pooled over passages: ragutil's reading",
        (0, 1),
    ),
    # Each utility metric over the candidates, over all queries, over the known / unknown ones
    # (§3.4: answered, or not, by the generator's own judged closed-book answer) and over the
    # queries with an empty / a non-empty gold-utility set (the authors' code's known / unknown).
    *(
        Metric(
            utility_metric(source, part, subset),
            f"util-{_SOURCE_LABELS[source]} {label}{_subset_suffix(subset).replace('_', ' ')}",
            _utility_paper(source),
            (0, 1),
            headline=(source, part, subset) == ("listwise_answer", "f1", ""),
        )
        for source in (
            "likelihood",
            *SELECTION_METHODS,
        )  # attention only ranks (§3.3.2): no selection
        for part, label in (
            ("precision", "P"),
            ("recall", "R"),
            ("f1", "F1"),
            ("accuracy_empty", "acc∅"),
        )
        for subset in UTILITY_SUBSETS
    ),
    *(
        Metric(
            utility_metric(source, part, subset, at_k=True),
            f"util-{_SOURCE_LABELS[source]} {label}@k{_subset_suffix(subset).replace('_', ' ')}",
            _utility_paper(source),
            (0, 1),
        )
        for source in ("likelihood", "attention", *RANKING_METHODS)
        for part, label in (("ndcg", "NDCG"), ("recall", "Recall"))
        for subset in UTILITY_SUBSETS
    ),
    *(
        Metric(
            utility_metric(method, "parse_failure_rate"),
            f"util-{_SOURCE_LABELS[method]} unparsed",
            f"{_UTILITY}: verbalized answers not in the format of App. A",
            (0, 1),
            higher_is_better=False,
            headline=method == "listwise_answer",
        )
        for method in VERBALIZED_METHODS
    ),
    *(
        Metric(
            utility_metric(source, "rag_has_answer", subset),
            f"has rag-{_SOURCE_LABELS[source]}{_subset_suffix(subset).replace('_', ' ')}",
            f"{_UTILITY_RAG}, {'every candidate' if source == 'candidates' else source + ' passages'}",
            (0, 1),
        )
        for source in ("candidates", *VERBALIZED_METHODS)
        for subset in UTILITY_SUBSETS
    ),
    # SePer Table 2's protocol: judged passages, questions answered closed book left out; all
    # questions and per question type.
    *(
        Metric(
            validity_metric(kernel, questions),
            f"r(ΔSePer_{kernel.upper()}, truth){label}",
            f"{_SEPER} Table 2 (Pearson r with ground-truth utility){label}",
            (-1, 1),
            headline=(kernel, questions) == ("s", ""),
        )
        for kernel in ("s", "h")
        for questions, label in zip(VALIDITY_QUESTIONS, ("", " single-hop", " multi-hop"))
    ),
)

_REGISTERED: list[Metric] = []


def entries() -> tuple[Metric, ...]:
    """Every metric ragutil reports: the built-in ``CATALOG``, then the registered ones."""
    return (*CATALOG, *_REGISTERED)


SummaryKind = Literal["value", "n", "count"]


@dataclass(frozen=True)
class SummaryKey:
    """The key of one number of a partition's summary, structured.

    Attributes:
        metric: the catalogue entry's name (``erag_P_{k}``, ``utility_likelihood_f1_known``).
        k: the cut-off of a template metric's value; None for a metric without one, and for the
            column that settings of every k share in cross-run tables (``erag_P_at_k``).
        kind: ``value`` — the metric itself; ``n`` — how many values its mean is over (one for
            every k); ``count`` — for MIRAGE's four, how many questions its two groups hold.
    """

    metric: str
    k: int | None = None
    kind: SummaryKind = "value"

    def __post_init__(self) -> None:
        if self.k is not None and (self.kind != "value" or not self.metric.endswith("_{k}")):
            raise ValueError(f"{self}: only the value of a metric named …_{{k}} has a cut-off")

    @property
    def n(self) -> SummaryKey:
        """The key of how many values this metric's mean is over."""
        return SummaryKey(self.metric, kind="n")

    @property
    def flat(self) -> str:
        """The one rendering of a key as summaries, MLflow and tables name it: ``erag_P_5``,
        ``n_erag_P_at_k``, ``count_mirage_context_acceptability``."""
        name = self.metric.replace("{k}", "at_k" if self.k is None else str(self.k))
        return name if self.kind == "value" else f"{self.kind}_{name}"

    @classmethod
    def parse(cls, flat: str) -> SummaryKey | None:
        """The key a partition summary's ``flat`` name renders (:attr:`flat` inverted), for a
        summary read back from outside — an MLflow run's, logged perhaps by an older version;
        None for a name that is no key of a catalogued metric."""
        return _INDEX.keys.get(flat) or _at_cut_off(flat, _INDEX.by_name)


def _at_cut_off(flat: str, by_name: dict[str, Metric]) -> SummaryKey | None:
    """The value of a template metric at a cut-off, ``erag_P_5``, or None."""
    stem, _, cut = flat.rpartition("_")
    template = f"{stem}_{{k}}"
    if cut.isascii() and cut.isdigit() and cut[0] != "0" and template in by_name:
        return SummaryKey(template, int(cut))
    return None


_MIRAGE_SYMBOLS = ("NV", "CA", "CI", "CM")


@dataclass(frozen=True)
class _Index:
    by_name: dict[str, Metric]
    keys: dict[str, SummaryKey]
    """Every summary key without a cut-off, by its flat name."""

    @classmethod
    def of(cls, metrics: tuple[Metric, ...]) -> _Index:
        by_name = {m.name: m for m in metrics}
        if len(by_name) != len(metrics):
            names = [m.name for m in metrics]
            repeated = sorted({name for name in names if names.count(name) > 1})
            raise ValueError(f"metric names must be unique; repeated: {repeated}")
        keys = [
            key
            for m in metrics
            for key in (
                SummaryKey(m.name, kind="n"),
                *(() if m.name.endswith("_{k}") else (SummaryKey(m.name),)),
                *((SummaryKey(m.name, kind="count"),) if m.symbol in _MIRAGE_SYMBOLS else ()),
            )
        ]
        flat = {key.flat: key for key in keys}
        clashes = [key for key in keys if flat[key.flat] != key or _at_cut_off(key.flat, by_name)]
        if clashes:
            raise ValueError(f"summary keys of two metrics read the same: {clashes}")
        return cls(by_name, flat)


_INDEX = _Index.of(CATALOG)


def register(entry: Metric) -> Metric:
    """Add ``entry`` to the catalogue — a metric of level ``query`` with a ``query_column``
    function, which ``evaluation/paper_scores.query_scores`` applies to every per-query table —
    and return it. From then on the score tables' schema, the summary (its mean with its n), the
    asset checks (its bounds), the reports, MLflow (its CI when ``ci``), ``ragutil score``'s keys
    and the comparison tables read it as any built-in metric. A name already taken is a
    ValueError."""
    global _INDEX
    if entry.query_column is None:
        raise ValueError(
            f"metric {entry.name!r}: a registered metric needs a query_column (built-in metrics "
            "are computed in evaluation/ and listed in CATALOG)"
        )
    if entry.per_document:
        raise ValueError(
            f"metric {entry.name!r}: a registered metric is computed from the per-query table; "
            "it has no per-document column"
        )
    _INDEX = _Index.of((*entries(), entry))
    _REGISTERED.append(entry)
    return entry


SUMMARY_COUNTS = ("queries", "documents")
"""The summary's counts of the partition itself (queries and retrieved documents scored); every
other summary key is a metric, or one of its counts (:func:`summary_entry`)."""


def metric(name: str) -> Metric | None:
    """The catalogue entry named ``name``, or of the summary value ``name`` (``erag_P_5``)."""
    if name in _INDEX.by_name:
        return _INDEX.by_name[name]
    key = SummaryKey.parse(name)
    return _INDEX.by_name[key.metric] if key is not None and key.kind == "value" else None


def summary_entry(key: str) -> Metric | None:
    """The catalogue entry a flat summary key reports on (:meth:`SummaryKey.parse`): its value
    (``erag_P_5``), its n (``n_erag_P_at_k``) or its count (``count_<MIRAGE metric>``); None for
    a key the catalogue does not describe."""
    parsed = SummaryKey.parse(key)
    return _INDEX.by_name[parsed.metric] if parsed is not None else None


def validate_summary(summary: dict[str, float]) -> dict[str, float]:
    """``summary`` unchanged when the catalogue describes every key (``SUMMARY_COUNTS`` or
    :func:`summary_entry`), else a ValueError naming the keys it does not."""
    unknown = [key for key in summary if key not in SUMMARY_COUNTS and summary_entry(key) is None]
    if unknown:
        raise ValueError(
            f"summary keys missing from the metric catalogue (metrics/catalog.py): {unknown}"
        )
    return summary


def generic_name(name: str) -> str:
    """The flat summary key ``name`` with its cut-off read ``at_k``, so settings with different k
    share a column in cross-run tables (``erag_P_5`` → ``erag_P_at_k``) without taking the name
    of another metric (``utility_likelihood_recall_5`` is ranking Recall@k, not the set recall
    ``utility_likelihood_recall``); any other name is returned unchanged."""
    key = SummaryKey.parse(name)
    return dataclasses.replace(key, k=None).flat if key is not None else name


def per_query_means() -> tuple[str, ...]:
    """Per-query columns (level ``query``) whose mean over queries is a summary value."""
    return tuple(m.name for m in entries() if m.level == "query")


def headline() -> tuple[Metric, ...]:
    """The metrics shown first everywhere (metadata, reports, the ``ragutil run`` table)."""
    return tuple(m for m in entries() if m.headline)


def compression_only() -> tuple[str, ...]:
    """Names of the metrics that tables leave out when no setting compresses its context."""
    return tuple(m.name for m in entries() if m.compression_only)


def with_ci() -> tuple[str, ...]:
    """Per-query columns logged with a bootstrap 95 % interval."""
    return tuple(m.name for m in entries() if m.ci)


def per_query_bounds() -> dict[str, tuple[float, float]]:
    """The range every per-query value of a bounded metric must lie in."""
    return {m.name: m.bounds for m in entries() if m.level == "query" and m.bounds is not None}


def mirage() -> tuple[Metric, ...]:
    """MIRAGE's four RAG-adaptability metrics, in the paper's order (they sum to 1, eq. 6)."""
    return tuple(
        sorted(
            (m for m in entries() if m.symbol in _MIRAGE_SYMBOLS),
            key=lambda m: _MIRAGE_SYMBOLS.index(m.symbol),
        )
    )


def registered_fingerprint() -> str:
    """What the registered metrics are and compute — each entry and its function's source — for
    the skip rule's code version (``skip_unchanged.code_version``): registering one, or editing
    its function, re-runs the scores."""
    return "\n".join(
        f"{dataclasses.replace(m, query_column=None)!r}\n{inspect.getsource(m.query_column)}"
        for m in _REGISTERED
    )


def query_columns() -> tuple[Metric, ...]:
    """The registered metrics, each computed from the per-query table's columns (:func:`register`
    refuses one without a ``query_column``)."""
    return tuple(_REGISTERED)


def score_schema(table: str) -> tuple[dict[str, pl.DataType], dict[str, pl.DataType]]:
    """The columns score table ``table`` always has and those it may have, with their dtypes:
    its columns that are no metric (``tables.py``) and its catalogued metrics — level ``query``
    for ``metric_scores``, ``per_document`` for ``document_scores`` (optional ones where
    ``optional``, and every registered one: a table scored before its registration lacks it);
    ``group_scores`` holds no catalogued metric."""
    if table == "group_scores":
        return dict(GROUP_SCORE_SCHEMA), {}
    if table == "metric_scores":
        base, maybe = QUERY_SCORE_COLUMNS, QUERY_SCORE_OPTIONAL_COLUMNS
        metrics = [m for m in entries() if m.level == "query"]
    elif table == "document_scores":
        base, maybe = DOCUMENT_SCORE_COLUMNS, DOCUMENT_SCORE_OPTIONAL_COLUMNS
        metrics = [m for m in entries() if m.per_document]
    else:
        raise ValueError(f"no score table {table!r}: group_scores, metric_scores, document_scores")
    return (
        {**base, **{m.name: m.dtype for m in metrics if not (m.optional or m.query_column)}},
        {**maybe, **{m.name: m.dtype for m in metrics if m.optional or m.query_column}},
    )


def validate_scores(table: str, frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` unchanged when it keeps the schema of score table ``table``
    (:func:`score_schema`): every column it always has, others only among those it may have,
    each of its declared dtype; else a ValueError naming every breach."""
    schema, optional = score_schema(table)
    declared = {**schema, **optional}
    problems = [f"missing column {name!r}" for name in schema if name not in frame.columns]
    problems += [f"undeclared column {name!r}" for name in frame.columns if name not in declared]
    problems += [
        f"column {name!r} is {dtype}, declared {declared[name]}"
        for name, dtype in frame.schema.items()
        if name in declared and dtype != declared[name]
    ]
    if problems:
        raise ValueError(
            f"{table} breaks its schema (tables.py and metrics/catalog.py): " + "; ".join(problems)
        )
    return frame
