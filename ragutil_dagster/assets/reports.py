"""``reports``: the cross-partition tables and plots — every setting × generator side by side."""


import dagster as dg
import polars as pl

from ragutil_dagster.assets.common import GROUP, markdown_table
from ragutil_dagster.assets.partitions import Partitions
from ragutil_dagster.config import Setting
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.retrieval.io import atomic_write

COLUMNS = (
    "delta_seper_s", "delta_seper_h", "seper_s_closed", "seper_s_rag", "em_rag", "has_answer_rag",
    "mirage_noise_vulnerability", "mirage_context_acceptability", "mirage_context_insensitivity",
    "mirage_context_misinterpretation", "erag_map", "erag_recip_rank", "consens",
    "utility_likelihood_f1", "utility_attention_f1", "pearson_delta_seper_s_true_utility",
)


def summary_table(store: ArtifactStore, parts: Partitions) -> pl.DataFrame:
    """One row per materialised setting × generator with its headline numbers."""
    rows = []
    for key in parts.setting_generator.get_partition_keys():
        path = store.directory("metric_scores", str(key)) / "summary.json"
        if not path.is_file():
            continue
        summary = store.read_json("metric_scores", str(key), "summary")
        setting = Setting.parse(key.keys_by_dimension["setting"])
        rows.append({
            "dataset": setting.dataset, "retriever": setting.retriever, "k": setting.k,
            "reranker": setting.reranker or "", "generator": key.keys_by_dimension["generator"],
            **{c: summary.get(c) for c in COLUMNS},
        })
    if not rows:
        raise FileNotFoundError("no metric_scores partition has been materialised yet")
    return pl.DataFrame(rows).sort("dataset", "generator", "retriever", "k")


def delta_seper_heatmap(table: pl.DataFrame, path) -> None:
    """ΔSePer_S by retriever (rows) × k (columns), one panel per generator (SePer Figs. 4–5)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    generators = table["generator"].unique(maintain_order=True).to_list()
    fig, axes = plt.subplots(1, len(generators), figsize=(4 * len(generators), 3), squeeze=False)
    for ax, generator in zip(axes[0], generators):
        part = table.filter(pl.col("generator") == generator)
        retrievers = part["retriever"].unique(maintain_order=True).to_list()
        ks = sorted(part["k"].unique().to_list())
        grid = [[part.filter((pl.col("retriever") == r) & (pl.col("k") == k))["delta_seper_s"].mean() or 0.0 for k in ks] for r in retrievers]
        image = ax.imshow(grid, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(ks)), [f"k={k}" for k in ks])
        ax.set_yticks(range(len(retrievers)), retrievers)
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                ax.text(j, i, f"{value:.3f}", ha="center", va="center", color="white")
        ax.set_title(f"ΔSePer_S — {generator}")
        fig.colorbar(image, ax=ax)
    fig.tight_layout()
    atomic_write(path, lambda temporary: fig.savefig(temporary, format="png", dpi=100))
    plt.close(fig)


def build(parts: Partitions) -> dg.AssetsDefinition:
    @dg.asset(
        name="reports", group_name=GROUP, kinds={"polars", "csv"},
        deps=["metric_scores"],
        description="Cross-partition comparison: headline metrics of every setting × generator, "
        "as CSV, Markdown and a ΔSePer heatmap.",
    )
    def reports(context: dg.AssetExecutionContext, store: ArtifactStore) -> dg.MaterializeResult:
        table = summary_table(store, parts)
        directory = store.directory("reports")
        atomic_write(directory / "summary.csv", lambda temporary: table.write_csv(temporary))
        markdown = markdown_table(table.to_dicts())
        atomic_write(directory / "summary.md", lambda temporary: temporary.write_text(markdown + "\n"))
        delta_seper_heatmap(table, directory / "delta_seper_heatmap.png")
        return dg.MaterializeResult(metadata={
            "dagster/row_count": dg.MetadataValue.int(table.height),
            "summary": dg.MetadataValue.md(markdown),
            "path": dg.MetadataValue.path(str(directory)),
        })

    return reports
