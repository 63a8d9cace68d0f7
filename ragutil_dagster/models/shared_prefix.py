"""Decoding N samples of a prompt against one copy of the prompt's KV cache.

SePer draws N samples per prompt. Copying the prompt's KV cache N times (what
``num_return_sequences`` or ``batch_repeat_interleave`` do) makes every decode step read N copies
of it, and transformers' SDPA path for grouped-query models copies it once more per step
(``repeat_kv``: each key/value head repeated for its query heads). For SmolLM2 at five passages
that was 7/8 of the sampling time (issue 20; ``bench/hf_decode_profile.py`` profiles it). Here the prompts' keys and
values stay one copy per prompt (:class:`SharedPrefix`), the tokens generated so
far live in an ordinary ``DynamicCache`` of one row per sample, and the attention
(:func:`shared_prefix_attention`) puts both under one softmax: the n samples' queries of a prompt,
all of its query heads grouped by key/value head, attend to the prompt's keys as one batch (on the
CPU in torch's fused flash-attention kernel, which also returns the log-sum-exp that merges the
prompt's part with the row's own tokens).

It is registered with transformers' ``AttentionInterface`` as :data:`SHARED_PREFIX_ATTENTION` and
used only while decoding (:func:`switched_attention`); without a ``shared_prefix`` argument it is
SDPA unchanged. The prefill runs under :data:`MASKED_SDPA`.

Together with :func:`padded_width` they make a sample independent of its batch mates, bit for
bit. torch's fused CPU attention rounds its sums differently for the same keys padded to another
width (its blocks and vector tails move), transformers' SDPA path skips the mask of a batch
without padding (``is_causal``: another kernel), and left padding moves a prompt's keys within
the kernel's blocks. In bfloat16 any of these changed most of a sample's text (docs/metrics.md,
"Batch-composition noise on the hf backend"). So a prompt is always prefilled right-padded to
:func:`padded_width` of its own length, under an explicit mask (:data:`MASKED_SDPA`), beside
prompts of that same width only; and each decoding step reads its keys at that width, again
beside prompts of the same width only (:func:`shared_prefix_attention`). Batch size, the number
of queries and the other prompts' contents then change nothing (matrix products on the CPU give
each row the same bits in any batch).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

__all__ = [
    "MASKED_SDPA",
    "SHARED_PREFIX_ATTENTION",
    "SharedPrefix",
    "padded_width",
    "shared_prefix_attention",
    "switched_attention",
    "width_runs",
]

SHARED_PREFIX_ATTENTION = "ragutil_shared_prefix"
MASKED_SDPA = "ragutil_masked_sdpa"
"""SDPA that always receives the causal-and-padding mask, with or without padding in the batch."""


def padded_width(length: int) -> int:
    """The width a prompt of ``length`` tokens is prefilled and attended at: a function of its own
    length only, so its attention is computed on the same shapes in every batch: ``length``
    rounded up to a multiple of 16, or from 128 tokens on of an eighth of the largest power of two
    not above it (so at most an eighth of padding)."""
    step = max(16, 1 << max(0, length.bit_length() - 4))
    return -(-length // step) * step


def width_runs(widths: Sequence[int]) -> tuple[tuple[int, int, int], ...]:
    """``(start, end, width)`` for each run of consecutive prompts of one :func:`padded_width`:
    the prompts that share a prefill or an attention call."""
    runs: list[tuple[int, int, int]] = []
    for i, width in enumerate(widths):
        if runs and runs[-1][2] == width:
            runs[-1] = (runs[-1][0], i + 1, width)
        else:
            runs.append((i, i + 1, width))
    return tuple(runs)


@dataclass
class SharedPrefix:
    """The prompts' keys and values, one copy per prompt, for rows laid out prompt-major.

    ``layers[i]`` is layer i's ``(keys, values)``, each ``[prompts, kv_heads, length, head_dim]``,
    a prompt's from offset 0; ``bias`` is ``[prompts, 1, 1, length]``: 0 on prompt positions,
    -inf on the padding after them.
    Decoding rows ``p * n .. p * n + n - 1`` are prompt p's samples. On the CPU they stay in the
    prefill's dtype, read by torch's fused attention kernel (:func:`shared_prefix_attention`);
    elsewhere they are kept in float32."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    bias: torch.Tensor
    n: int
    widths: tuple[int, ...]
    """Each prompt's :func:`padded_width`, the width its keys are attended at."""

    def __post_init__(self) -> None:
        # Consecutive prompts of one width attend in one kernel call.
        self.runs = width_runs(self.widths)

    @classmethod
    def from_layers(
        cls, layers: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor, n: int
    ) -> SharedPrefix:
        """From a prefill's per-layer keys and values and its 0/1 attention mask ``[prompts,
        length]`` (each prompt's tokens first, ``length`` at least each one's padded width)."""
        dtype = layers[0][0].dtype if mask.device.type == "cpu" else torch.float32
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        bias = bias.masked_fill(mask == 0, float("-inf"))[:, None, None, :]
        widths = tuple(padded_width(length) for length in mask.sum(-1).tolist())
        return cls([(k.to(dtype), v.to(dtype)) for k, v in layers], bias, n, widths)

    @property
    def prompts(self) -> int:
        return self.bias.shape[0]

    def select(self, prompts: torch.Tensor) -> SharedPrefix:
        """Only the prompts at indices ``prompts`` (finished prompts leave the batch)."""
        return SharedPrefix(
            [(k[prompts], v[prompts]) for k, v in self.layers],
            self.bias[prompts],
            self.n,
            tuple(self.widths[i] for i in prompts.tolist()),
        )


