"""Sampling a prompt table: N samples per distinct prompt, one row per sample.

Identical prompts (``per_doc`` at k = 1 equals ``rag``; the same passage retrieved by two
retrievers) are sampled once and shared, so every condition reads one consistent set of samples.
"""

from __future__ import annotations

import polars as pl

from ragutil_dagster.config import SamplingConfig
from ragutil_dagster.models.generation import Generator
from ragutil_dagster.tables import GENERATION_SCHEMA


def sample_prompts(
    prompts: pl.DataFrame,
    generator: Generator,
    generator_name: str,
    sampling: SamplingConfig,
    seed: int,
) -> pl.DataFrame:
    """Sample every distinct prompt ``sampling.n`` times; return the generation rows."""
    distinct = prompts["prompt"].unique(maintain_order=True).to_list()
    samples = generator.sample(distinct, sampling.params(seed))
    by_prompt = dict(zip(distinct, samples))
    identity = generator.identity
    rows = []
    for qid, condition, doc_id, prompt in prompts.select("query_id", "condition", "doc_id", "prompt").iter_rows():
        for index, sample in enumerate(by_prompt[prompt]):
            rows.append({
                "query_id": qid, "condition": condition, "doc_id": doc_id, "sample_index": index,
                "text": sample.text, "token_logprobs": list(sample.token_logprobs),
                "n_tokens": len(sample.token_ids), "finish_reason": sample.finish_reason,
                "prompt_tokens": sample.prompt_tokens, "generator": generator_name,
                "model_identity": identity, "seed": seed, "temperature": sampling.temperature,
                "top_p": sampling.top_p, "top_k": sampling.top_k,
                "max_new_tokens": sampling.max_new_tokens,
            })
    return pl.DataFrame(rows, schema=GENERATION_SCHEMA)


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
