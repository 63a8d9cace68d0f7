"""The papers' validity experiments on a judged dataset: does a per-passage measure tell the
passages that help from those that do not?

Per judged query (one with a positive in its qrels), the passages are its positives (label 1) and
negatives (label 0, :func:`validity_passages`): its annotated negatives where the qrels give it
some (SePer Table 2's), else sampled ones (``validity.also_sample``: both):

* ``annotated`` — a passage the qrels judge not relevant to the query (relevance ≤ 0; with
  ``validity.ground_truth_negatives``, also one the dataset's ground-truth utility judges and the
  qrels do not, :func:`with_ground_truth_negatives`) and that holds no gold answer, drawn with the
  config's seed when there are more than asked;
* ``hard`` — the best-ranked BM25 passage the qrels do not judge for the query and that holds no
  gold answer (DPR's hard negatives; the world's namesake or the entity's other passage);
* ``random`` — a passage of another document (not a positive's, nor judged for the query) holding
  no gold answer, drawn with the config's seed.

Each is shown to the generator alone (the ``validity`` condition, sampled, NLI-judged and scored
exactly as ``per_doc``), and every per-passage measure is set against the 0/1 label
(:func:`validity_table`): ROC AUC with a stratified bootstrap 95 % interval (ConSens §3 reports
AUCs) and the point-biserial r with its p-value (SePer Table 2's Pearson r against a 1 / 0
utility). The measures:

* SePer Table 2's rows, each the change from the closed-book samples to the samples with the
  passage, of a score averaged over the N samples (§4.1.2): ΔEM, ΔROUGE-L, ΔBLEU, ΔBERTScore
  (each sample against the gold answers, :func:`reference_scores`) and, as *reductions* (closed
  book − with the passage, so that larger means more utility for every row), Δperplexity,
  Δentropy and Δsemantic entropy; then ΔSePer_H and ΔSePer_S (eq. 11 with the passage as
  context). The paper's LLM-judge rows (AUTO-J, PROMETHEUS) are not computed. ΔF1 (token F1) is
  ragutil's addition, labelled so;
* eRAG's label (eq. 1: EM of the judged answer with the passage alone) and LLM-specific utility's
  gold utility (eq. 1);
* every teacher-forced signal of the passages' signals table (its float columns,
  :func:`signal_columns`, from ``signals.alone_signals``: likelihood utility and the passage's
  own ConSens; a signal added there becomes a row). Attention utility is a share of one prompt's
  attention among the passages shown together: a passage shown alone has none;
* the dataset's ground-truth utility, where it has one (the synthetic world).

As SePer Table 2 filters them, questions whose judged closed-book answer already holds a gold
answer are reported apart (``subset``: ``unanswered`` is the paper's table, ``answered`` the
rest), and each negative kind also separately from the positives (``negatives``).
"""

from __future__ import annotations

import itertools
import typing
import zlib
from collections.abc import Sequence

import numpy as np
import polars as pl

from ragutil_dagster.config import ValidityConfig
from ragutil_dagster.errors import ValidityError
from ragutil_dagster.evaluation.conditions import VALIDITY_CONDITION
from ragutil_dagster.evaluation.paper_scores import ERAG_LABEL_COLUMNS, passage_scores
from ragutil_dagster.metrics.answers import bleu, has_answer, rouge_l
from ragutil_dagster.metrics.stats import binary_validity
from ragutil_dagster.tables import (
    DECODING_SAMPLE,
    GROUP_KEYS,
    QRELS_SCHEMA,
    VALIDITY_PASSAGE_SCHEMA,
    VALIDITY_SCHEMA,
)

ANNOTATED = "annotated"
"""The kind of a negative the dataset's qrels annotate (relevance ≤ 0)."""
SAMPLED_KINDS: tuple[str, ...] = ("random", "hard")
NEGATIVE_KINDS: tuple[str, ...] = (ANNOTATED, *SAMPLED_KINDS)
HARD_NEGATIVE_DEPTH = 100
"""How deep the BM25 ranking is searched for a query's hard negatives."""
RANDOM_DRAWS = 1000
"""Draws per random negative before a query is left with fewer than asked."""

