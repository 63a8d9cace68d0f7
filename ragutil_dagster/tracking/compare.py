"""Cross-run comparison: the tables the papers print, paired tests between retrievers, plots.

- ΔSePer_S / ΔSePer_H and SePer_S with context by retriever × k × generator, one row per dataset
  × retriever and one column per k × generator (SePer App. C, Tables 10–11);
- MIRAGE's four metrics (percent) by k, generator and retriever (MIRAGE Table 1);
- eRAG aggregates and LLM-specific-utility set / rank metrics by retriever;
- the best setting of each headline metric per dataset × generator, in the metric's direction;
- paired bootstrap 95% intervals and paired permutation p-values of the per-query ΔSePer_S
  difference between every two retrievers on the same queries (same dataset, k, generator), and
  which of the two is better where the interval excludes 0;
- with a validity section, SePer Table 2: every per-passage measure's point-biserial r and ROC
  AUC against the judgments, one column per run;
- LLM-specific utility's Table 1 — has_answer with no passage, the top k, the candidates, the
  human-annotated passage, each generator's gold-utility passages (the transfer of Figure 2) — and
  the overlap of every two generators' gold-utility sets (evaluation/transfer.py);
- with multi-step rounds, ΔSePer after each round of a chain and its gain over the round before,
  with bootstrap 95% intervals (``multistep``; evaluation/multistep.round_gains).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from ragutil_dagster.config import Setting
from ragutil_dagster.evaluation.multistep import round_gains
from ragutil_dagster.evaluation.predictors import figure_one, table_one
from ragutil_dagster.evaluation.validity import table_two_across
from ragutil_dagster.infra.files import atomic_write
from ragutil_dagster.metrics import catalog
from ragutil_dagster.metrics.catalog import SummaryKey
from ragutil_dagster.metrics.stats import (
    bootstrap_mean_ci,
    bootstrap_paired_diff_ci,
    paired_permutation_test,
)
from ragutil_dagster.tables import markdown_table
from ragutil_dagster.tracking import plots
from ragutil_dagster.tracking.keys import mlflow_experiment_name
from ragutil_dagster.tracking.resource import MlflowTracking, TrackedRun

WIDE_TABLES = {
    "delta_seper_s": "ΔSePer_S by retriever × k × generator (SePer Table 11 layout)",
    "delta_seper_h": "ΔSePer_H by retriever × k × generator (SePer Table 11 layout)",
    "seper_s_rag": "SePer_S with context by retriever × k × generator (SePer Table 10 layout)",
}
MIRAGE_COLUMNS = {m.name: m.symbol for m in catalog.mirage()}


@dataclass(frozen=True)
class PartitionScores:
    """One materialised ``metric_scores`` partition: its summary, per-query table and MLflow run."""

    setting: Setting
    generator: str
    summary: dict[str, float]
    per_query: pl.DataFrame
    mlflow_run_id: str = ""
    correlations: pl.DataFrame | None = None  # eRAG Table 1 (RETRIEVAL_CORRELATION_SCHEMA)
    validity: pl.DataFrame | None = None  # the validity step's table (VALIDITY_SCHEMA)
    transfer: pl.DataFrame | None = None  # LLM-specific utility Table 1 (UTILITY_TRANSFER_SCHEMA)
    overlap: pl.DataFrame | None = None  # ... and its gold sets' overlap (UTILITY_OVERLAP_SCHEMA)
    # The run's prompt parameters (tracking/keys.prompt_params): which template each role used.
    prompts: dict[str, str] = field(default_factory=dict)

    @property
    def retriever_label(self) -> str:
        """The retriever with what follows it before generation: ``bm25+bge`` (a reranker),
        ``bm25+truncate-64`` (a compressor), ``bm25+step-2`` (multi-step round 2). A compressed
        setting or a later round is a row of its own in every by-retriever table and paired with
        its one-round retriever in the paired tests."""
        setting = self.setting
        return "+".join(
            [
                setting.retriever,
                *(
                    name
                    for name in (setting.reranker, setting.compressor, setting.round_name)
                    if name
                ),
            ]
        )


@dataclass(frozen=True)
class Comparison:
    """Named comparison tables (Polars) and their titles, in display order."""

    tables: dict[str, pl.DataFrame]
    titles: dict[str, str] = field(default_factory=dict)

    def markdown(self) -> str:
        return "\n\n".join(
            f"### {self.titles.get(name, name)}\n\n{markdown_table(table)}"
            for name, table in self.tables.items()
        )


def _normalised(summary: dict[str, float]) -> dict[str, float]:
    """A logged summary — flat names, perhaps of an older version — with its cut-offs read
    ``at_k`` (the one parser, ``catalog.generic_name``)."""
    return {catalog.generic_name(name): value for name, value in summary.items()}


def long_table(partitions: Iterable[PartitionScores]) -> pl.DataFrame:
    """One row per partition: dataset, retriever, k, generator, MLflow run id and every summary
    number (cut-off suffixes of eRAG / utility names read ``at_k``, so k values share columns)."""
    rows = [
        {
            "dataset": p.setting.dataset,
            "retriever": p.retriever_label,
            "k": p.setting.k,
            "generator": p.generator,
            "mlflow_run_id": p.mlflow_run_id,
            **_normalised(p.summary),
        }
        for p in partitions
    ]
    if not rows:
        raise ValueError("nothing to compare: no metric_scores partition has been materialised")
    return pl.DataFrame(rows, infer_schema_length=None).sort(
        "dataset", "retriever", "k", "generator"
    )


def wide_table(long: pl.DataFrame, column: str) -> pl.DataFrame:
    """``column`` with rows dataset × retriever and one column per ``k=<k> <generator>``."""
    cells = long.select(
        "dataset",
        "retriever",
        pl.format("k={} {}", "k", "generator").alias("cell"),
        "k",
        "generator",
        pl.col(column) if column in long.columns else pl.lit(None, pl.Float64).alias(column),
    ).sort("k", "generator")
    return cells.pivot(
        "cell",
        index=["dataset", "retriever"],
        values=column,
        aggregate_function="first",
        maintain_order=True,
    ).sort("dataset", "retriever")


def mirage_table(long: pl.DataFrame) -> pl.DataFrame:
    """MIRAGE Table 1: per dataset, k, generator and retriever, the four metrics in percent,
    each with the questions it counts, and the questions with an oracle (n)."""
    present = {c: label for c, label in MIRAGE_COLUMNS.items() if c in long.columns}
    counts = [
        pl.col(count).cast(pl.Int64).alias(f"{label} count")
        for c, label in present.items()
        if (count := SummaryKey(c, kind="count").flat) in long.columns
    ]
    total = [
        pl.col(n).cast(pl.Int64).alias("n")
        for c in list(present)[:1]
        if (n := SummaryKey(c, kind="n").flat) in long.columns
    ]
    return long.select(
        "dataset",
        "k",
        "generator",
        "retriever",
        *[(pl.col(c) * 100).alias(label) for c, label in present.items()],
        *counts,
        *total,
    ).sort("dataset", "k", "generator", "retriever")


def erag_utility_table(long: pl.DataFrame) -> pl.DataFrame:
    """eRAG aggregates (eRAG §3) and utility set / rank metrics (LLM-specific utility §3.4) by
    retriever, then k and generator."""
    columns = [c for c in long.columns if c.startswith(("erag_", "utility_"))]
    return long.select("dataset", "retriever", "k", "generator", *sorted(columns)).sort(
        "dataset", "retriever", "k", "generator"
    )


def mirage_retrieval_table(long: pl.DataFrame) -> pl.DataFrame:
    """MIRAGE Table 2: the retriever's precision, recall, F1 and NDCG@k (both ideals), percent,
    per dataset, retriever and k, with the queries they are over."""
    keys = {
        m: SummaryKey(catalog.mirage_retriever_metric(m)) for m in catalog.MIRAGE_RETRIEVER_MEASURES
    }
    present = {m: key for m, key in keys.items() if key.flat in long.columns}
    if not present:
        return pl.DataFrame()
    first = next(iter(present.values()))  # the five share their n: the queries with positives
    return (
        long.select(
            "dataset",
            "retriever",
            "k",
            *[(pl.col(key.flat) * 100).alias(m) for m, key in present.items()],
            pl.col(first.n.flat).cast(pl.Int64).alias("n"),
        )
        .unique(["dataset", "retriever", "k"], keep="first")
        .sort("dataset", "retriever", "k")
    )


def best_settings(long: pl.DataFrame) -> pl.DataFrame:
    """Per dataset × generator and headline metric, the setting (retriever × k) with the best
    value in the metric's direction (``Metric.higher_is_better``), with the metric's paper and how
    many settings it was chosen among; a metric every setting ties on (closed-book SePer) has
    no best setting and no row."""
    rows = []
    for (dataset, generator), part in long.group_by("dataset", "generator", maintain_order=True):
        for entry in catalog.headline():
            column = SummaryKey(entry.name).flat  # of every k
            if column not in part.columns:
                continue
            scored = part.filter(pl.col(column).is_not_null())
            if scored.is_empty() or scored[column].min() == scored[column].max():
                continue
            best = scored.sort(column, descending=entry.higher_is_better).row(0, named=True)
            rows.append(
                {
                    "dataset": dataset,
                    "generator": generator,
                    "metric": entry.label,
                    "better": "higher" if entry.higher_is_better else "lower",
                    "retriever": best["retriever"],
                    "k": best["k"],
                    "value": best[column],
                    "settings": scored.height,
                    "paper": entry.paper,
                }
            )
    schema = {
        "dataset": pl.String,
        "generator": pl.String,
        "metric": pl.String,
        "better": pl.String,
        "retriever": pl.String,
        "k": pl.Int64,
        "value": pl.Float64,
        "settings": pl.Int64,
        "paper": pl.String,
    }
    return pl.DataFrame(rows, schema=schema, orient="row").sort(
        "dataset", "generator", maintain_order=True
    )


def _labelled_correlations(partitions: Iterable[PartitionScores]) -> pl.DataFrame:
    """Every partition's eRAG Table 1 rows with its dataset, retriever and generator."""
    tables = [
        p.correlations.with_columns(
            dataset=pl.lit(p.setting.dataset),
            retriever=pl.lit(p.retriever_label),
            generator=pl.lit(p.generator),
        )
        for p in partitions
        if p.correlations is not None
    ]
    return pl.concat(tables) if tables else pl.DataFrame()


