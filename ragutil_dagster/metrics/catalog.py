"""The metric catalogue: one entry per metric ragutil reports, carrying what every consumer needs —
the asset checks (bounds), the summary (which per-query columns are averaged), the reports and the
``ragutil run`` table (labels, headline), MLflow logging (bootstrap CIs), the comparison tables and
plots (MIRAGE's symbols, cut-off names). Adding a metric = its function, its row in
``evaluation/paper_scores`` or ``evaluation/summary``, one entry here.

Names are the keys of a partition's summary and, for per-query metrics, the columns of its
per-query table. A name with ``{k}`` is a template: the summary key carries the cut-off
(``erag_P_5``) and cross-run tables name it ``erag_P_at_k`` so that settings with different k
share a column.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ragutil_dagster.metrics.utility import RANKING_METHODS, SELECTION_METHODS, VERBALIZED_METHODS


@dataclass(frozen=True)
class Metric:
    """One reported metric.

    Attributes:
        name: summary key (and per-query column when ``per_query``); ``{k}`` marks a cut-off.
        label: short column header in printed tables.
        paper: the paper it comes from, with the equation / section that defines it.
        bounds: the closed interval every value lies in (checked per query), or None.
        higher_is_better: the direction of "better" (plots and comparisons).
        per_query: a per-query column whose mean over queries is the summary value.
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
    per_query: bool = False
    headline: bool = False
    ci: bool = False
    symbol: str = ""
    needs_qrels: bool = False
    compression_only: bool = False


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
# "", then the paper's split (§3.4: answered closed book or not), then the authors' code's
# (evaluation/known_unknown_performance.py: the gold-utility set empty or not).
_SUBSETS = ("", "_known", "_unknown", "_empty_gold", "_nonempty_gold")

CATALOG: tuple[Metric, ...] = (
    Metric(
        "delta_seper_s",
        "ΔSePer_S",
        f"{_SEPER} eq. 11, soft kernel",
        (-1, 1),
        per_query=True,
        headline=True,
        ci=True,
    ),
    Metric(
        "delta_seper_h",
        "ΔSePer_H",
        f"{_SEPER} eq. 11, hard kernel",
        (-1, 1),
        per_query=True,
        headline=True,
        ci=True,
    ),
    Metric(
        "seper_s_closed",
        "SePer_S cb",
        f"{_SEPER} eq. 9, closed book",
        (0, 1),
        per_query=True,
        headline=True,
        ci=True,
    ),
    Metric(
        "seper_s_rag",
        "SePer_S rag",
        f"{_SEPER} eq. 9, with context",
        (0, 1),
        per_query=True,
        headline=True,
        ci=True,
    ),
    Metric(
        "seper_h_closed",
        "SePer_H cb",
        f"{_SEPER} eq. 9, hard kernel, closed book",
        (0, 1),
        per_query=True,
        ci=True,
    ),
    Metric(
        "seper_h_rag",
        "SePer_H rag",
        f"{_SEPER} eq. 9, hard kernel, with context",
        (0, 1),
        per_query=True,
        ci=True,
    ),
    Metric(
        "semantic_entropy_closed",
        "SE cb",
        f"{_SEPER} Table 2 baseline (Kuhn et al.)",
        higher_is_better=False,
        per_query=True,
    ),
    Metric(
        "semantic_entropy_rag",
        "SE rag",
        f"{_SEPER} Table 2 baseline (Kuhn et al.)",
        higher_is_better=False,
        per_query=True,
    ),
    Metric("em_closed", "EM cb", _QA, (0, 1), per_query=True),
    Metric("em_rag", "EM rag", _QA, (0, 1), per_query=True, headline=True, ci=True),
    Metric("f1_closed", "F1 cb", _QA, (0, 1), per_query=True),
    Metric("f1_rag", "F1 rag", _QA, (0, 1), per_query=True, ci=True),
    Metric("has_answer_closed", "has cb", _QA, (0, 1), per_query=True),
    Metric("has_answer_rag", "has rag", _QA, (0, 1), per_query=True, ci=True),
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
        Metric(f"mirage_retriever_{name}_{{k}}", f"MIRAGE {label}@k", _MIRAGE_RETRIEVER, (0, 1))
        for name, label in (
            ("precision", "P"),
            ("recall", "R"),
            ("f1", "F1"),
            ("ndcg", "NDCG"),
            ("ndcg_retrieved", "NDCG-ret"),
        )
    ),
    Metric("erag_P_{k}", "eRAG P@k", _ERAG, (0, 1)),
    Metric("erag_success_{k}", "eRAG Hit@k", _ERAG, (0, 1)),
    Metric("erag_map", "eRAG MAP", _ERAG, (0, 1), headline=True),
    Metric("erag_recip_rank", "eRAG MRR", _ERAG, (0, 1)),
    Metric("erag_ndcg_cut_{k}", "eRAG NDCG@k", _ERAG, (0, 1)),
    Metric("consens", "ConSens", _CONSENS, (-1, 1), per_query=True, headline=True, ci=True),
    # The rag context's cost and the utility it keeps per token (evaluation/compression.py): every
    # setting counts its context; a compressed one shows fewer tokens. Tables show them beside a
    # compressed setting only: without one they restate k.
    Metric(
        "context_tokens_before",
        "ctx tok",
        f"{_COMPRESSION}: the rag context's tokens as retrieved",
        higher_is_better=False,
        per_query=True,
        headline=True,
        compression_only=True,
    ),
    Metric(
        "context_tokens_after",
        "ctx tok kept",
        f"{_COMPRESSION}: the rag context's tokens as shown (compressed)",
        higher_is_better=False,
        per_query=True,
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
        per_query=True,
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
            f"utility_{source}_{part}{subset}",
            f"util-{_SOURCE_LABELS[source]} {label}{subset.replace('_', ' ')}",
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
        for subset in _SUBSETS
    ),
    *(
        Metric(
            f"utility_{source}_{part}{subset}_{{k}}",
            f"util-{_SOURCE_LABELS[source]} {label}@k{subset.replace('_', ' ')}",
            _utility_paper(source),
            (0, 1),
        )
        for source in ("likelihood", "attention", *RANKING_METHODS)
        for part, label in (("ndcg", "NDCG"), ("recall", "Recall"))
        for subset in _SUBSETS
    ),
    *(
        Metric(
            f"utility_{method}_parse_failure_rate",
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
            f"utility_{source}_rag_has_answer{subset}",
            f"has rag-{_SOURCE_LABELS[source]}{subset.replace('_', ' ')}",
            f"{_UTILITY_RAG}, {'every candidate' if source == 'candidates' else source + ' passages'}",
            (0, 1),
        )
        for source in ("candidates", *VERBALIZED_METHODS)
        for subset in _SUBSETS
    ),
    # SePer Table 2's protocol: judged passages, questions answered closed book left out; all
    # questions and per question type.
    *(
        Metric(
            f"pearson_delta_seper_{kernel}_true_utility{part}",
            f"r(ΔSePer_{kernel.upper()}, truth){label}",
            f"{_SEPER} Table 2 (Pearson r with ground-truth utility){label}",
            (-1, 1),
            headline=(kernel, part) == ("s", ""),
        )
        for kernel in ("s", "h")
        for part, label in (("", ""), ("_single_hop", " single-hop"), ("_multi_hop", " multi-hop"))
    ),
)