ADDITION = "ragutil's addition"
# SePer Table 2's baselines: per-group columns of evaluation.groups.group_scores (means over the
# N samples); an uncertainty's Δ is its reduction. Token F1 is not one of the paper's rows.
BASELINES: dict[str, str] = {
    "em": "ΔEM",
    "f1": f"ΔF1 ({ADDITION})",
    "perplexity": "Δperplexity",
    "entropy": "Δentropy",
    "semantic_entropy": "Δsemantic entropy",
}
# ... and those scored here from the samples against the gold answers (:func:`reference_scores`).
REFERENCE_BASELINES: dict[str, str] = {
    "rouge_l": "ΔROUGE-L",
    "bleu": "ΔBLEU",
    "bertscore": "ΔBERTScore",
}
REDUCTIONS = frozenset({"perplexity", "entropy", "semantic_entropy"})
ERAG_LABEL_NAMES = {"exact_match": "EM", "has_answer": "has_answer", "token_f1": "token F1"}
# SePer Table 2's rows in its order (its LLM judges AUTO-J and PROMETHEUS left out).
TABLE_2: tuple[str, ...] = (
    "delta_em",
    "delta_rouge_l",
    "delta_bleu",
    "delta_bertscore",
    "delta_perplexity",
    "delta_entropy",
    "delta_semantic_entropy",
    "delta_seper_h",
    "delta_seper_s",
)
_ROW_LABELS = {
    **{f"delta_{c}": label for c, label in {**BASELINES, **REFERENCE_BASELINES}.items()},
    "delta_seper_h": "ΔSePer_H",
    "delta_seper_s": "ΔSePer_S",
}
# Every measure with a label of its own, in the table's order (SePer Table 2's rows first).
LABELS: dict[str, str] = {
    **{m: _ROW_LABELS[m] for m in TABLE_2},
    "delta_f1": _ROW_LABELS["delta_f1"],
    "consens": "ConSens",
    # eRAG's label by every downstream metric: EM, the paper's, is constant on real LLMs' sentences
    # (SmolLM2 on SQuAD: never an exact match), where has_answer and token F1 still rank passages.
    **{
        column: f"eRAG label ({ERAG_LABEL_NAMES[metric]})"
        for metric, column in ERAG_LABEL_COLUMNS.items()
    },
    "gold_utility": "gold utility",
    "likelihood": "likelihood utility",
    "true_utility": "ground truth",
}
# Where each row comes from (table_two's ``from`` column): SePer Table 2's own rows, the other
# papers' per-passage measures, and what ragutil adds.
SOURCES: dict[str, str] = {
    **dict.fromkeys(TABLE_2, "SePer Table 2"),
    "delta_f1": ADDITION,
    "consens": "ConSens",
    **dict.fromkeys(ERAG_LABEL_COLUMNS.values(), "eRAG"),
    "gold_utility": "LLM-specific utility",
    "likelihood": "LLM-specific utility",
    "true_utility": f"{ADDITION} (synthetic world)",
}
SUBSETS = {"unanswered": False, "answered": True}
"""Query subsets by whether the judged closed-book answer holds a gold answer."""
KEYS = ("query_id", "doc_id")


def negative_kinds(qrels: pl.DataFrame, config: ValidityConfig) -> list[str]:
    """The kinds of negative a dataset's validity passages may hold, in the table's order:
    ``annotated`` when ``config.negatives`` lists it and the qrels judge some passage not relevant
    (relevance ≤ 0) for a query they judge a positive for, and the sampled kinds listed (those
    of the queries without an annotated negative, or of every query with ``also_sample``)."""
    positive = qrels.filter(pl.col("relevance") > 0)["query_id"].unique()
    has_annotated = ANNOTATED in config.negatives and bool(
        qrels.filter(
            (pl.col("relevance") <= 0) & pl.col("query_id").is_in(positive.implode())
        ).height
    )
    return [ANNOTATED] * has_annotated + [k for k in SAMPLED_KINDS if k in config.negatives]