def _labelled_validity(partitions: Iterable[PartitionScores]) -> pl.DataFrame:
    """Every partition's validity rows with its dataset, retriever, k and generator."""
    tables = [
        p.validity.with_columns(
            dataset=pl.lit(p.setting.dataset),
            retriever=pl.lit(p.retriever_label),
            k=pl.lit(p.setting.k),
            generator=pl.lit(p.generator),
        )
        for p in partitions
        if p.validity is not None
    ]
    return pl.concat(tables) if tables else pl.DataFrame()


def erag_table(correlations: pl.DataFrame) -> pl.DataFrame:
    """eRAG Table 1 per setting × generator: each retrieval evaluation's Kendall τ and Spearman
    ρ with the rag condition's EM, bootstrap 95% intervals and n."""
    if correlations.is_empty():
        return correlations
    parts = correlations.partition_by(
        ["dataset", "retriever", "k", "generator"], as_dict=True, maintain_order=True
    )
    return pl.concat(
        [
            table_one(part).select(
                pl.lit(key[0]).alias("dataset"),
                pl.lit(key[1]).alias("retriever"),
                pl.lit(key[2]).alias("k"),
                pl.lit(key[3]).alias("generator"),
                pl.all(),
            )
            for key, part in sorted(parts.items())
        ]
    )


