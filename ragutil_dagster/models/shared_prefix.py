"""Decoding N samples of a prompt against one copy of the prompt's KV cache.

SePer draws N samples per prompt. Copying the prompt's KV cache N times (what
``num_return_sequences`` or ``batch_repeat_interleave`` do) makes every decode step read N copies
of it, and transformers' SDPA path for grouped-query models copies it once more per step
(``repeat_kv``: each key/value head repeated for its query heads). For SmolLM2 at five passages
that was 7/8 of the sampling time (issue 20, docs/performance.md). Here the prompts' keys and
values stay one copy per prompt (:class:`SharedPrefix`, kept in float32), the tokens generated so
far live in an ordinary ``DynamicCache`` of one row per sample, and the attention
(:func:`shared_prefix_attention`) puts both under one softmax: the n samples' queries of a prompt,
all of its query heads grouped by key/value head, form one matrix product with the prompt's keys.

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

    ``layers[i]`` is layer i's ``(keys, values)``, each ``[prompts, kv_heads, length, head_dim]``
    in float32; ``bias`` is ``[prompts, 1, 1, length]``: 0 on prompt positions, -inf on the left
    padding. Decoding rows ``p * n .. p * n + n - 1`` are prompt p's samples."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    bias: torch.Tensor
    n: int

    @classmethod
    def from_layers(
        cls, layers: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor, n: int
    ) -> SharedPrefix:
        """From a prefill's per-layer keys and values and its 0/1 attention mask ``[prompts, length]``."""
        bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        bias = bias.masked_fill(mask == 0, float("-inf"))[:, None, None, :]
        return cls([(k.float(), v.float()) for k, v in layers], bias, n)

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
    head_dim]`` as transformers' attention functions do. Scores and the softmax are float32."""
    if shared_prefix is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    prefix_keys, prefix_values = shared_prefix.layers[module.layer_idx]
    prompts, kv_heads, length, head_dim = prefix_keys.shape
    rows, heads, steps, _ = query.shape
    if steps != 1 or rows != prompts * shared_prefix.n:
        raise ValueError(
            f"shared-prefix attention decodes one token for {prompts} × {shared_prefix.n} rows; "
            f"got queries of shape {tuple(query.shape)}"
        )
    n, group, generated = shared_prefix.n, heads // kv_heads, key.shape[2]
    scale = scaling if scaling is not None else head_dim**-0.5
    # Query head h reads key/value head h // group (transformers' repeat_kv order).
    per_row = query.float().view(rows, kv_heads, group, head_dim)
    per_prompt = per_row.view(prompts, n, kv_heads, group, head_dim).transpose(1, 2)
    per_prompt = per_prompt.reshape(prompts, kv_heads, n * group, head_dim)
    prefix_scores = per_prompt @ prefix_keys.transpose(-1, -2) * scale + shared_prefix.bias
    own_scores = per_row @ key.float().transpose(-1, -2) * scale  # [rows, kv, group, generated]
    own_scores = own_scores.view(prompts, n, kv_heads, group, generated).transpose(1, 2)
    own_scores = own_scores.reshape(prompts, kv_heads, n * group, generated)
    probs = torch.softmax(torch.cat([prefix_scores, own_scores], dim=-1), dim=-1)
    out = probs[..., :length] @ prefix_values  # [prompts, kv, n * group, head_dim]
    out = out.view(prompts, kv_heads, n, group, head_dim).transpose(1, 2)
    own_probs = probs[..., length:].reshape(prompts, kv_heads, n, group, generated).transpose(1, 2)
    own_probs = own_probs.reshape(rows, kv_heads, group, generated)
    out = out.reshape(rows, kv_heads, group, head_dim) + own_probs @ value.float()
    return out.reshape(rows, 1, heads, head_dim).to(query.dtype), None


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
