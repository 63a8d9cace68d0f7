"""Sampling a prompt table: N samples per distinct prompt, one row per sample, and — with
``labels: greedy`` — one greedy answer per prompt (``decoding`` = greedy), the answer the
papers judge.

Identical prompts (``per_doc`` at k = 1 equals ``rag``; the same passage retrieved by two
retrievers) are sampled once and shared, so every condition reads one consistent set of samples.

With ``sampling.adaptive`` (:func:`sample_prompts_adaptive`) the N samples are drawn in rounds and
a prompt stops once its SePer is precise enough (docs/metrics.md, "Adaptive sampling").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import accumulate

import polars as pl

from ragutil_dagster.config import AdaptiveSamplingConfig, SamplingConfig
from ragutil_dagster.evaluation.groups import seper_standard_errors
from ragutil_dagster.metrics.seper import EntailFn, least_standard_error
from ragutil_dagster.models.generation import Generator, Sample, sample_rounds
from ragutil_dagster.sampling import SamplingParams
from ragutil_dagster.tables import DECODING_GREEDY, DECODING_SAMPLE, GENERATION_SCHEMA, GROUP_KEYS


def sample_prompts(
    prompts: pl.DataFrame,
    generator: Generator,
    generator_name: str,
    sampling: SamplingConfig,
    seed: int,
) -> pl.DataFrame:
    """Sample every distinct prompt ``sampling.n`` times (and once greedily when the labels are
    greedy); return the generation rows."""
    decodings = [(DECODING_SAMPLE, sampling.params(seed))]
    if sampling.labels == "greedy":
        decodings.append((DECODING_GREEDY, sampling.greedy_params(seed)))
    return pl.concat(
        [
            decode_prompts(prompts, generator, generator_name, decoding, params)
            for decoding, params in decodings
        ],
        how="vertical",
    )


GroupStandardErrors = Callable[[pl.DataFrame], dict[tuple, float]]
"""The standard error of SePer of every (query_id, condition, doc_id) group of the given sample rows."""


class NLIStandardErrors:
    """The :data:`GroupStandardErrors` adaptive sampling reads between rounds, SePer judged by an
    NLI model (``entail``), and the seconds that judging took so far (``seconds``): NLI time,
    not sampling time."""

    def __init__(self, queries: pl.DataFrame, entail: EntailFn) -> None:
        self.queries, self.entail, self.seconds = queries, entail, 0.0

    def __call__(self, samples: pl.DataFrame) -> dict[tuple, float]:
        begun = time.perf_counter()
        errors = seper_standard_errors(samples, self.queries, self.entail)
        self.seconds += time.perf_counter() - begun
        return errors


def continues(
    standard_error: float, condition: str, drawn: int, n_max: int, adaptive: AdaptiveSamplingConfig
) -> bool:
    """The stop rule: a group of ``condition``'s samples draws another round while its SePer's
    standard error is above the condition's target (:meth:`AdaptiveSamplingConfig.target_for`)
    and it has drawn fewer than N_max samples."""
    return drawn < n_max and standard_error > adaptive.target_for(condition)


def round_sizes(n_max: int, adaptive: AdaptiveSamplingConfig) -> list[int]:
    """Samples drawn in each round by a prompt that never stops: ``first_round``, then
    ``round_size`` at a time, the last round cut to reach exactly N_max."""
    sizes = [min(adaptive.first_round, n_max)]
    while sum(sizes) < n_max:
        sizes.append(min(adaptive.round_size, n_max - sum(sizes)))
    return sizes


def sample_prompts_adaptive(
    prompts: pl.DataFrame,
    generator: Generator,
    generator_name: str,
    sampling: SamplingConfig,
    seed: int,
    standard_errors: GroupStandardErrors,
) -> pl.DataFrame:
    """Sample every distinct prompt in rounds (:func:`round_sizes`) until :func:`continues` says
    stop — a prompt shared by several groups (conditions, queries) goes on while any of them does;
    one that some group keeps to N whatever its samples (a target below
    :func:`~ragutil_dagster.metrics.seper.least_standard_error` of the last round short of N)
    draws its N in one call — and once greedily when the labels are greedy; return the rows. Each round
    continues the prompts' sample streams of ``seed`` (``first_index``): a prompt's N_q samples
    are the first N_q of a fixed-N draw. The generator draws the rounds
    (:func:`~ragutil_dagster.models.generation.sample_rounds`) and asks between them which prompts
    go on."""
    adaptive = sampling.adaptive
    if adaptive is None:
        raise ValueError("sample_prompts_adaptive needs sampling.adaptive")
    groups_of: dict[str, list[tuple]] = {}
    for qid, condition, doc_id, prompt in prompts.select(
        "query_id", "condition", "doc_id", "prompt"
    ).iter_rows():
        groups_of.setdefault(prompt, []).append((qid, condition, doc_id))
    sizes = round_sizes(sampling.n, adaptive)
    # A prompt with a group whose target no count short of N can meet (the closed book's by
    # default) draws all N at once, in the call a fixed-N run makes: no judging between rounds,
    # and on an engine whose samples depend on their batch mates, fixed N's very samples.
    unreachable = least_standard_error(sum(sizes[:-1])) if len(sizes) > 1 else 0.0
    at_once = [
        prompt
        for prompt, groups in groups_of.items()
        if any(adaptive.target_for(condition) < unreachable for _, condition, _ in groups)
    ]
    by_prompt = (
        dict(zip(at_once, generator.sample(at_once, sampling.params(seed)))) if at_once else {}
    )
    distinct = [prompt for prompt in groups_of if prompt not in by_prompt]
    rounds, drawn = [], 0
    for size in sizes:
        rounds.append(sampling.params(seed, size, first_index=drawn))
        drawn += size

    def keep_going(indices: list[int], samples: list[list[Sample]]) -> list[bool]:
        chosen = [distinct[i] for i in indices]
        so_far = generation_rows(
            prompts.filter(pl.col("prompt").is_in(chosen)),
            dict(zip(chosen, samples)),
            generator,
            generator_name,
            DECODING_SAMPLE,
            rounds[0],
        )
        errors = standard_errors(so_far)
        return [
            any(
                continues(errors[g], g[1], len(got), sampling.n, adaptive)
                for g in groups_of[prompt]
            )
            for prompt, got in zip(chosen, samples, strict=True)
        ]

    per_round = sample_rounds(generator, distinct, rounds, keep_going) if distinct else []
    by_prompt |= {
        prompt: [s for got in rounds_drawn for s in got]
        for prompt, rounds_drawn in zip(distinct, per_round)
    }
    samples = generation_rows(
        prompts, by_prompt, generator, generator_name, DECODING_SAMPLE, rounds[0]
    )
    if sampling.labels != "greedy":
        return samples
    return pl.concat(
        [
            samples,
            decode_prompts(
                prompts, generator, generator_name, DECODING_GREEDY, sampling.greedy_params(seed)
            ),
        ]
    )


ADAPTIVE_BIAS_NOTE = (
    "adaptive sampling: a prompt stops drawing once its SePer's standard error meets the target, so "
    "fewer than N samples are drawn (sample_fraction); the early stop biases SePer and ΔSePer low against "
    "fixed N (the shift measured with its CI: docs/metrics.md, adaptive sampling)"
)
"""Said wherever adaptive numbers are shown (Dagster metadata, MLflow tags, the run table, the reports)."""


def drawn_share(drawn: pl.DataFrame, n_max: int) -> float:
    """The samples of a :func:`samples_drawn` table over N_max per prompt it counts: 1.0 at fixed N."""
    return int(drawn["samples_drawn"].sum()) / max(int(drawn["prompts"].sum()) * n_max, 1)


def samples_drawn(rows: pl.DataFrame, n_max: int) -> pl.DataFrame:
    """Per condition: its prompts (query × doc), the samples they drew, and ``sample_fraction``,
    those samples over N_max per prompt (1.0 without adaptive sampling). Greedy answers are not
    samples."""
    return (
        rows.filter(pl.col("decoding") == DECODING_SAMPLE)
        .group_by("condition", "query_id", "doc_id")
        .len()
        .group_by("condition")
        .agg(prompts=pl.len(), samples_drawn=pl.col("len").sum())
        .with_columns(sample_fraction=pl.col("samples_drawn") / (pl.col("prompts") * n_max))
        .sort("condition")
    )


def decode_prompts(
    prompts: pl.DataFrame,
    generator: Generator,
    generator_name: str,
    decoding: str,
    params: SamplingParams,
) -> pl.DataFrame:
    """Decode every distinct prompt once with ``params`` (``decoding`` names how: sample or
    greedy); one generation row per prompt row and sample (:func:`generation_rows`)."""
    distinct = prompts["prompt"].unique(maintain_order=True).to_list()
    by_prompt = dict(zip(distinct, generator.sample(distinct, params))) if distinct else {}
    return generation_rows(prompts, by_prompt, generator, generator_name, decoding, params)


def generation_rows(
    prompts: pl.DataFrame,
    by_prompt: dict[str, list[Sample]],
    generator: Generator,
    generator_name: str,
    decoding: str,
    params: SamplingParams,
) -> pl.DataFrame:
    """One generation row per row of ``prompts`` and sample of its prompt in ``by_prompt``, sample
    indices from ``params.first_index``, the sampling settings from ``params``."""
    identity = generator.identity
    rows = []
    for qid, condition, doc_id, prompt in prompts.select(
        "query_id", "condition", "doc_id", "prompt"
    ).iter_rows():
        for index, sample in enumerate(by_prompt[prompt], start=params.first_index):
            rows.append(
                {
                    "query_id": qid,
                    "condition": condition,
                    "doc_id": doc_id,
                    "sample_index": index,
                    "decoding": decoding,
                    "text": sample.text,
                    "token_logprobs": list(sample.token_logprobs),
                    "n_tokens": len(sample.token_ids),
                    "finish_reason": sample.finish_reason,
                    "prompt_tokens": sample.prompt_tokens,
                    "generator": generator_name,
                    "model_identity": identity,
                    "seed": params.seed,
                    "temperature": params.temperature,
                    "top_p": params.top_p,
                    "top_k": params.top_k,
                    "max_new_tokens": params.max_new_tokens,
                }
            )
    return pl.DataFrame(rows, schema=GENERATION_SCHEMA)


def sample_schedule(sampling: SamplingConfig) -> list[int]:
    """The sample counts a prompt can end with: N at fixed N; with ``sampling.adaptive`` the end
    of any of its rounds (:func:`round_sizes`), from the first round's size up to N."""
    if sampling.adaptive is None:
        return [sampling.n]
    return list(accumulate(round_sizes(sampling.n, sampling.adaptive)))


