"""N-sample generation with the model's own token log-probabilities.

SePer (Dai et al., ICLR 2025, §3.3, Algorithm 1 steps 1–2) needs, per question, N sampled
responses r_i and their likelihoods p(r_i | q) under the generator. Every backend implements the
:class:`Generator` protocol; :class:`HFGenerator` is the transformers backend, ``VLLMGenerator``
(``ragutil_dagster.models.vllm_backend``) the vLLM one.

Log-probabilities are always those of the model's own distribution — log-softmax of the *raw*
logits — never of the temperature / top-k / top-p processed distribution the token was drawn
from: p(r | q) in SePer is the model's likelihood of the response.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import torch
from tqdm.auto import tqdm

from ragutil_dagster.models.causal_lm import CausalLM, left_pad, load_causal_lm
from ragutil_dagster.models.identity import ModelRef
from ragutil_dagster.models.inputs import check_texts
from ragutil_dagster.sampling import SamplingParams

__all__ = [
    "FinishReason",
    "Generator",
    "HFGenerator",
    "Sample",
    "row_seed",
    "truncate_at_stop",
]

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Sample:
    """One sampled response.

    ``token_ids`` are every generated token, including the end-of-sequence token or the token
    that completed a stop string; ``token_logprobs`` are their log-probabilities under the
    model's raw distribution (log-softmax of the unprocessed logits). ``text`` is the decoded
    response without special tokens, cut before the stop string. ``finish_reason`` is
    ``"stop"`` (end-of-sequence or stop string) or ``"length"`` (``max_new_tokens`` reached).
    """

    text: str
    token_ids: tuple[int, ...]
    token_logprobs: tuple[float, ...]
    finish_reason: FinishReason
    prompt_tokens: int

    @property
    def logprob(self) -> float:
        """log p(response | prompt): the sum of the token log-probabilities."""
        return float(sum(self.token_logprobs))


@runtime_checkable
class Generator(Protocol):
    """A sampler of N responses per prompt with true log-probabilities.

    ``sample`` returns, per prompt and in order, ``n`` :class:`Sample` s. Log-probabilities are
    those of the model's own distribution (log-softmax of the raw logits), not of the processed
    sampling distribution. The same arguments and seed give the same samples, and a prompt's
    samples do not depend on the other prompts of the call.
    """

    @property
    def identity(self) -> str: ...

    @property
    def settings(self) -> dict[str, object]:
        """Everything besides per-call parameters that changes the samples (backend, model
        identity, dtype, prompt formatting): the generation cache's namespace."""
        ...

    @property
    def context_length(self) -> int | None:
        """The most positions (prompt plus generated tokens) the model handles; None if unbounded."""
        ...

    def count_prompt_tokens(self, prompts: Sequence[str]) -> list[int]:
        """Tokens of each prompt as this generator encodes it (chat template included)."""
        ...

    def sample(self, prompts: Sequence[str], params: SamplingParams) -> list[list[Sample]]: ...


def row_seed(seed: int, prompt: str, index: int) -> int:
    """The RNG seed of sample ``index`` of ``prompt``: a hash of (seed, prompt, index).

    Seeding each sample from its own content (not from its position in a batch) makes it
    independent of batch-mates and of ``n`` (asking for more samples keeps the first ones).
    """
    digest = hashlib.sha256(f"{seed}\x00{index}\x00{prompt}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def truncate_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` cut before the earliest occurrence of any stop string, and whether one occurred."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def _sample_tokens(
    logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor
) -> torch.Tensor:
    """Draw one token per row by inverse-CDF sampling with the row's own uniform number.

    Temperature, then top-k, then top-p (nucleus: the smallest set of most likely tokens whose
    mass reaches ``top_p``), as transformers and vLLM apply them.
    """
    if params.temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits / params.temperature
    if 0 < params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    order = None
    if params.top_p < 1:
        probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        before = torch.cumsum(probs, dim=-1) - probs
        drop = before >= params.top_p
        drop[:, 0] = False
        probs = probs.masked_fill(drop, 0.0)
    cdf = torch.cumsum(probs, dim=-1)
    target = (uniforms * cdf[:, -1]).unsqueeze(-1)
    # right=True skips zero-probability tokens (flat CDF steps) when the target hits a step edge.
    picked = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1)
    if order is not None:
        picked = order.gather(-1, picked)
    return picked.squeeze(-1)