def shared_prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    shared_prefix: SharedPrefix | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """One decoding step's attention over the shared prompt (``shared_prefix``) and each row's own
    generated tokens (``key`` / ``value``: ``[rows, kv_heads, generated, head_dim]``, this step's
    token included). ``query`` is ``[rows, heads, 1, head_dim]``; returns ``[rows, 1, heads,
    head_dim]`` as transformers' attention functions do. The prompt's part accumulates in float32
    (:func:`_prefix_attention`), the row's own tokens are scored in float32."""
    if shared_prefix is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    prefix_keys, prefix_values = shared_prefix.layers[module.layer_idx]
    prompts, kv_heads, _, head_dim = prefix_keys.shape
    rows, heads, steps, _ = query.shape
    if steps != 1 or rows != prompts * shared_prefix.n:
        raise ValueError(
            f"shared-prefix attention decodes one token for {prompts} × {shared_prefix.n} rows; "
            f"got queries of shape {tuple(query.shape)}"
        )
    n, group, generated = shared_prefix.n, heads // kv_heads, key.shape[2]
    scale = scaling if scaling is not None else head_dim**-0.5
    # Query head h reads key/value head h // group (transformers' repeat_kv order).
    per_row = query.view(rows, kv_heads, group, head_dim)
    per_prompt = per_row.view(prompts, n, kv_heads, group, head_dim).transpose(1, 2)
    per_prompt = per_prompt.reshape(prompts, kv_heads, n * group, head_dim)
    # Each run of prompts of one padded width in a call of its own, at that width: a prompt's
    # keys are then reduced on the same shapes whatever group it is decoded in.
    parts = [
        _prefix_attention(
            per_prompt[start:end],
            prefix_keys[start:end, :, :width],
            prefix_values[start:end, :, :width],
            shared_prefix.bias[start:end, ..., :width],
            scale,
        )
        for start, end, width in shared_prefix.runs
    ]
    prefix_out = torch.cat([out for out, _ in parts]) if len(parts) > 1 else parts[0][0]
    prefix_lse = torch.cat([lse for _, lse in parts]) if len(parts) > 1 else parts[0][1]
    own_scores = (
        per_row.float() @ key.float().transpose(-1, -2) * scale
    )  # [rows, kv, group, generated]
    own_scores = own_scores.view(prompts, n, kv_heads, group, generated).transpose(1, 2)
    own_scores = own_scores.reshape(prompts, kv_heads, n * group, generated)
    # One softmax over the prompt's positions and the row's own: each part weighted by its share
    # of the joint normaliser, from the two log-sum-exps. The exponentials run in float64: torch
    # computes a tensor's last few elements with the scalar exp, the rest with a vectorised one
    # that can differ in the last bit, so in float32 a row's weights would depend on where the
    # batch puts it; rounded from float64 to float32 the two agree.
    own_scores = own_scores.double()
    total = torch.logaddexp(prefix_lse.double(), torch.logsumexp(own_scores, dim=-1))
    out = prefix_out.float() * torch.exp(prefix_lse - total).float().unsqueeze(
        -1
    )  # [prompts, kv, n * group, head_dim]
    out = out.view(prompts, kv_heads, n, group, head_dim).transpose(1, 2)
    own_probs = torch.exp(own_scores - total.unsqueeze(-1)).float()
    own_probs = own_probs.reshape(prompts, kv_heads, n, group, generated).transpose(1, 2)
    own_probs = own_probs.reshape(rows, kv_heads, group, generated)
    out = out.reshape(rows, kv_heads, group, head_dim) + own_probs @ value.float()
    return out.reshape(rows, 1, heads, head_dim).to(query.dtype), None


def _prefix_attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``queries`` ``[prompts, kv_heads, q, head_dim]`` over their prompt's ``keys``
    and ``values`` alone: its output ``[prompts, kv_heads, q, head_dim]`` and the log-sum-exp of
    its scores ``[prompts, kv_heads, q]`` in float32. On the CPU, torch's fused flash-attention
    kernel reads the keys and values in their own dtype (bfloat16: half the memory traffic of
    float32, which bounds this step) and accumulates in float32; elsewhere the scores are
    computed in float32."""
    if keys.device.type == "cpu":
        mask = bias.expand(queries.shape[0], queries.shape[1], queries.shape[2], keys.shape[2])
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            queries.to(keys.dtype), keys, values, 0.0, False, attn_mask=mask, scale=scale
        )
    scores = queries.float() @ keys.transpose(-1, -2) * scale + bias
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse.unsqueeze(-1)) @ values, lse


@functools.cache
def _register() -> None:
    # On first use: importing transformers costs seconds that a CLI start should not pay.
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def always_masked(*args: object, **kwargs: object) -> torch.Tensor | None:
        return sdpa_mask(*args, **{**kwargs, "allow_is_causal_skip": False})

    AttentionInterface.register(SHARED_PREFIX_ATTENTION, shared_prefix_attention)
    AttentionMaskInterface.register(SHARED_PREFIX_ATTENTION, sdpa_mask)
    AttentionInterface.register(MASKED_SDPA, sdpa_attention_forward)
    AttentionMaskInterface.register(MASKED_SDPA, always_masked)


@contextmanager
def switched_attention(model: torch.nn.Module, implementation: str) -> Iterator[None]:
    """``model`` on another attention implementation for the duration (restored after)."""
    _register()
    previous = model.config._attn_implementation
    if previous != implementation:
        model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        if previous != implementation:
            model.set_attn_implementation(previous)