def delta_seper_intervals(partitions: Iterable[PartitionScores], seed: int = 0) -> pl.DataFrame:
    """Mean per-query ΔSePer_S with its bootstrap 95% interval, per partition."""
    rows = []
    for p in partitions:
        values = p.per_query["delta_seper_s"].drop_nulls().to_numpy()
        if values.size < 2:
            continue
        interval = bootstrap_mean_ci(values, seed=seed)
        rows.append(
            {
                "dataset": p.setting.dataset,
                "retriever": p.retriever_label,
                "k": p.setting.k,
                "generator": p.generator,
                "label": f"{p.setting.dataset}/{p.retriever_label}/k={p.setting.k}",
                "queries": int(values.size),
                "mean": interval.estimate,
                "low": interval.low,
                "high": interval.high,
            }
        )
    schema = {
        "dataset": pl.String,
        "retriever": pl.String,
        "k": pl.Int64,
        "generator": pl.String,
        "label": pl.String,
        "queries": pl.Int64,
        "mean": pl.Float64,
        "low": pl.Float64,
        "high": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema).sort("dataset", "retriever", "k", "generator")


def paired_retriever_tests(
    partitions: Iterable[PartitionScores], column: str = "delta_seper_s", seed: int = 0
) -> pl.DataFrame:
    """Every two retrievers on the same dataset, k, reranker and generator: mean per-query
    ``column`` of each, the mean difference (a − b) with its paired bootstrap 95% interval
    (queries resampled jointly), the two-sided paired permutation p-value, over the queries
    both scored, and ``better``: the retriever ahead in the direction of ``column``'s catalogue
    entry where the interval excludes 0, else null."""
    higher_is_better = catalog.metric(column).higher_is_better
    groups: dict[tuple, list[PartitionScores]] = {}
    for p in partitions:
        groups.setdefault(
            (p.setting.dataset, p.setting.k, p.setting.reranker, p.generator), []
        ).append(p)
    rows = []
    for (dataset, k, _, generator), members in sorted(
        groups.items(), key=lambda item: str(item[0])
    ):
        for a, b in itertools.combinations(sorted(members, key=lambda p: p.retriever_label), 2):
            joined = (
                a.per_query.select("query_id", pl.col(column).alias("a"))
                .join(b.per_query.select("query_id", pl.col(column).alias("b")), on="query_id")
                .drop_nulls()
            )
            if joined.height < 2:
                continue
            x, y = joined["a"].to_numpy(), joined["b"].to_numpy()
            interval = bootstrap_paired_diff_ci(x, y, seed=seed)
            test = paired_permutation_test(x, y, seed=seed)
            a_ahead = interval.low > 0 if higher_is_better else interval.high < 0
            b_ahead = interval.high < 0 if higher_is_better else interval.low > 0
            rows.append(
                {
                    "dataset": dataset,
                    "k": k,
                    "generator": generator,
                    "retriever_a": a.retriever_label,
                    "retriever_b": b.retriever_label,
                    "queries": joined.height,
                    "mean_a": float(x.mean()),
                    "mean_b": float(y.mean()),
                    "difference": interval.estimate,
                    "ci_low": interval.low,
                    "ci_high": interval.high,
                    "p_value": test.pvalue,
                    "better": a.retriever_label
                    if a_ahead
                    else b.retriever_label
                    if b_ahead
                    else None,
                }
            )
    schema = {
        "dataset": pl.String,
        "k": pl.Int64,
        "generator": pl.String,
        "retriever_a": pl.String,
        "retriever_b": pl.String,
        "queries": pl.Int64,
        "mean_a": pl.Float64,
        "mean_b": pl.Float64,
        "difference": pl.Float64,
        "ci_low": pl.Float64,
        "ci_high": pl.Float64,
        "p_value": pl.Float64,
        "better": pl.String,
    }
    return pl.DataFrame(rows, schema=schema)


