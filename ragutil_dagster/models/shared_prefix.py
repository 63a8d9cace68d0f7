"""Decoding N samples of a prompt against one copy of the prompt's KV cache.

SePer draws N samples per prompt. Copying the prompt's KV cache N times (what
``num_return_sequences`` or ``batch_repeat_interleave`` do) makes every decode step read N copies
of it, and transformers' SDPA path for grouped-query models copies it once more per step
(``repeat_kv``: each key/value head repeated for its query heads). For SmolLM2 at five passages
that was 7/8 of the sampling time (issue 20, docs/performance.md). Here the prompts' keys and
values stay one copy per prompt (:class:`SharedPrefix`), the tokens generated so
far live in an ordinary ``DynamicCache`` of one row per sample, and the attention
(:func:`shared_prefix_attention`) puts both under one softmax: the n samples' queries of a prompt,
all of its query heads grouped by key/value head, attend to the prompt's keys as one batch (on the
CPU in torch's fused flash-attention kernel, which also returns the log-sum-exp that merges the
prompt's part with the row's own tokens).

It is registered with transformers' ``AttentionInterface`` as :data:`SHARED_PREFIX_ATTENTION` and
used only while decoding (:func:`switched_attention`); without a ``shared_prefix`` argument it is
SDPA unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

__all__ = ["SHARED_PREFIX_ATTENTION", "SharedPrefix", "shared_prefix_attention", "switched_attention"]

SHARED_PREFIX_ATTENTION = "ragutil_shared_prefix"


@dataclass
class SharedPrefix:
    """The prompts' keys and values, one copy per prompt, for rows laid out prompt-major.

    ``layers[i]`` is layer i's ``(keys, values)``, each ``[prompts, kv_heads, length, head_dim]``;
    ``bias`` is ``[prompts, 1, 1, length]``: 0 on prompt positions, -inf on the left padding.
    Decoding rows ``p * n .. p * n + n - 1`` are prompt p's samples. On the CPU they stay in the
    prefill's dtype, read by torch's fused attention kernel (:func:`shared_prefix_attention`);
    elsewhere they are kept in float32."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    bias: torch.Tensor
    n: int

    @classmethod
    def from_layers(
        cls, layers: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor, n: int
    ) -> SharedPrefix:
        """From a prefill's per-layer keys and values and its 0/1 attention mask ``[prompts, length]``."""
        dtype = layers[0][0].dtype if mask.device.type == "cpu" else torch.float32
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        bias = bias.masked_fill(mask == 0, float("-inf"))[:, None, None, :]
        return cls([(k.to(dtype), v.to(dtype)) for k, v in layers], bias, n)

    @property
    def prompts(self) -> int:
        return self.bias.shape[0]

    def select(self, prompts: torch.Tensor) -> SharedPrefix:
        """Only the prompts at indices ``prompts`` (finished prompts leave the batch)."""
        return SharedPrefix(
            [(k[prompts], v[prompts]) for k, v in self.layers], self.bias[prompts], self.n
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
    prefix_out, prefix_lse = _prefix_attention(per_prompt, prefix_keys, prefix_values, shared_prefix.bias, scale)
    own_scores = per_row.float() @ key.float().transpose(-1, -2) * scale  # [rows, kv, group, generated]
    own_scores = own_scores.view(prompts, n, kv_heads, group, generated).transpose(1, 2)
    own_scores = own_scores.reshape(prompts, kv_heads, n * group, generated)
    # One softmax over the prompt's positions and the row's own: each part weighted by its share
    # of the joint normaliser, from the two log-sum-exps.
    own_lse = torch.logsumexp(own_scores, dim=-1)
    total = torch.logaddexp(prefix_lse, own_lse)
    out = prefix_out.float() * torch.exp(prefix_lse - total).unsqueeze(-1)  # [prompts, kv, n * group, head_dim]
    out = out.view(prompts, kv_heads, n, group, head_dim).transpose(1, 2)
    own_probs = torch.exp(own_scores - total.unsqueeze(-1))
    own_probs = own_probs.reshape(prompts, kv_heads, n, group, generated).transpose(1, 2)
    own_probs = own_probs.reshape(rows, kv_heads, group, generated)
    out = out.reshape(rows, kv_heads, group, head_dim) + own_probs @ value.float()
    return out.reshape(rows, 1, heads, head_dim).to(query.dtype), None


def _prefix_attention(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float
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
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(SHARED_PREFIX_ATTENTION, shared_prefix_attention)
    AttentionMaskInterface.register(SHARED_PREFIX_ATTENTION, sdpa_mask)


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