_BY_NAME = {metric.name: metric for metric in CATALOG}
assert len(_BY_NAME) == len(CATALOG), "metric names must be unique"
_TEMPLATES = {
    re.compile("^" + re.escape(m.name).replace(re.escape("{k}"), r"\d+") + "$"): m
    for m in CATALOG
    if "{k}" in m.name
}
_BY_GENERIC_NAME = {m.name.replace("{k}", "at_k"): m for m in CATALOG}

SUMMARY_COUNTS = ("queries", "documents")
"""The summary's counts of the partition itself (queries and retrieved documents scored); every
other summary key is a metric, or one of its counts (:func:`summary_entry`)."""


def metric(name: str) -> Metric | None:
    """The catalogue entry of a summary key (cut-off names such as ``erag_P_5`` included)."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    return next((m for pattern, m in _TEMPLATES.items() if pattern.match(name)), None)


def summary_entry(key: str) -> Metric | None:
    """The catalogue entry a summary key reports on: the metric itself (``erag_P_5``), the number
    of values its mean is over (``n_<generic name>``: ``n_erag_P_at_k``) or, for MIRAGE's four,
    the questions its two groups hold (``count_<name>``); None for a key the catalogue does not
    describe."""
    if key.startswith("n_"):
        return _BY_GENERIC_NAME.get(key.removeprefix("n_"))
    if key.startswith("count_"):
        entry = metric(key.removeprefix("count_"))
        return entry if entry in mirage() else None
    return metric(key)


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
    """``name`` with its cut-off replaced by ``at_k``, so settings with different k share a
    column in cross-run tables (``erag_P_5`` → ``erag_P_at_k``) without taking the name of
    another metric (``utility_likelihood_recall_5`` is ranking Recall@k, not the set recall
    ``utility_likelihood_recall``); names without a cut-off are returned unchanged."""
    entry = metric(name)
    return entry.name.replace("{k}", "at_k") if entry is not None and "{k}" in entry.name else name


def per_query_means() -> tuple[str, ...]:
    """Per-query columns whose mean over queries is a summary value."""
    return tuple(m.name for m in CATALOG if m.per_query)


def headline() -> tuple[Metric, ...]:
    """The metrics shown first everywhere (metadata, reports, the ``ragutil run`` table)."""
    return tuple(m for m in CATALOG if m.headline)


def compression_only() -> tuple[str, ...]:
    """Names of the metrics that tables leave out when no setting compresses its context."""
    return tuple(m.name for m in CATALOG if m.compression_only)


def with_ci() -> tuple[str, ...]:
    """Per-query columns logged with a bootstrap 95 % interval."""
    return tuple(m.name for m in CATALOG if m.ci)


def per_query_bounds() -> dict[str, tuple[float, float]]:
    """The range every per-query value of a bounded metric must lie in."""
    return {m.name: m.bounds for m in CATALOG if m.per_query and m.bounds is not None}


def mirage() -> tuple[Metric, ...]:
    """MIRAGE's four RAG-adaptability metrics, in the paper's order (they sum to 1, eq. 6)."""
    order = ("NV", "CA", "CI", "CM")
    return tuple(
        sorted((m for m in CATALOG if m.symbol in order), key=lambda m: order.index(m.symbol))
    )