def off_schedule_groups(
    prompts: pl.DataFrame, rows: pl.DataFrame, sampling: SamplingConfig
) -> pl.DataFrame:
    """The groups (``GROUP_KEYS``) of ``prompts`` and of their generation ``rows`` that break the
    sampling schedule: a sample count not in :func:`sample_schedule`, a greedy count other than
    one answer per prompt (none with ``labels: most_likely``), or rows of a group no prompt has.
    Each with its ``samples``, ``greedy`` and ``prompted``; empty when every group is on schedule."""
    keys = list(GROUP_KEYS)
    counts = rows.group_by(keys).agg(
        samples=(pl.col("decoding") == DECODING_SAMPLE).sum().cast(pl.Int64),
        greedy=(pl.col("decoding") == DECODING_GREEDY).sum().cast(pl.Int64),
    )
    prompted = prompts.select(keys).unique().with_columns(prompted=pl.lit(True))
    groups = prompted.join(
        counts, on=keys, how="full", coalesce=True, nulls_equal=True
    ).with_columns(
        pl.col("samples", "greedy").fill_null(0),
        pl.col("prompted").fill_null(False),
    )
    greedy = int(sampling.labels == "greedy")
    return (
        groups.filter(
            ~pl.col("prompted")
            | ~pl.col("samples").is_in(sample_schedule(sampling))
            | (pl.col("greedy") != greedy)
        )
        .select(*keys, "samples", "greedy", "prompted")
        .sort(keys, nulls_last=True)
    )