def with_ground_truth_negatives(qrels: pl.DataFrame, ground_truth: pl.DataFrame) -> pl.DataFrame:
    """``qrels`` with every passage the dataset's ground-truth utility (``query_id``, ``doc_id``, …)
    judges for a query and the qrels do not, judged not relevant (relevance 0): the synthetic
    world's hard and random negatives become its annotated ones (``validity.ground_truth_negatives``)."""
    extra = (
        ground_truth.select("query_id", "doc_id")
        .unique(maintain_order=True)
        .join(qrels, on=["query_id", "doc_id"], how="anti")
        .with_columns(pl.lit(0, pl.Int64).alias("relevance"))
    )
    return pl.concat([qrels.select(list(QRELS_SCHEMA)), extra]).cast(QRELS_SCHEMA)


def validity_passages(
    dataset: str,
    queries: pl.DataFrame,
    qrels: pl.DataFrame,
    corpus: pl.DataFrame,
    config: ValidityConfig,
    hard_run: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Every judged query's positives and negatives (``VALIDITY_PASSAGE_SCHEMA``; per query, in id
    order, its positives, then annotated, hard and random negatives): its annotated negatives
    where it has some (holding no gold answer) and ``config.negatives`` lists them, and the
    sampled kinds listed otherwise, or beside them with ``config.also_sample``. ``hard_run``: the
    BM25 ranking (``RUN_SCHEMA``, at least :data:`HARD_NEGATIVE_DEPTH` deep) when hard negatives
    are drawn. A query whose candidates run
    out gets fewer negatives than ``config.per_query``: :func:`negative_shortfall` counts them."""
    positives = qrels.filter(pl.col("relevance") > 0)
    if positives.is_empty():
        raise ValidityError(
            f"dataset {dataset!r}: validity needs relevance judgments, but its qrels hold no positive "
            f"(relevance > 0) for any of its {queries.height} queries; give the dataset judged qrels "
            f"or remove the validity section of the config"
        )
    kinds = negative_kinds(qrels, config)
    if not kinds:
        raise ValidityError(
            f"dataset {dataset!r}: validity.negatives lists only 'annotated', but its qrels judge no passage "
            f"not relevant (relevance ≤ 0) for a query with a positive; list 'random' or 'hard' too"
        )
    if "hard" in kinds and hard_run is None:
        raise ValueError("hard negatives need the BM25 ranking (hard_run)")
    judged = {qid: set(docs) for qid, docs in qrels.group_by("query_id").agg("doc_id").iter_rows()}
    relevant = {
        qid: sorted(docs) for qid, docs in positives.group_by("query_id").agg("doc_id").iter_rows()
    }
    annotated = {
        qid: sorted(docs)
        for qid, docs in qrels.filter(pl.col("relevance") <= 0)
        .group_by("query_id")
        .agg("doc_id")
        .iter_rows()
    }
    golds = dict(queries.select("query_id", "answers").iter_rows())
    ids = corpus["id"].to_list()
    texts = dict(zip(ids, corpus["text"].to_list()))
    # "Another document": the source document of a passage cut from one (chunked corpora), else itself.
    document = dict(zip(ids, corpus["doc_id"].to_list() if "doc_id" in corpus.columns else ids))
    ranked = (
        {
            qid: docs
            for qid, docs in hard_run.sort("query_id", "rank")
            .group_by("query_id", maintain_order=True)
            .agg("doc_id")
            .iter_rows()
        }
        if hard_run is not None and "hard" in kinds
        else {}
    )
    rows: list[tuple[str, str, str, int]] = []
    for qid in sorted(q for q in queries["query_id"].to_list() if q in relevant):
        chosen = list(relevant[qid])
        rows += [(qid, doc, "positive", 1) for doc in chosen]

        def eligible(doc: str) -> bool:
            return (
                doc not in judged[qid]
                and doc not in chosen
                and not has_answer(texts[doc], golds[qid])
            )

        picked: list[str] = []
        if (
            ANNOTATED in kinds
        ):  # the qrels' own negatives, a seeded draw when there are more than asked
            candidates = [
                doc
                for doc in annotated.get(qid, [])
                if doc in texts and not has_answer(texts[doc], golds[qid])
            ]
            order = np.random.default_rng([config.seed, zlib.crc32(qid.encode()), 1]).permutation(
                len(candidates)
            )
            picked = sorted(candidates[i] for i in order[: config.per_query])
            rows += [(qid, doc, ANNOTATED, 0) for doc in picked]
            chosen += picked
        if picked and not config.also_sample:  # SePer Table 2: the annotated negatives, as printed
            continue
        # Hard before random, so a hard negative is always the best-ranked eligible passage.
        if "hard" in kinds:
            hard = list(
                itertools.islice(
                    (doc for doc in ranked.get(qid, []) if eligible(doc)), config.per_query
                )
            )
            rows += [(qid, doc, "hard", 0) for doc in hard]
            chosen += hard
        if "random" in kinds:
            positive_documents = {document[doc] for doc in relevant[qid]}
            rng = np.random.default_rng([config.seed, zlib.crc32(qid.encode())])
            for _ in range(config.per_query):
                for index in rng.integers(0, len(ids), size=RANDOM_DRAWS):
                    doc = ids[index]
                    if document[doc] not in positive_documents and eligible(doc):
                        rows.append((qid, doc, "random", 0))
                        chosen.append(doc)
                        break
    return pl.DataFrame(rows, schema=VALIDITY_PASSAGE_SCHEMA, orient="row")


def negative_shortfall(
    passages: pl.DataFrame, config: ValidityConfig, kinds: Sequence[str] | None = None
) -> dict[str, int]:
    """Per negative kind (``kinds``, default ``config.negatives``: pass the dataset's
    :func:`negative_kinds`), the judged queries that got fewer negatives of it than asked — of a
    sampled kind, among the queries that draw it (without an annotated negative, unless
    ``also_sample``)."""
    kinds = list(config.negatives if kinds is None else kinds)
    counts = passages.group_by("query_id").agg(
        *[(pl.col("kind") == kind).sum().alias(kind) for kind in {*kinds, ANNOTATED}]
    )
    out = {}
    for kind in kinds:
        drawing = (
            counts
            if kind == ANNOTATED or config.also_sample or ANNOTATED not in kinds
            else counts.filter(pl.col(ANNOTATED) == 0)
        )
        out[kind] = int((drawing[kind] < config.per_query).sum())
    return out


def reference_scores(
    generations: pl.DataFrame,
    queries: pl.DataFrame,
    bertscore: typing.Any = None,
    conditions: Sequence[str] = ("closed_book", VALIDITY_CONDITION),
) -> pl.DataFrame:
    """SePer Table 2's reference-based scores of every (query, condition, doc) group of
    ``conditions``: the mean over its N samples of ROUGE-L, BLEU (``metrics.answers``) and — with
    a ``bertscore`` scorer (``models.bertscore.BertScorer``, batched over every sample at once) —
    BERTScore F1, each sample against the query's gold answers."""
    golds = dict(queries.select("query_id", "answers").iter_rows())
    samples = generations.filter(
        (pl.col("decoding") == DECODING_SAMPLE) & pl.col("condition").is_in(list(conditions))
    ).select(*GROUP_KEYS, "text")
    answers = [golds[qid] for qid in samples["query_id"]]
    texts = samples["text"].to_list()
    columns = [
        pl.Series("rouge_l", [rouge_l(t, g) for t, g in zip(texts, answers)], pl.Float64),
        pl.Series("bleu", [bleu(t, g) for t, g in zip(texts, answers)], pl.Float64),
    ]
    if bertscore is not None:
        columns.append(
            pl.Series("bertscore", bertscore.f1(texts, answers) if texts else [], pl.Float64)
        )
    scored = samples.with_columns(columns)
    return (
        scored.group_by(GROUP_KEYS, maintain_order=True)
        .agg(*[pl.col(c.name).mean() for c in columns])
        .sort(GROUP_KEYS, nulls_last=False)
    )