@dataclass
class _Row:
    """Decoding state of one sample."""

    prompt_index: int
    prompt_tokens: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: FinishReason | None = None
    text: str | None = None


class HFGenerator:
    """transformers backend: many prompts per batch, one prefill per prompt for its n samples.

    Each group of prompts is left-padded and prefilled once; the KV cache, the last logits and
    the attention mask are then repeated ``n`` times along the batch (``num_return_sequences``
    would instead repeat the prompt before prefill, costing n prefills). Decoding is our own
    loop over the cache: each sample draws from its own pre-generated uniform numbers
    (:func:`row_seed`), so results are reproducible and independent of batch-mates; finished
    samples are dropped from the batch. Log-probabilities are log-softmax of the raw logits (in
    float32), not of the processed sampling distribution.

    Args:
        model: hub id, local directory, resolved :class:`ModelRef`, or a loaded :class:`CausalLM`
            (to share weights with a ``TokenScorer``).
        revision, device, dtype, use_chat_template, system_prompt, trust_remote_code: as
            :func:`load_causal_lm` (CUDA + bfloat16 when present, else CPU + float32).
        max_batch_rows: samples decoded together (prompts per group = max_batch_rows // n).
        max_prefill_tokens: padded prompt tokens per prefill forward pass.
        show_progress: tqdm bar over prompts.
    """

    backend = "hf"

    def __init__(
        self,
        model: str | ModelRef | CausalLM,
        *,
        revision: str | None = None,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        use_chat_template: bool = False,
        system_prompt: str | None = None,
        trust_remote_code: bool = False,
        max_batch_rows: int = 64,
        max_prefill_tokens: int = 16384,
        show_progress: bool = True,
    ) -> None:
        self.lm = load_causal_lm(
            model,
            revision=revision,
            device=device,
            dtype=dtype,
            use_chat_template=use_chat_template,
            system_prompt=system_prompt,
            trust_remote_code=trust_remote_code,
        )
        self.max_batch_rows = max_batch_rows
        self.max_prefill_tokens = max_prefill_tokens
        self.show_progress = show_progress

    @property
    def identity(self) -> str:
        return self.lm.identity

    @property
    def settings(self) -> dict[str, object]:
        return {"backend": self.backend, **self.lm.settings}

    @property
    def context_length(self) -> int | None:
        return getattr(self.lm.model.config, "max_position_embeddings", None)

    def count_prompt_tokens(self, prompts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self.lm.encode_prompts(prompts)]

    def sample(self, prompts: Sequence[str], params: SamplingParams) -> list[list[Sample]]:
        """``n`` samples per prompt (see :class:`Generator`); log-probs from the raw logits."""
        prompts = check_texts(prompts, "prompts")
        if not prompts:
            return []
        encoded = self.lm.encode_prompts(prompts)
        self._check_lengths(encoded)
        results: list[list[Sample]] = [[] for _ in prompts]
        order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))  # less padding
        with tqdm(
            total=len(prompts), desc="sampling", unit="prompt", disable=not self.show_progress
        ) as bar:
            for group in self._groups(order, encoded, params.n):
                samples = self._sample_group(
                    [prompts[i] for i in group], [encoded[i] for i in group], params
                )
                for i, got in zip(group, samples, strict=True):
                    results[i] = got
                bar.update(len(group))
        return results

    def _check_lengths(self, encoded: list[list[int]]) -> None:
        limit = self.context_length
        for i, ids in enumerate(encoded):
            if not ids:
                raise ValueError(f"prompts[{i}] encodes to no tokens")
            if limit is not None and len(ids) >= limit:
                raise ValueError(
                    f"prompts[{i}] has {len(ids)} tokens; model {self.lm.ref.name} handles "
                    f"at most {limit} positions"
                )

    def _groups(self, order: list[int], encoded: list[list[int]], n: int) -> list[list[int]]:
        """Consecutive prompts (in length order) under the row and prefill-token budgets."""
        per_group = max(1, self.max_batch_rows // n)
        groups: list[list[int]] = []
        current: list[int] = []
        for i in order:
            width = len(encoded[i])  # sorted ascending: the newest prompt is the widest
            if current and (
                len(current) == per_group or (len(current) + 1) * width > self.max_prefill_tokens
            ):
                groups.append(current)
                current = []
            current.append(i)
        if current:
            groups.append(current)
        return groups

    @torch.inference_mode()
    def _sample_group(
        self, prompts: list[str], encoded: list[list[int]], params: SamplingParams
    ) -> list[list[Sample]]:
        from transformers import DynamicCache

        lm, n = self.lm, params.n
        ids, mask, positions = left_pad(encoded, lm.pad_id, lm.device)
        cache = DynamicCache(config=lm.model.config)
        out = lm.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        # One prefill per prompt, then n copies of its cache: rows i*n .. i*n+n-1 are prompt i.
        cache.batch_repeat_interleave(n)
        logits = out.logits[:, -1, :].float().repeat_interleave(n, dim=0)
        mask = mask.repeat_interleave(n, dim=0)
        next_pos = (positions[:, -1] + 1).repeat_interleave(n)
        uniforms = self._uniforms(prompts, params).to(lm.device)
        rows = [_Row(i, len(encoded[i])) for i in range(len(prompts)) for _ in range(n)]
        active = list(range(len(rows)))
        for step in range(params.max_new_tokens):
            logprobs = torch.log_softmax(logits, dim=-1)
            tokens = _sample_tokens(logits, params, uniforms[active, step])
            chosen = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
            last_step = step == params.max_new_tokens - 1
            keep: list[int] = []
            for slot, (row_id, tok, lp) in enumerate(
                zip(active, tokens.tolist(), chosen.tolist(), strict=True)
            ):
                if not self._advance(rows[row_id], tok, lp, params.stop, last_step):
                    keep.append(slot)
            if not keep:
                break
            if len(keep) < len(active):
                index = torch.as_tensor(keep, device=lm.device)
                cache.batch_select_indices(index)
                mask, next_pos, tokens = mask[index], next_pos[index], tokens[index]
                active = [active[k] for k in keep]
            mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
            out = lm.model(
                input_ids=tokens.unsqueeze(-1),
                attention_mask=mask,
                position_ids=next_pos.unsqueeze(-1),
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1, :].float()
            next_pos = next_pos + 1
        return [[self._finish(rows[i * n + j]) for j in range(n)] for i in range(len(prompts))]

    def _uniforms(self, prompts: list[str], params: SamplingParams) -> torch.Tensor:
        """Per-sample uniform draws, one per decoding step, from each sample's own seed."""
        draws = []
        for prompt in prompts:
            for j in range(params.n):
                gen = torch.Generator().manual_seed(row_seed(params.seed, prompt, j))
                draws.append(torch.rand(params.max_new_tokens, generator=gen))
        return torch.stack(draws)

    def _advance(
        self, row: _Row, token: int, logprob: float, stop: tuple[str, ...], last_step: bool
    ) -> bool:
        """Append a token to a row; True when the row is finished."""
        row.ids.append(token)
        row.logprobs.append(logprob)
        if token in self.lm.eos_ids:
            row.finish = "stop"
        elif stop:
            text, hit = truncate_at_stop(self._decode(row.ids), stop)
            if hit:
                row.finish, row.text = "stop", text
        if row.finish is None and last_step:
            row.finish = "length"
        return row.finish is not None

    def _decode(self, ids: list[int]) -> str:
        return self.lm.tokenizer.decode(ids, skip_special_tokens=True)

    def _finish(self, row: _Row) -> Sample:
        text = row.text if row.text is not None else self._decode(row.ids)
        return Sample(
            text=text,
            token_ids=tuple(row.ids),
            token_logprobs=tuple(row.logprobs),
            finish_reason=row.finish or "length",
            prompt_tokens=row.prompt_tokens,
        )