# What must be equal between the closed-book and the context samples a ΔSePer subtracts.
SAMPLING_COLUMNS = ("model_identity", "seed", "temperature", "top_p", "top_k", "max_new_tokens")


def sampling_mismatch(closed_book: pl.DataFrame, with_context: pl.DataFrame) -> str | None:
    """Why two generation tables cannot be compared (ΔSePer, gold utility), or None: each must
    come from one model identity and one set of sampling settings per decoding, the same in both."""

    def settings(rows: pl.DataFrame) -> dict[str, set[tuple]]:
        table: dict[str, set[tuple]] = {}
        for decoding, *values in rows.select("decoding", *SAMPLING_COLUMNS).unique().iter_rows():
            table.setdefault(decoding, set()).add(tuple(values))
        return table

    closed, context = settings(closed_book), settings(with_context)
    for decoding in sorted(set(closed) | set(context)):
        both = closed.get(decoding, set()) | context.get(decoding, set())
        if len(both) != 1 or decoding not in closed or decoding not in context:
            differing = [
                name
                for i, name in enumerate(SAMPLING_COLUMNS)
                if len({values[i] for values in both}) > 1
            ] or ["decoding"]
            return (
                f"{decoding} rows differ in {', '.join(differing)}: closed book "
                f"{sorted(closed.get(decoding, set()))}, with context {sorted(context.get(decoding, set()))}"
            )
    return None


def generation_issues(rows: pl.DataFrame) -> pl.DataFrame:
    """Per query and condition with a problem: samples whose text is empty (or blank) and
    samples with a non-finite token log-prob (NaN or ±inf: a numerically broken model or
    backend; SePer's weights of such a query are meaningless). Empty when all is well."""
    nonfinite = pl.col("token_logprobs").list.eval(pl.element().is_finite().not_()).list.any()
    return (
        rows.group_by("query_id", "condition", maintain_order=True)
        .agg(
            empty_samples=(pl.col("text").str.strip_chars() == "").sum().cast(pl.Int32),
            nonfinite_logprob_samples=nonfinite.sum().cast(pl.Int32),
            samples=pl.len().cast(pl.Int32),
        )
        .filter((pl.col("empty_samples") > 0) | (pl.col("nonfinite_logprob_samples") > 0))
        .sort("query_id", "condition")
    )
