"""PNG plots of one partition's scores and of the cross-run comparison (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display here, on CI or on a cluster node

import matplotlib.pyplot as plt
import numpy as np
import polars as pl
from matplotlib.figure import Figure

from ragutil_dagster.infra.files import atomic_write
from ragutil_dagster.metrics import catalog

MIRAGE = tuple((m.name, m.name.removeprefix("mirage_").replace("_", " ")) for m in catalog.mirage())


def _save(path: Path, draw: Callable[[], Figure]) -> Path:
    figure = draw()
    try:
        figure.tight_layout()
        atomic_write(path, lambda temporary: figure.savefig(temporary, format="png", dpi=100))
    finally:
        plt.close(figure)
    return path


def delta_seper_distribution(per_query: pl.DataFrame, path: Path) -> Path:
    """Histogram of per-query ΔSePer_S and ΔSePer_H (SePer eq. 11)."""

    def draw() -> Figure:
        figure, ax = plt.subplots(figsize=(5, 3.2))
        bins = np.linspace(-1, 1, 41)
        for column, label in (("delta_seper_s", "ΔSePer_S"), ("delta_seper_h", "ΔSePer_H")):
            ax.hist(per_query[column].drop_nulls().to_numpy(), bins=bins, alpha=0.6, label=label)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_xlabel("ΔSePer (with context − closed book)")
        ax.set_ylabel("queries")
        ax.legend()
        return figure

    return _save(path, draw)


def delta_seper_by_rank(documents: pl.DataFrame, path: Path) -> Path:
    """Per-document ΔSePer_S (each document alone, SePer §3.4) against its retrieval rank:
    every document as a dot, the mean per rank as a line."""

    def draw() -> Figure:
        figure, ax = plt.subplots(figsize=(5, 3.2))
        jitter = np.random.default_rng(0).uniform(-0.15, 0.15, documents.height)
        ax.scatter(
            documents["rank"].to_numpy() + jitter,
            documents["delta_seper_s"].to_numpy(),
            s=8,
            alpha=0.4,
        )
        means = documents.group_by("rank").agg(pl.col("delta_seper_s").mean()).sort("rank")
        ax.plot(
            means["rank"].to_numpy(),
            means["delta_seper_s"].to_numpy(),
            color="black",
            marker="o",
            label="mean",
        )
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_xticks(means["rank"].to_list())
        ax.set_xlabel("retrieval rank")
        ax.set_ylabel("ΔSePer_S of the document alone")
        ax.legend()
        return figure

    return _save(path, draw)


def mirage_bar(summary: dict[str, float], path: Path) -> Path:
    """MIRAGE's four RAG-adaptability metrics (§4.2; they sum to 1) as bars."""
    present = [(column, label) for column, label in MIRAGE if column in summary]

    def draw() -> Figure:
        figure, ax = plt.subplots(figsize=(5, 3.2))
        ax.bar(
            [label.replace(" ", "\n") for _, label in present],
            [summary[c] for c, _ in present],
            color=["tab:red", "tab:green", "tab:grey", "tab:orange"][: len(present)],
        )
        ax.set_ylim(0, 1)
        ax.set_ylabel("share of questions")
        return figure

    return _save(path, draw)


def delta_seper_heatmap(table: pl.DataFrame, path: Path, column: str = "delta_seper_s") -> Path:
    """``column`` by retriever (rows) × k (columns), one panel per dataset × generator
    (SePer Figs. 4–5, Tables 10–11), the better end of the scale (``Metric.higher_is_better``)
    bright. Missing cells stay blank."""
    panels = table.select("dataset", "generator").unique(maintain_order=True).rows()
    higher_is_better = catalog.metric(column).higher_is_better

    def draw() -> Figure:
        figure, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3), squeeze=False)
        for ax, (dataset, generator) in zip(axes[0], panels):
            part = table.filter((pl.col("dataset") == dataset) & (pl.col("generator") == generator))
            if (
                "compression" in part.columns
            ):  # a compressed setting is a row of its own: bm25+truncate-64
                part = part.with_columns(
                    pl.when(pl.col("compression") != "")
                    .then(pl.format("{}+{}", "retriever", "compression"))
                    .otherwise(pl.col("retriever"))
                    .alias("retriever")
                )
            if "multistep_round" in part.columns:  # so is a later multi-step round: bm25+step-2
                part = part.with_columns(
                    pl.when(pl.col("multistep_round") > 1)
                    .then(pl.format("{}+step-{}", "retriever", "multistep_round"))
                    .otherwise(pl.col("retriever"))
                    .alias("retriever")
                )
            retrievers = part["retriever"].unique(maintain_order=True).to_list()
            ks = sorted(part["k"].unique().to_list())
            grid = np.full((len(retrievers), len(ks)), np.nan)
            for retriever, k, value in part.select("retriever", "k", column).iter_rows():
                if value is not None:
                    grid[retrievers.index(retriever), ks.index(k)] = value
            image = ax.imshow(
                grid, cmap="viridis" if higher_is_better else "viridis_r", aspect="auto"
            )
            ax.set_xticks(range(len(ks)), [f"k={k}" for k in ks])
            ax.set_yticks(range(len(retrievers)), retrievers)
            for (i, j), value in np.ndenumerate(grid):
                if np.isfinite(value):
                    ax.text(j, i, f"{value:.3f}", ha="center", va="center", color="white")
            ax.set_title(f"{column} — {dataset} / {generator}")
            figure.colorbar(
                image, ax=ax, label=f"{'higher' if higher_is_better else 'lower'} is better"
            )
        return figure

    return _save(path, draw)


def delta_seper_bars(intervals: pl.DataFrame, path: Path) -> Path:
    """Mean ΔSePer_S with its bootstrap 95% interval per setting, grouped by generator.
    ``intervals``: setting label, generator, mean, low, high."""
    generators = intervals["generator"].unique(maintain_order=True).to_list()
    labels = intervals["label"].unique(maintain_order=True).to_list()

    def draw() -> Figure:
        figure, ax = plt.subplots(figsize=(max(5, 1.2 * len(labels) * len(generators)), 3.5))
        width = 0.8 / len(generators)
        for g, generator in enumerate(generators):
            part = intervals.filter(pl.col("generator") == generator)
            x = np.array([labels.index(label) for label in part["label"]]) + g * width
            mean = part["mean"].to_numpy()
            error = np.vstack([mean - part["low"].to_numpy(), part["high"].to_numpy() - mean])
            ax.bar(x, mean, width, yerr=error, capsize=3, label=generator)
        ax.set_xticks(np.arange(len(labels)) + 0.4 - width / 2, labels, rotation=20, ha="right")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_ylabel("ΔSePer_S (95% CI)")
        ax.legend(title="generator")
        return figure

    return _save(path, draw)


def mirage_stacked_bars(table: pl.DataFrame, path: Path) -> Path:
    """MIRAGE's four metrics per setting × generator as stacked bars (each bar sums to 1)."""
    labels = [f"{r['retriever']}/k={r['k']}\n{r['generator']}" for r in table.iter_rows(named=True)]

    def draw() -> Figure:
        figure, ax = plt.subplots(figsize=(max(5, 1.1 * len(labels)), 3.8))
        bottom = np.zeros(len(labels))
        for (column, name), color in zip(
            MIRAGE, ("tab:red", "tab:green", "tab:grey", "tab:orange")
        ):
            values = table[column].fill_null(0.0).to_numpy()
            ax.bar(range(len(labels)), values, bottom=bottom, label=name, color=color)
            bottom += values
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_ylabel("share of questions")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
        return figure

    return _save(path, draw)