def multistep_table(partitions: Iterable[PartitionScores], seed: int = 0) -> pl.DataFrame:
    """Every multi-step chain — one setting's rounds 1, 2, … (round 1: the one-round setting) with
    one generator — as one row per round (``round_gains``): ΔSePer after the round, its gain over
    the round before, context tokens; for all questions and, where the dataset types its questions
    (the synthetic world's single_hop / two_hop), per type. A chain is read up to its first round
    not scored yet; a setting without later rounds is no chain."""
    chains: dict[tuple, dict[int, PartitionScores]] = {}
    for p in partitions:
        s = p.setting
        if s.compressor is None:
            chains.setdefault((s.dataset, s.retriever, s.k, s.reranker, p.generator), {})[
                s.step or 1
            ] = p
    tables = []
    for (dataset, retriever, k, reranker, generator), rounds in sorted(chains.items(), key=str):
        scored = list(itertools.takewhile(lambda step: step in rounds, itertools.count(1)))
        if len(scored) < 2:
            continue
        per_round = [rounds[step].per_query for step in scored]
        kinds = (
            sorted(set().union(*(t["type"].drop_nulls().unique() for t in per_round)))
            if "type" in per_round[0].columns
            else []
        )
        for questions in ["all", *kinds]:
            chosen = (
                per_round
                if questions == "all"
                else [t.filter(pl.col("type") == questions) for t in per_round]
            )
            tables.append(
                round_gains(chosen, seed).select(
                    pl.lit(dataset).alias("dataset"),
                    pl.lit("+".join([retriever, *([reranker] if reranker else [])])).alias(
                        "retriever"
                    ),
                    pl.lit(k, pl.Int64).alias("k"),
                    pl.lit(generator).alias("generator"),
                    pl.lit(questions).alias("questions"),
                    pl.all(),
                )
            )
    return pl.concat(tables) if tables else pl.DataFrame()


