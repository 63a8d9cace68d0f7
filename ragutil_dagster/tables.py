"""Table contracts: every table's schema, its key columns and the names of the side tables an
asset writes beside its main one — in one place, read by the readers, the evaluation, the assets
(Dagster column-schema metadata) and the tests. Also the one Markdown rendering of a table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import polars as pl

# --- inputs: corpora, queries, qrels (data/) ---------------------------------------------------
CORPUS_SCHEMA: dict[str, pl.DataType] = {
    "id": pl.String(),
    "text": pl.String(),
    "title": pl.String(),
}
PASSAGE_SCHEMA: dict[str, pl.DataType] = {**CORPUS_SCHEMA, "doc_id": pl.String()}
BEIR_QUERY_SCHEMA: dict[str, pl.DataType] = {"id": pl.String(), "text": pl.String()}
QRELS_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String(),
    "doc_id": pl.String(),
    "relevance": pl.Int64(),
}
# The evaluation's queries: one row per question with its gold answers.
QA_QUERY_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String(),
    "question": pl.String(),
    "answers": pl.List(pl.String()),
}
# What a QA dataset may add per question (the synthetic world gives all three).
QA_QUERY_OPTIONAL_SCHEMA: dict[str, pl.DataType] = {
    "type": pl.String,
    "known": pl.Boolean,
    "n_hops": pl.Int32,
}

# --- retrieval runs (retrieval/) ---------------------------------------------------------------
RUN_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String(),
    "rank": pl.Int32(),
    "doc_id": pl.String(),
    "score": pl.Float64(),
    "retriever": pl.String(),
}

# --- prompts, generations and their side tables (evaluation/) ------------------------------------
PROMPT_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String,
    "condition": pl.String,
    "doc_id": pl.String,
    "doc_ids": pl.List(pl.String),  # the passages in the prompt, in order (after any dropping)
    "prompt": pl.String,
    "passages_dropped": pl.Int32,  # passages left out so the prompt fits the generator
    "last_passage_chars": pl.Int64,  # characters of the last passage kept when it was cut, else null
}
GENERATION_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String,
    "condition": pl.String,
    "doc_id": pl.String,
    "sample_index": pl.Int32,
    "decoding": pl.String,  # DECODING_SAMPLE: one of the N samples; DECODING_GREEDY: the label answer
    "text": pl.String,
    "token_logprobs": pl.List(pl.Float64),
    "n_tokens": pl.Int32,
    "finish_reason": pl.String,
    "prompt_tokens": pl.Int32,
    "generator": pl.String,
    "model_identity": pl.String,
    "seed": pl.Int64,
    "temperature": pl.Float64,
    "top_p": pl.Float64,
    "top_k": pl.Int32,
    "max_new_tokens": pl.Int32,
}
DECODING_SAMPLE, DECODING_GREEDY = "sample", "greedy"
# One SePer group: the samples of one prompt (doc_id is set for per-document prompts only).
GROUP_KEYS = ("query_id", "condition", "doc_id")

CONSENS_SCHEMA: dict[str, pl.DataType] = {"query_id": pl.String, "consens": pl.Float64}
# ConSens §3.3 (Experiment 3), per passage d of a query's context C: ConSens of the pseudo-answer
# with d left out, ConSens(C \ {d}), and d's attribution ConSens(C) − ConSens(C \ {d}).
CONSENS_LEAVE_ONE_OUT_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String,
    "doc_id": pl.String,
    "consens_without": pl.Float64,
    "attribution": pl.Float64,
}
# Per utility candidate: log P(a | q, d), ragutil's selection rule on it, the attention share.
SIGNAL_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String,
    "doc_id": pl.String,
    "likelihood": pl.Float64,
    "likelihood_selected": pl.Boolean,
    # Attention ranks passages only (LLM-specific utility §3.3.2): it has no selection rule.
    "attention": pl.Float64,
}
# Per query and context of LLM-specific utility's Table 1 (evaluation/transfer.py): none, top_k,
# candidates, human, gold:<generator> (that generator's gold-utility passages); the gold set's size.
UTILITY_TRANSFER_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String,
    "context": pl.String,
    "passages": pl.Int32,
    "answer": pl.String,
    "has_answer": pl.Boolean,
}
# Per other generator: how far a generator's gold-utility sets agree with its (metrics/utility.gold_overlap).
UTILITY_OVERLAP_SCHEMA: dict[str, pl.DataType] = {
    "other": pl.String,
    "jaccard": pl.Float64,
    "mean_shared": pl.Float64,
    "useful_only_to_this": pl.Float64,
    "useful_only_to_other": pl.Float64,
    "gold_passages_this": pl.Int32,
    "gold_passages_other": pl.Int32,
    "queries": pl.Int32,
}
# Per query and verbalized utility method (LLM-specific utility §3.3): what the generator judged.
UTILITY_JUDGMENT_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String,
    "method": pl.String,
    "shown": pl.List(pl.String),  # the candidates the judgment saw, in rank order (after fitting)
    "selected": pl.List(
        pl.String
    ),  # selection methods: the passages judged useful; null for rankings
    "ranking": pl.List(
        pl.String
    ),  # ranking methods: every candidate, most useful first; null for selections
    "rag_doc_ids": pl.List(
        pl.String
    ),  # the passages of the method's RAG prompt: the selection, or the top k
    "judgments": pl.Int32,  # judgment prompts (pointwise: one per candidate)
    "unparseable": pl.Int32,  # of them, answers not in the requested format
}
# Per utility candidate: its judged answer alone, gold utility (eq. 1) and the signals.
CANDIDATE_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String,
    "doc_id": pl.String,
    "rank": pl.Int32,
    "answer": pl.String,
    "answer_has": pl.Boolean,
    "gold_utility": pl.Boolean,
    **{name: dtype for name, dtype in SIGNAL_SCHEMA.items() if name not in ("query_id", "doc_id")},
}
NLI_SCHEMA: dict[str, pl.DataType] = {
    "premise": pl.String,
    "hypothesis": pl.String,
    "p_contradiction": pl.Float64,
    "p_neutral": pl.Float64,
    "p_entailment": pl.Float64,
}

# Per query, the context its rag prompt shows (evaluation/compression.py): the passages it draws on
# (those kept by truncate / extractive; every one for an abstractive summary), the texts shown
# (compressed, or as retrieved), and its context tokens before and after compression.
CONTEXT_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String,
    "doc_ids": pl.List(pl.String),
    "passages": pl.List(pl.String),
    "context_tokens_before": pl.Int32,
    "context_tokens_after": pl.Int32,
}

# Per query and multi-step round (evaluation/multistep.py): the text the round searched (round 1:
# the question; later rounds: the query writer's) and how many passages it added to the context.
MULTISTEP_QUERY_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String,
    "round": pl.Int32,
    "query": pl.String,
    "passages_added": pl.Int32,
}

# --- score tables: metric_scores, document_scores, group_scores (evaluation/) ---------------------
# Per SePer group (GROUP_KEYS): SePer_S/H, semantic entropy and the number of its clusters, mean
# EM / F1 / has_answer over the N samples, the token baselines of SePer Table 2, and the judged
# answer (greedy, else the most likely sample) with its correctness.
GROUP_SCORE_SCHEMA: dict[str, pl.DataType] = {
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
# The group columns a query's table carries once per condition: ``<column>_closed`` (closed book)
# and ``<column>_rag`` (the top k together).
QUERY_CONDITION_COLUMNS = (
    "seper_s",
    "seper_h",
    "semantic_entropy",
    "em",
    "f1",
    "has_answer",
    "perplexity",
    "entropy",
    "answer",
    "answer_has",
    "answer_loose",
)
QUERY_CONDITIONS = {"closed_book": "closed", "rag": "rag"}  # condition → its column suffix
# Per query (metric_scores' table), the columns that are no catalogued metric: each condition's
# token baselines and judged answer, and MIRAGE's oracle correctness (null without an oracle). Its
# metric columns — SePer, EM / F1 / has_answer per condition, ΔSePer_S/H (SePer eq. 11), ConSens,
# the context's tokens — are the catalogue's entries of level "query"
# (``metrics/catalog.score_schema``).
QUERY_SCORE_COLUMNS: dict[str, pl.DataType] = {
    "query_id": pl.String,
    **{
        f"{column}_{suffix}": GROUP_SCORE_SCHEMA[column]
        for suffix in QUERY_CONDITIONS.values()
        for column in ("perplexity", "entropy", "answer", "answer_has", "answer_loose")
    },
    "answer_loose_oracle": pl.Boolean,
}
# ... and the dataset's optional question fields.
QUERY_SCORE_OPTIONAL_COLUMNS: dict[str, pl.DataType] = dict(QA_QUERY_OPTIONAL_SCHEMA)
# Per retrieved document (its per_doc group): its rank, its eRAG labels (eq. 1: EM, the paper's
# metric for QA, in ``erag_label``; has_answer and token F1 beside it) and gold utility
# (LLM-specific utility eq. 1); with the catalogue's per-document metrics (ΔSePer_S/H alone).
DOCUMENT_SCORE_COLUMNS: dict[str, pl.DataType] = {
    "query_id": pl.String,
    "doc_id": pl.String,
    "rank": pl.Int32,
    "erag_label": pl.Int32,
    "erag_label_has_answer": pl.Int32,
    "erag_label_token_f1": pl.Float64,
    "gold_utility": pl.Boolean,
}
# ... with the utility signals of the document, and its ground-truth utility where the dataset has one.
DOCUMENT_SCORE_OPTIONAL_COLUMNS: dict[str, pl.DataType] = {
    **{name: dtype for name, dtype in SIGNAL_SCHEMA.items() if name not in ("query_id", "doc_id")},
    "true_utility": pl.Float64,
    # ConSens with the document left out of the context, and its attribution (ConSens §3.3).
    "consens_without": pl.Float64,
    "consens_attribution": pl.Float64,
}

# --- retrieval evaluation: MIRAGE Table 2 and oracle, eRAG Table 1 / Figure 1 -----------------
# One row per retriever: means over the queries with a positive (metrics/mirage.retriever_metrics).
MIRAGE_RETRIEVAL_SCHEMA: dict[str, pl.DataType] = {
    "retriever": pl.String,
    "k": pl.Int32,
    "queries": pl.Int32,
    "precision": pl.Float64,
    "recall": pl.Float64,
    "f1": pl.Float64,
    "ndcg": pl.Float64,  # ideal DCG from the query's positives in qrels
    "ndcg_retrieved": pl.Float64,  # ideal DCG from the retrieved list's labels (MIRAGE's code)
}
# One row per query: MIRAGE's oracle chunk, or why the query has none.
ORACLE_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String,
    "doc_id": pl.String,
    "relevance": pl.Int64,
    "positives": pl.Int32,
    "excluded": pl.String,  # null, "multi_hop" or "no_positive"
}
# Does a retrieved passage contain a gold answer (eRAG Table 1's "Containing the Answer")?
ANSWER_CONTAINMENT_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String,
    "doc_id": pl.String,
    "contains_answer": pl.Boolean,
}
# Per query, each retrieval-evaluation approach's score (null where the approach is undefined).
PREDICTOR_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String,
    "approach": pl.String,
    "measure": pl.String,
    "k": pl.Int32,
    "value": pl.Float64,
}
# eRAG Table 1 (one k) and Figure 1 (several): each approach's rank correlation with the
# downstream performance of the rag condition, with bootstrap 95 % intervals over queries.
RETRIEVAL_CORRELATION_SCHEMA: dict[str, pl.DataType] = {
    "approach": pl.String,
    "measure": pl.String,
    "target": pl.String,
    "k": pl.Int32,
    "kendall_tau": pl.Float64,
    "tau_ci_low": pl.Float64,
    "tau_ci_high": pl.Float64,
    "spearman_rho": pl.Float64,
    "rho_ci_low": pl.Float64,
    "rho_ci_high": pl.Float64,
    "n_queries": pl.Int32,
    "ci_resamples": pl.Int32,
    "undefined": pl.String,  # why the correlation is null (constant vector, < 3 queries)
}

# --- validity: the papers' validity experiments on judged datasets (evaluation/validity.py) ----
# Per judged query, every passage scored alone against its judgment: the qrels' positives (label 1)
# and the sampled negatives (label 0). ``kind``: "positive", or the negative's kind ("random", "hard").
VALIDITY_PASSAGE_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String,
    "doc_id": pl.String,
    "kind": pl.String,
    "label": pl.Int32,
}
# Teacher-forced signals of a passage shown alone for the query's pseudo-answer a
# (evaluation/signals.alone_signals): log P(a | q, d) and ConSens with the passage as the context.
ALONE_SIGNAL_SCHEMA: dict[str, pl.DataType] = {
    "query_id": pl.String,
    "doc_id": pl.String,
    "likelihood": pl.Float64,
    "consens": pl.Float64,
}
# One row per measure × query subset × negatives: how well the per-passage measure separates the
# positives from the negatives — ROC AUC with its stratified bootstrap 95 % interval, the
# point-biserial r (Pearson r with the 0/1 label, SePer Table 2's statistic) with its p-value.
VALIDITY_SCHEMA: dict[str, pl.DataType] = {
    "measure": pl.String,  # a column of the validity step's per-passage table
    "label": pl.String,
    "subset": pl.String,  # "unanswered" (SePer Table 2: closed book not answered) or "answered"
    "negatives": pl.String,  # "all", or one kind ("random", "hard")
    "n": pl.Int32,
    "n_positive": pl.Int32,
    "n_negative": pl.Int32,
    "auc": pl.Float64,
    "auc_ci_low": pl.Float64,
    "auc_ci_high": pl.Float64,
    "auc_resamples": pl.Int32,
    "r_pb": pl.Float64,
    "p_value": pl.Float64,
    "undefined": pl.String,  # why a statistic is null (no positive / negative, constant values)
}

# --- side tables: written beside an asset's main table, read by name ---------------------------
# (A table another step reads is an asset of its own, so the lineage graph shows the read.)
QRELS = "qrels"  # queries, setting_queries
UTILITY = "utility"  # queries, setting_queries: ground-truth utility of the synthetic world
CORPUS_RECORD = "corpus_record"  # corpus, setting_queries (JSON): data.corpus.corpus_record
PROMPTS = "prompts"  # closed_book_generations, generations: diagnostics shown in the metadata
ISSUES = "issues"  # closed_book_generations, generations: empty / non-finite samples per query
VALIDITY_PASSAGES = (
    "validity_passages"  # setting_queries: the dataset's validity_passages, as the setting's
)
RETRIEVER_SUMMARY = (
    "retriever_summary"  # retrieval_run (JSON): MIRAGE Table 2 numbers, read by metric_scores
)
CONTEXTS = "contexts"  # generations: CONTEXT_SCHEMA, the rag prompts' (compressed) contexts, read by metric_scores
MULTISTEP_QUERIES = "multistep_queries"  # retrieval_run: MULTISTEP_QUERY_SCHEMA, a multi-step round's queries (diagnostics)
CONSENS_LEAVE_ONE_OUT = (
    "leave_one_out"  # consens: CONSENS_LEAVE_ONE_OUT_SCHEMA (empty unless consens.leave_one_out)
)


def markdown_table(table: pl.DataFrame | Sequence[Mapping[str, object]], digits: int = 3) -> str:
    """A Markdown table of every row and column (a frame, or dict rows sharing their keys),
    floats rounded to ``digits``."""
    frame = table if isinstance(table, pl.DataFrame) else pl.DataFrame(list(table))
    if frame.is_empty():
        return "(no rows)"
    with pl.Config(
        tbl_formatting="MARKDOWN",
        tbl_hide_column_data_types=True,
        tbl_hide_dataframe_shape=True,
        tbl_rows=-1,
        tbl_cols=-1,
        float_precision=digits,
        fmt_str_lengths=200,
        tbl_width_chars=65_000,
    ):
        return str(frame)
