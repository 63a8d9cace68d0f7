"""The evaluation chain, composed once: prompts → samples → NLI → scores → summary.

Every caller runs these stages and wires nothing between them itself: the assets each the stage
that belongs to them (``closed_book_generations`` and ``generations``: prompts and samples;
``entailment_clusters``: the NLI table; ``metric_scores``: scores and summary), ``ragutil score``
(evaluation/records.py) and bench/seper_e2e.py's ragutil path all of them in one process. The
stages that prompt or sample take a :class:`Sampler` — the partition's generator, loaded once, with
the experiment's sampling settings, seed and templates — so a config means the same to every
caller: prompts fitted to the generator's context, samples drawn at fixed N or, with
``sampling.adaptive``, in rounds with SePer judged between them by the NLI model.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import polars as pl

from ragutil_dagster.config import ExperimentConfig, PromptConfig, SamplingConfig
from ragutil_dagster.evaluation.conditions import (
    PromptBudget,
    closed_book_prompts,
    context_prompts,
)
from ragutil_dagster.evaluation.groups import compute_nli, group_scores
from ragutil_dagster.evaluation.paper_scores import (
    document_scores,
    leave_one_out_hits,
    query_scores,
)
from ragutil_dagster.evaluation.prompt_sampling import (
    NLIStandardErrors,
    drawn_share,
    sample_prompts,
    sample_prompts_adaptive,
    samples_drawn,
)
from ragutil_dagster.evaluation.summary import summarize
from ragutil_dagster.evaluation.utility_scores import UtilityScores
from ragutil_dagster.metrics.erag import DownstreamMetric
from ragutil_dagster.metrics.seper import EntailFn
from ragutil_dagster.models.generation import Generator


@dataclass(frozen=True)
class Sampler:
    """A generator as the chain prompts and samples it: the loaded model under its configured
    name, with the sampling settings, seed and prompt templates it runs with."""

    generator: Generator
    name: str
    sampling: SamplingConfig
    seed: int
    templates: PromptConfig

    @classmethod
    def of(cls, experiment: ExperimentConfig, name: str, generator: Generator) -> Sampler:
        """Generator ``name`` of ``experiment``, loaded as ``generator``, with its templates
        (:meth:`ExperimentConfig.prompts_for`)."""
        return cls(
            generator, name, experiment.sampling, experiment.seed, experiment.prompts_for(name)
        )

    @cached_property
    def budget(self) -> PromptBudget | None:
        """The most tokens a prompt may have: the generator's context minus ``max_new_tokens``
        (asked of the generator once per sampler)."""
        return PromptBudget.of(self.generator, self.sampling.max_new_tokens)


def closed_book(sampler: Sampler, queries: pl.DataFrame) -> pl.DataFrame:
    """Stage 1, without context: one closed-book prompt per query, within the budget."""
    return closed_book_prompts(queries, sampler.templates, sampler.budget)


def with_context(
    sampler: Sampler,
    queries: pl.DataFrame,
    corpus: pl.DataFrame,
    run: pl.DataFrame,
    qrels: pl.DataFrame,
    contexts: pl.DataFrame | None = None,
    empty_retrieval: bool = False,
) -> pl.DataFrame:
    """Stage 1, with a setting's context: the ``rag``, ``per_doc`` and ``oracle`` prompts of
    ``run`` (:func:`~ragutil_dagster.evaluation.conditions.context_prompts`: a compressed
    setting's ``contexts``, a run file's ``empty_retrieval``), fitted to the budget."""
    return context_prompts(
        queries,
        corpus,
        run,
        qrels,
        sampler.templates,
        sampler.budget,
        contexts,
        empty_retrieval,
    )


def sample_prompts_by_config(
    sampler: Sampler, prompts: pl.DataFrame, queries: pl.DataFrame, entail: EntailFn | None
) -> tuple[pl.DataFrame, float]:
    """Stage 2: the sample rows of ``prompts`` — N per prompt, or with ``sampling.adaptive`` in
    rounds, SePer judged between them by ``entail`` — and the seconds that judging took (0 at
    fixed N)."""
    sampling = sampler.sampling
    if sampling.adaptive is None:
        rows = sample_prompts(prompts, sampler.generator, sampler.name, sampling, sampler.seed)
        return rows, 0.0
    if entail is None:
        raise ValueError("adaptive sampling needs an NLI model to judge SePer between rounds")
    judge = NLIStandardErrors(queries, entail)
    rows = sample_prompts_adaptive(
        prompts, sampler.generator, sampler.name, sampling, sampler.seed, judge
    )
    return rows, judge.seconds


def nli(samples: pl.DataFrame, queries: pl.DataFrame, entail: EntailFn) -> pl.DataFrame:
    """Stage 3: every distinct NLI pair SePer reads of ``samples`` (closed book and context
    together), with its probabilities (:func:`~ragutil_dagster.evaluation.groups.compute_nli`)."""
    return compute_nli(samples, queries, entail)


@dataclass(frozen=True)
class Scores:
    """A setting's scores: per group of samples (``groups``), per retrieved document
    (``documents``), per query (``per_query``) and — with ConSens's leave-one-out and relevance
    judgments — Experiment 3's retrieval hits (``hits``, else None)."""

    groups: pl.DataFrame
    documents: pl.DataFrame
    per_query: pl.DataFrame
    hits: pl.DataFrame | None


def scores(
    samples: pl.DataFrame,
    queries: pl.DataFrame,
    nli_table: pl.DataFrame,
    run: pl.DataFrame,
    *,
    consens: pl.DataFrame | None = None,
    contexts: pl.DataFrame | None = None,
    leave_one_out: pl.DataFrame | None = None,
    qrels: pl.DataFrame | None = None,
    utility_signals: pl.DataFrame | None = None,
    ground_truth: pl.DataFrame | None = None,
) -> Scores:
    """Stage 4: the group, document and query scores of a setting's ``samples`` and their
    ``nli_table``, over ``run`` (the setting's top k). What is given joins in: ConSens per query
    (``consens``) and per passage left out (``leave_one_out``; with ``qrels`` also Experiment 3's
    hits), the context tokens (``contexts``), utility signals and ground-truth utility."""
    groups = group_scores(samples, queries, nli_table)
    documents = document_scores(groups, queries, run, utility_signals, ground_truth, leave_one_out)
    hits = (
        leave_one_out_hits(documents, qrels)
        if leave_one_out is not None and qrels is not None
        else None
    )
    per_query = query_scores(groups, queries, consens, hits, contexts)
    return Scores(groups, documents, per_query, hits)


def summary(
    scored: Scores,
    samples: pl.DataFrame,
    k: int,
    sampling: SamplingConfig,
    erag_label: DownstreamMetric,
    utility: UtilityScores | None = None,
    retrieval: dict[str, float] | None = None,
) -> dict[str, float]:
    """Stage 5: the headline numbers of a setting (:func:`~ragutil_dagster.evaluation.summary.
    summarize`), then the retriever's own (``retrieval``) and, with ``sampling.adaptive``, the
    samples drawn over N per prompt (``sample_fraction``)."""
    drawn = (
        {"sample_fraction": drawn_share(samples_drawn(samples, sampling.n), sampling.n)}
        if sampling.adaptive
        else {}
    )
    return {
        **summarize(scored.per_query, scored.documents, k, erag_label, utility, scored.hits),
        **(retrieval or {}),
        **drawn,
    }