def _setting_columns(p: PartitionScores) -> dict[str, object]:
    return {
        "dataset": p.setting.dataset,
        "retriever": p.retriever_label,
        "k": p.setting.k,
        "generator": p.generator,
    }


def utility_table_one(partitions: Iterable[PartitionScores]) -> pl.DataFrame:
    """LLM-specific utility Table 1 with the transfer (Figure 2): per partition, has_answer (%) of
    the generator's answer with each context over the same questions, and the mean size of each
    gold-utility set (``<context> passages``)."""
    rows = []
    for p in partitions:
        if p.transfer is None or p.transfer.is_empty():
            continue
        row = {**_setting_columns(p), "questions": p.transfer["query_id"].n_unique()}
        for (context,), part in p.transfer.group_by("context", maintain_order=True):
            row[str(context)] = 100 * float(part["has_answer"].mean())
            if part["passages"].null_count() < part.height:
                row[f"{context} passages"] = float(part["passages"].mean())
        rows.append(row)
    if not rows:
        return pl.DataFrame()
    return pl.DataFrame(rows, infer_schema_length=None).sort(
        "dataset", "retriever", "k", "generator"
    )


def utility_overlap(partitions: Iterable[PartitionScores]) -> pl.DataFrame:
    """Per partition and other generator: how far their gold-utility sets agree (Jaccard, shared
    passages, the share of each one's gold passages useless to the other)."""
    frames = [
        p.overlap.select(*(pl.lit(v).alias(k) for k, v in _setting_columns(p).items()), pl.all())
        for p in partitions
        if p.overlap is not None and not p.overlap.is_empty()
    ]
    return (
        pl.concat(frames).sort("dataset", "retriever", "k", "generator", "other")
        if frames
        else pl.DataFrame()
    )


def prompt_table(partitions: Iterable[PartitionScores]) -> pl.DataFrame:
    """Per generator, the templates its runs were prompted with (their MLflow parameters), one
    row per distinct set — two rows for a generator mean its runs differ in their prompts."""
    rows = {
        (p.generator, *(p.prompts.get(name, "") for name in PROMPT_COLUMNS)): None
        for p in partitions
        if p.prompts
    }
    return pl.DataFrame(
        list(rows),
        schema={"generator": pl.String, **dict.fromkeys(PROMPT_COLUMNS.values(), pl.String)},
        orient="row",
    ).sort("generator", maintain_order=True)


PROMPT_COLUMNS = {
    "prompt_closed_book": "closed_book",
    "prompt_with_context": "with_context",
    "prompt_other_roles": "other roles",
    "prompt_template_hash": "template hash",
}