def signal_columns(signals: pl.DataFrame) -> list[str]:
    """The per-passage utility signals of a signals table: its float columns (a selection flag
    such as ``likelihood_selected`` is not a score)."""
    return [name for name, dtype in signals.schema.items() if name not in KEYS and dtype.is_float()]


def passage_table(
    groups: pl.DataFrame,
    queries: pl.DataFrame,
    passages: pl.DataFrame,
    signals: pl.DataFrame,
    ground_truth: pl.DataFrame | None = None,
    references: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Every validity passage with its label and every measure: the per-passage scores of the
    ``validity`` groups (:func:`~ragutil_dagster.evaluation.paper_scores.passage_scores`: ΔSePer,
    eRAG labels, gold utility, signals, ground truth), SePer Table 2's baseline Δs — with
    ``references`` (:func:`reference_scores`) its ROUGE-L, BLEU and BERTScore rows too — and
    whether its question is answered closed book (``answered_closed_book``)."""
    scored = passage_scores(groups, queries, passages, VALIDITY_CONDITION, signals, ground_truth)
    baselines = list(BASELINES)
    if references is not None:
        extra = [c for c in REFERENCE_BASELINES if c in references.columns]
        groups = groups.join(
            references.select(*GROUP_KEYS, *extra),
            on=list(GROUP_KEYS),
            how="left",
            nulls_equal=True,
        )
        baselines += extra
    closed = groups.filter(pl.col("condition") == "closed_book").select(
        "query_id",
        *[pl.col(c).alias(f"{c}_closed") for c in baselines],
        pl.col("answer_has").alias("answered_closed_book"),
    )
    alone = groups.filter(pl.col("condition") == VALIDITY_CONDITION).select(*KEYS, *baselines)
    deltas = alone.join(closed, on="query_id", how="left").select(
        *KEYS,
        *[
            (
                pl.col(f"{c}_closed") - pl.col(c)
                if c in REDUCTIONS
                else pl.col(c) - pl.col(f"{c}_closed")
            ).alias(f"delta_{c}")
            for c in baselines
        ],
        "answered_closed_book",
    )
    return scored.join(deltas, on=list(KEYS), how="left").sort(
        "query_id", "label", "kind", "doc_id", descending=[False, True, False, False]
    )


def measures(passages: pl.DataFrame, signals: Sequence[str]) -> list[str]:
    """The measures a passage table defines for some passage, in the table's order: those of
    :data:`LABELS`, then any other signal."""
    names = [m for m in LABELS if m in passages.columns] + [s for s in signals if s not in LABELS]
    return [m for m in names if passages[m].is_not_null().any()]


def validity_table(
    passages: pl.DataFrame, measure_names: Sequence[str], n_resamples: int = 1000, seed: int = 0
) -> pl.DataFrame:
    """Every measure against the label (``VALIDITY_SCHEMA``), per query subset and per negatives
    (all, then each kind present), over the passages where the measure is defined (finite)."""
    kinds = [k for k in NEGATIVE_KINDS if k in set(passages["kind"])]
    rows = []
    for subset, answered in SUBSETS.items():
        part = passages.filter(pl.col("answered_closed_book") == answered)
        for negatives in ("all", *kinds):
            chosen = (
                part
                if negatives == "all"
                else part.filter((pl.col("label") == 1) | (pl.col("kind") == negatives))
            )
            for measure in measure_names:
                values = chosen.select(pl.col(measure).cast(pl.Float64), "label").filter(
                    pl.col(measure).is_finite()
                )
                cell = binary_validity(
                    values[measure], values["label"], n_resamples=n_resamples, seed=seed
                )
                rows.append(
                    (
                        measure,
                        LABELS.get(measure, measure),
                        subset,
                        negatives,
                        cell.n,
                        cell.n_positive,
                        cell.n_negative,
                        cell.auc,
                        cell.auc_low,
                        cell.auc_high,
                        cell.resamples,
                        cell.r,
                        cell.pvalue,
                        cell.undefined,
                    )
                )
    return pl.DataFrame(rows, schema=VALIDITY_SCHEMA, orient="row")


def _cell(value: str, template: str, *parts: str) -> pl.Expr:
    """``value`` and ``parts`` (rounded when numbers) into ``template``; — when ``value`` is null."""
    text = pl.format(
        template,
        pl.col(value).round(3),
        *(pl.col(c) if c == "p_shown" else pl.col(c).round(3) for c in parts),
    )
    return (
        pl.when(pl.col(value).is_null())
        .then(pl.lit("—"))
        .otherwise(pl.coalesce(text, pl.col(value).round(3).cast(pl.String)))
    )


def table_two(validity: pl.DataFrame, subset: str = "unanswered") -> pl.DataFrame:
    """SePer Table 2's layout for one setting × generator: one row per measure, where it comes
    from (``from``: SePer Table 2's own rows, another paper's measure, or ragutil's addition), its
    ROC AUC with the bootstrap 95 % interval and point-biserial r (p) against positives vs all
    negatives, the passages they are over, the AUC against each kind of negative alone, why a
    cell is undefined, and which kinds the negatives are (``negatives``: annotated — the
    dataset's own, as the paper's — or sampled)."""
    rows = validity.filter(pl.col("subset") == subset).with_columns(
        p_shown=pl.when(pl.col("p_value") < 0.001)
        .then(pl.lit("< 0.001"))
        .otherwise(pl.col("p_value").round(3).cast(pl.String))
    )
    kinds = [k for k in NEGATIVE_KINDS if k in set(rows["negatives"])]
    table = rows.filter(pl.col("negatives") == "all").select(
        "measure",
        "label",
        pl.col("measure").replace_strict(SOURCES, default="").alias("from"),
        _cell("auc", "{} [{}, {}]", "auc_ci_low", "auc_ci_high").alias("AUC [95% CI]"),
        _cell("r_pb", "{} (p {})", "p_shown").alias("r_pb (p)"),
        pl.format("{} ({}+ / {}−)", "n", "n_positive", "n_negative").alias("n"),
        pl.col("undefined").fill_null(""),
    )
    for kind in kinds:
        table = table.join(
            rows.filter(pl.col("negatives") == kind).select(
                "measure", _cell("auc", "{}").alias(f"AUC vs {kind}")
            ),
            on="measure",
            how="left",
            maintain_order="left",
        )
    return (
        table.drop("measure")
        .rename({"label": "measure"})
        .with_columns(pl.lit(" + ".join(kinds)).alias("negatives"))
    )


def table_two_across(validity: pl.DataFrame, statistic: str = "r_pb") -> pl.DataFrame:
    """SePer Table 2 across runs: one row per measure, one column per setting × generator
    (``validity`` holds the rows of several with their ``dataset``, ``retriever``, ``k`` and
    ``generator``), the ``statistic`` of positives vs all negatives on the unanswered questions."""
    return (
        validity.filter((pl.col("subset") == "unanswered") & (pl.col("negatives") == "all"))
        .sort("dataset", "retriever", "k", "generator")
        .with_columns(
            pl.format("{}/{}/k={}/{}", "dataset", "retriever", "k", "generator").alias("run")
        )
        .pivot(
            "run", index="label", values=statistic, aggregate_function="first", maintain_order=True
        )
        .rename({"label": "measure"})
    )


def validity_metrics(validity: pl.DataFrame) -> dict[str, float]:
    """The validity figures as flat metric names: ``validity_<statistic>_<measure>`` for
    positives vs all negatives on the unanswered questions, ``…_vs_<kind>`` against one kind of
    negative, ``…_answered`` on the questions answered closed book."""
    out: dict[str, float] = {}
    for row in validity.iter_rows(named=True):
        suffix = ("" if row["negatives"] == "all" else f"_vs_{row['negatives']}") + (
            "" if row["subset"] == "unanswered" else f"_{row['subset']}"
        )
        for statistic in ("auc", "auc_ci_low", "auc_ci_high", "r_pb", "p_value", "n"):
            if row[statistic] is not None:
                out[f"validity_{statistic}_{row['measure']}{suffix}"] = float(row[statistic])
    return out
