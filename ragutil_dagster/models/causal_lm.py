"""A loaded causal LM (weights, tokenizer, prompt formatting) shared by generation and scoring."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

import torch

from ragutil_dagster.errors import ModelUnavailableError
from ragutil_dagster.models.device import (
    default_causal_lm_dtype,
    resolve_device,
    resolve_dtype,
    warm_up_on_cpu,
    warn_if_bf16_emulated,
)
from ragutil_dagster.models.identity import ModelRef, error_summary
from ragutil_dagster.models.inputs import check_texts
from ragutil_dagster.models.resolver import resolve

__all__ = ["CausalLM", "encode_prompts", "format_prompt", "left_pad", "load_causal_lm", "right_pad"]


def format_prompt(
    tokenizer: object, prompt: str, use_chat_template: bool, system_prompt: str | None = None
) -> str:
    """The text a model sees for ``prompt``: as is, or as a chat user turn (after an optional
    system turn) followed by the assistant cue."""
    if not use_chat_template:
        return prompt
    messages = [{"role": "user", "content": prompt}]
    if system_prompt is not None:
        messages.insert(0, {"role": "system", "content": system_prompt})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_prompts(
    tokenizer: object,
    prompts: Sequence[str],
    use_chat_template: bool,
    system_prompt: str | None = None,
) -> list[list[int]]:
    """Token ids of each formatted prompt, identical for every backend."""
    texts = [
        format_prompt(tokenizer, p, use_chat_template, system_prompt)
        for p in check_texts(prompts, "prompts")
    ]
    if not texts:  # fast tokenizers fail on an empty batch
        return []
    # A chat template writes its own special tokens (BOS etc.); don't add them twice.
    encoded = tokenizer(texts, add_special_tokens=not use_chat_template)
    return [list(ids) for ids in encoded["input_ids"]]


@dataclass
class CausalLM:
    """A causal LM ready for inference, with the prompt formatting every consumer must share.

    ``use_chat_template`` wraps each prompt as a user message (after an optional system message)
    and appends the assistant cue; otherwise prompts are tokenised as they are, with the
    tokenizer's own special tokens (e.g. BOS).
    """

    ref: ModelRef
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    use_chat_template: bool = False
    system_prompt: str | None = None
    eos_ids: frozenset[int] = field(default_factory=frozenset)
    pad_id: int = 0

    @property
    def identity(self) -> str:
        """The model's identity (hub commit hash or directory fingerprint)."""
        return self.ref.identity

    @property
    def settings(self) -> dict[str, object]:
        """Everything besides the weights that changes this LM's outputs (for cache keys)."""
        return {
            "identity": self.identity,
            "dtype": str(self.dtype).removeprefix("torch."),
            "chat_template": self.use_chat_template,
            "system_prompt": self.system_prompt,
        }

    def format_prompt(self, prompt: str) -> str:
        """The exact text the model sees for ``prompt`` (chat-formatted when configured)."""
        return format_prompt(self.tokenizer, prompt, self.use_chat_template, self.system_prompt)

    def encode_prompts(self, prompts: Sequence[str]) -> list[list[int]]:
        """Token ids of each formatted prompt."""
        return encode_prompts(self.tokenizer, prompts, self.use_chat_template, self.system_prompt)

    def encode_prompt_with_offsets(self, prompt: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of the formatted prompt and each token's character span *in ``prompt``*.

        Tokens outside the user's text (chat scaffolding, BOS) get empty spans ``(-1, -1)``.
        """
        text = self.format_prompt(prompt)
        shift = text.find(prompt)
        if shift < 0:
            raise ValueError(
                "the chat template rewrote the prompt text; character spans cannot be mapped"
            )
        enc = self.tokenizer(
            text, add_special_tokens=not self.use_chat_template, return_offsets_mapping=True
        )
        spans: list[tuple[int, int]] = []
        for start, end in enc["offset_mapping"]:
            if end <= start or end <= shift or start >= shift + len(prompt):
                spans.append((-1, -1))
            else:
                spans.append((max(start, shift) - shift, min(end, shift + len(prompt)) - shift))
        return list(enc["input_ids"]), spans


class LoadOptions(TypedDict, total=False):
    """How :func:`load_causal_lm` loads a model: the keyword arguments every HF-backed class
    (generator, token scorer) passes through unchanged."""

    revision: str | None
    device: str | torch.device | None
    dtype: str | torch.dtype | None
    use_chat_template: bool
    system_prompt: str | None
    trust_remote_code: bool


def load_causal_lm(
    model: str | ModelRef | CausalLM,
    *,
    revision: str | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    use_chat_template: bool = False,
    system_prompt: str | None = None,
    trust_remote_code: bool = False,
) -> CausalLM:
    """Resolve and load a causal LM: on CUDA when present, else on the CPU; ``dtype`` None or
    ``"auto"`` follows :func:`~ragutil_dagster.models.device.default_causal_lm_dtype`.

    An already loaded :class:`CausalLM` is returned as is (its weights shared, the other
    arguments not applied), so generators and scorers can share one copy of a model.
    """
    if isinstance(model, CausalLM):
        return model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref = model if isinstance(model, ModelRef) else resolve(model, revision)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, default=default_causal_lm_dtype(dev))
    warn_if_bf16_emulated(dt, dev, f"model {ref.name}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(ref.path, trust_remote_code=trust_remote_code)
        lm = AutoModelForCausalLM.from_pretrained(
            ref.path, dtype=dt, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError, KeyError) as err:
        raise ModelUnavailableError(
            f"model {ref.name} ({ref.path}) could not be loaded as a causal LM: "
            f"{error_summary(err)}"
        ) from None
    if use_chat_template and not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"model {ref.name} has no chat template, but the configuration asks to use one"
        )
    lm.to(dev).eval()
    warm_up_on_cpu(lm, dev)
    eos = lm.generation_config.eos_token_id
    eos_ids = {eos} if isinstance(eos, int) else set(eos or [])
    if tokenizer.eos_token_id is not None:
        eos_ids.add(tokenizer.eos_token_id)
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = min(eos_ids) if eos_ids else 0  # padded positions are masked; any id will do
    return CausalLM(
        ref=ref,
        model=lm,
        tokenizer=tokenizer,
        device=dev,
        dtype=dt,
        use_chat_template=use_chat_template,
        system_prompt=system_prompt,
        eos_ids=frozenset(eos_ids),
        pad_id=pad,
    )


def left_pad(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ``input_ids``, ``attention_mask`` and matching ``position_ids``.

    Positions count real tokens only, so a left-padded row sees the same positions (and, up to
    float rounding, the same logits) as it would alone.
    """
    return _padded(sequences, pad_id, device, left=True)


def right_pad(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``position_ids``, ``width`` wide (default:
    the longest sequence).

    Each row's tokens sit at the same offsets as they would alone; its last token is at
    ``len(sequence) - 1``, not at the end of the row (see
    :mod:`~ragutil_dagster.models.shared_prefix` for why the sampler prefills this way).
    """
    return _padded(sequences, pad_id, device, left=False, width=width)


def _padded(
    sequences: Sequence[Sequence[int]],
    pad_id: int,
    device: torch.device,
    left: bool,
    width: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    longest = max(len(s) for s in sequences)
    if width is not None and width < longest:
        raise ValueError(f"cannot pad sequences of up to {longest} tokens to a width of {width}")
    width = longest if width is None else width
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            span = slice(width - len(seq), width) if left else slice(0, len(seq))
            ids[row, span] = torch.as_tensor(seq, dtype=torch.long)
            mask[row, span] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), positions.to(device)