def build_comparison(partitions: list[PartitionScores], seed: int = 0) -> Comparison:
    """Every comparison table over ``partitions``."""
    long = long_table(partitions)
    tables: dict[str, pl.DataFrame] = {}
    titles: dict[str, str] = {}
    for column, title in WIDE_TABLES.items():
        tables[column], titles[column] = wide_table(long, column), title
    tables["best"], titles["best"] = (
        best_settings(long),
        "Best setting per headline metric, in the metric's direction (metric catalogue)",
    )
    tables["mirage"], titles["mirage"] = (
        mirage_table(long),
        "MIRAGE RAG adaptability, % (MIRAGE Table 1 layout)",
    )
    tables["erag_utility"], titles["erag_utility"] = (
        erag_utility_table(long),
        "eRAG and LLM-specific utility by retriever",
    )
    tables["mirage_retrieval"], titles["mirage_retrieval"] = (
        mirage_retrieval_table(long),
        "Retriever precision / recall / F1 / NDCG@k, % (MIRAGE Table 2 layout)",
    )
    correlations = _labelled_correlations(partitions)
    tables["erag_table1"], titles["erag_table1"] = (
        erag_table(correlations),
        "Which retrieval evaluation predicts this LLM's EM? Kendall τ / Spearman ρ over queries (eRAG Table 1 layout)",
    )
    tables["erag_figure1"], titles["erag_figure1"] = (
        figure_one(correlations) if not correlations.is_empty() else correlations,
        "Kendall τ with EM as k varies (eRAG Figure 1 as a table)",
    )
    validity = _labelled_validity(partitions)
    if not validity.is_empty():
        tables["validity_r"], titles["validity_r"] = (
            table_two_across(validity, "r_pb"),
            "Validity: point-biserial r of each per-passage measure with the judgments, questions answered "
            "closed book left out (SePer Table 2 layout)",
        )
        tables["validity_auc"], titles["validity_auc"] = (
            table_two_across(validity, "auc"),
            "Validity: ROC AUC of each per-passage measure, positives vs random and hard negatives (same questions)",
        )
    tables["delta_seper_ci"], titles["delta_seper_ci"] = (
        delta_seper_intervals(partitions, seed),
        "ΔSePer_S mean and bootstrap 95% interval per setting",
    )
    tables["paired_tests"], titles["paired_tests"] = (
        paired_retriever_tests(partitions, seed=seed),
        "Paired tests between retrievers on per-query ΔSePer_S (difference a − b, bootstrap 95% CI, permutation p; "
        "better: ahead where the CI excludes 0)",
    )
    table_one = utility_table_one(partitions)
    if not table_one.is_empty():
        tables["utility_table1"], titles["utility_table1"] = (
            table_one,
            "LLM-specific utility: has_answer % with no passage, the top k, all candidates, the human-annotated "
            "passage and each generator's gold-utility passages (gold:<generator>; Table 1 and the transfer of Figure 2)",
        )
    overlap = utility_overlap(partitions)
    if not overlap.is_empty():
        tables["utility_overlap"], titles["utility_overlap"] = (
            overlap,
            "Overlap of two generators' gold-utility sets: mean Jaccard over questions where either is non-empty, "
            "mean shared passages, share of one's gold passages not gold for the other (Figure 3)",
        )
    multistep = multistep_table(partitions, seed)
    if not multistep.is_empty():
        tables["multistep"], titles["multistep"] = (
            multistep,
            "Multi-step RAG: ΔSePer after each round and its gain over the round before (paired bootstrap 95% CI "
            "over the questions both rounds scored; SePer Fig. 1–2, App. C.2)",
        )
    prompts = prompt_table(partitions)
    if not prompts.is_empty():
        tables["prompts"], titles["prompts"] = (
            prompts,
            "The prompt templates each generator's runs used",
        )
    tables["runs"], titles["runs"] = long, "Every run's summary"
    return Comparison(tables, titles)


def write_comparison(comparison: Comparison, directory: Path) -> list[Path]:
    """Each table as CSV and Markdown, all tables in ``comparison.md``, and the plots: ΔSePer_S
    heatmap, ΔSePer_S bars with intervals, MIRAGE stacked bars. Returns the written paths."""
    written: list[Path] = []
    for name, table in comparison.tables.items():
        csv, md = directory / f"{name}.csv", directory / f"{name}.md"
        atomic_write(csv, lambda temporary, t=table: t.write_csv(temporary))
        atomic_write(
            md,
            lambda temporary, t=table: temporary.write_text(
                markdown_table(t) + "\n", encoding="utf-8"
            ),
        )
        written += [csv, md]
    everything = directory / "comparison.md"
    atomic_write(
        everything,
        lambda temporary: temporary.write_text(comparison.markdown() + "\n", encoding="utf-8"),
    )
    written.append(everything)
    long = comparison.tables["runs"]
    if "delta_seper_s" in long.columns:
        written.append(plots.delta_seper_heatmap(long, directory / "delta_seper_heatmap.png"))
    if not comparison.tables["delta_seper_ci"].is_empty():
        written.append(
            plots.delta_seper_bars(
                comparison.tables["delta_seper_ci"], directory / "delta_seper_bars.png"
            )
        )
    if set(MIRAGE_COLUMNS) <= set(long.columns):
        written.append(plots.mirage_stacked_bars(long, directory / "mirage_bars.png"))
    return written


def log_comparison(
    tracking: MlflowTracking,
    dataset: str,
    key: str,
    name: str,
    comparison: Comparison,
    written: list[Path],
    params: dict[str, str],
    tags: dict[str, str],
) -> TrackedRun:
    """Log a comparison as its own run in the dataset's experiment (tag ``ragutil.kind =
    comparison``), reused while ``key`` — the compared runs' keys — stays the same: tables as
    CSV and Markdown under ``tables/``, plots under ``plots/``."""
    with tracking.run(mlflow_experiment_name(dataset), key, name, "comparison", tags) as run:
        run.log_params(params)
        run.log_metrics(
            {
                "runs_compared": float(comparison.tables["runs"].height),
                "paired_tests": float(comparison.tables["paired_tests"].height),
            }
        )
        for path in written:
            run.log_artifact(path, "plots" if path.suffix == ".png" else "tables")
    return run
