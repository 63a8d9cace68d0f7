"""Teacher-forced scoring of given continuations: token log-probs and per-passage attention mass.

* Token log-probs feed ConSens (Vankov et al., §2: per-token perplexity of an answer with and
  without context) and likelihood-based utility (Zhang et al. 2025, §3.3.2, eq. 7:
  Utility(d_i) = P(a | q, d_i)).
* Attention mass feeds attention-based utility (same paper, §3.3.2, eq. 6:
  Utility(d_i) = 1/T Σ_t a_t(d_i)), where a_t(d_i) is the attention the last layer pays, at the
  step generating answer token t, to the tokens of passage d_i (summed over those tokens,
  averaged over heads). The paper normalises these raw masses afterwards; we return them raw.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Self, Unpack

import numpy as np
import torch
from tqdm.auto import tqdm

from ragutil_dagster.models.causal_lm import CausalLM, LoadOptions, left_pad, load_causal_lm
from ragutil_dagster.models.identity import ModelRef
from ragutil_dagster.models.inputs import check_texts
from ragutil_dagster.models.shared_prefix import switched_attention

__all__ = ["ScoredContinuation", "TokenScorer"]


@dataclass(frozen=True)
class ScoredContinuation:
    """A continuation's tokens and their log-probabilities after the prompt.

    ``tokens`` are the token strings and ``word_ids`` the word each token belongs to (as a fast
    tokenizer's ``word_ids()``), the inputs ConSens' content-word mask needs.
    """

    token_ids: tuple[int, ...]
    tokens: tuple[str, ...]
    word_ids: tuple[int | None, ...]
    token_logprobs: tuple[float, ...]
    prompt_tokens: int

    @property
    def logprob(self) -> float:
        """log P(continuation | prompt)."""
        return float(sum(self.token_logprobs))


class TokenScorer:
    """Batched teacher-forced passes of a causal LM over prompt + continuation.

    Prompts are formatted exactly as the generator formats them (chat template or not) and
    tokenised separately from the continuation, so the scored tokens are the continuation's own.
    Log-probabilities are log-softmax of the raw logits, in float32.

    Args:
        model: hub id, local directory, :class:`ModelRef`, or a loaded :class:`CausalLM` (e.g.
            ``generator.lm``, sharing the generator's weights and prompt formatting).
        batch_size: sequences per forward pass.
        max_attention_elements: cap on one layer's eager attention weights (rows × heads ×
            length²; 2**28 float32 = 1 GiB) per ``passage_attention`` batch.
        load_options: as :func:`load_causal_lm` (:class:`LoadOptions`).
    """

    # Attention weights come from eager attention, which the HF model gives and engines do not.
    supports_attention = True

    def __init__(
        self,
        model: str | ModelRef | CausalLM,
        *,
        batch_size: int = 32,
        max_attention_elements: int = 2**28,
        show_progress: bool = True,
        **load_options: Unpack[LoadOptions],
    ) -> None:
        self.lm = load_causal_lm(model, **load_options)
        self.batch_size = batch_size
        self.max_attention_elements = max_attention_elements
        self.show_progress = show_progress

    @property
    def identity(self) -> str:
        return self.lm.identity

    def score(
        self, prompts: Sequence[str], continuations: Sequence[str]
    ) -> list[ScoredContinuation]:
        """Log-probs of each continuation's tokens after its prompt (pairs in order)."""
        return score_text_pairs(
            prompts, continuations, self.lm.tokenizer, self.lm.encode_prompts, self.score_ids
        )

    @torch.inference_mode()
    def score_ids(
        self, prompt_ids: Sequence[Sequence[int]], continuation_ids: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        """Teacher-forced log-probs (float32 arrays) of token-id continuations after token-id
        prompts."""
        results: list[np.ndarray] = [np.zeros(0, dtype=np.float32)] * len(prompt_ids)
        todo = scorable_pairs(prompt_ids, continuation_ids)
        todo.sort(key=lambda i: len(prompt_ids[i]) + len(continuation_ids[i]))
        batches = [todo[k : k + self.batch_size] for k in range(0, len(todo), self.batch_size)]
        for batch in tqdm(
            batches,
            desc="scoring",
            unit="batch",
            disable=not self.show_progress or len(batches) < 2,
        ):
            seqs = [list(prompt_ids[i]) + list(continuation_ids[i]) for i in batch]
            ids, mask, positions = left_pad(seqs, self.lm.pad_id, self.lm.device)
            # Left padding puts every continuation at the end: only the last K positions matter.
            keep = max(len(continuation_ids[i]) for i in batch) + 1
            logits = self.lm.model(
                input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep
            ).logits.float()
            logprobs = torch.log_softmax(logits[:, :-1], dim=-1)  # position t predicts t+1
            for row, i in enumerate(batch):
                cont = torch.as_tensor(list(continuation_ids[i]), device=logprobs.device)
                span = logprobs[row, logprobs.shape[1] - len(cont) :]
                results[i] = span.gather(-1, cont.unsqueeze(-1)).squeeze(-1).cpu().numpy()
        return results

    @torch.inference_mode()
    def passage_attention(
        self,
        prompts: Sequence[str],
        continuations: Sequence[str],
        passage_spans: Sequence[Sequence[tuple[int, int]]],
    ) -> list[np.ndarray]:
        """Attention-based utility (eq. 6) of each passage, per (prompt, continuation) pair.

        ``passage_spans[i]`` lists the character spans ``(start, end)`` of the passages inside
        ``prompts[i]``. Returns per pair an array with, for each passage, the last layer's
        attention from the positions that generate the continuation's tokens to the passage's
        tokens: summed over the passage's tokens, averaged over heads and over answer tokens
        (NaN for an empty continuation, where the average is undefined).

        Pairs run ``batch_size`` at a time, sorted by length and left-padded: padded keys get
        zero attention, so each pair's masses equal those of a pass over it alone (up to float
        rounding), at a fraction of the per-pass overhead of one eager forward per pair.
        """
        prompts = check_texts(prompts, "prompts")
        continuations = check_texts(continuations, "continuations")
        same_length(prompts, continuations, "continuations")
        same_length(prompts, passage_spans, "passage_spans")
        encoded = [self.lm.encode_prompt_with_offsets(prompt) for prompt in prompts]
        cont_ids = (
            [
                list(ids)
                for ids in self.lm.tokenizer(continuations, add_special_tokens=False)["input_ids"]
            ]
            if continuations
            else []
        )
        token_sets = [
            [
                _tokens_in_span(offsets, span, len(prompt), f"passage_spans[{i}][{k}]")
                for k, span in enumerate(spans)
            ]
            for i, ((_, offsets), prompt, spans) in enumerate(
                zip(encoded, prompts, passage_spans, strict=True)
            )
        ]
        # eq. 6 averages over T answer tokens: undefined (NaN) for an empty continuation.
        out = [np.full(len(spans), np.nan) for spans in passage_spans]
        todo = sorted(
            (i for i in range(len(prompts)) if cont_ids[i]),
            key=lambda i: len(encoded[i][0]) + len(cont_ids[i]),
        )
        batches = self._attention_batches(
            todo, [len(encoded[i][0]) + len(cont_ids[i]) for i in range(len(prompts))]
        )
        # Attention weights exist only in the eager implementation.
        with (
            switched_attention(self.lm.model, "eager"),
            _LastLayerAttention(self.lm.model) as probe,
        ):
            for batch in tqdm(
                batches,
                desc="attention",
                unit="batch",
                disable=not self.show_progress or len(batches) < 2,
            ):
                seqs = [encoded[i][0] + cont_ids[i] for i in batch]
                ids, mask, positions = left_pad(seqs, self.lm.pad_id, self.lm.device)
                self.lm.model(
                    input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1
                )
                weights = probe.weights  # (batch, heads, seq, seq)
                if weights is None:
                    raise RuntimeError(
                        f"{type(self.lm.model).__name__} returned no attention weights"
                    )
                for row, i in enumerate(batch):
                    shift = ids.shape[1] - len(seqs[row])  # left padding before the pair
                    out[i] = _passage_masses(
                        weights[row],
                        shift + len(encoded[i][0]),
                        len(cont_ids[i]),
                        [[shift + t for t in toks] for toks in token_sets[i]],
                    )
        return out

    def _attention_batches(self, order: list[int], lengths: list[int]) -> list[list[int]]:
        """Consecutive pairs (ascending length) of at most ``batch_size`` rows whose eager
        attention matrices (rows × heads × width², one layer at a time) stay within
        ``max_attention_elements``; a pair over the budget alone runs alone."""
        heads = getattr(self.lm.model.config, "num_attention_heads", 1)
        batches: list[list[int]] = []
        for i in order:
            width = lengths[i]  # ascending: the newest pair is the widest
            if (
                batches
                and len(batches[-1]) < self.batch_size
                and ((len(batches[-1]) + 1) * heads * width * width <= self.max_attention_elements)
            ):
                batches[-1].append(i)
            else:
                batches.append([i])
        return batches


class _LastLayerAttention:
    """Forward hook keeping only the last attention layer's weights (not all layers')."""

    def __init__(self, model: torch.nn.Module) -> None:
        spec = getattr(model, "_can_record_outputs", None) or {}
        target = spec.get("attentions")
        cls = getattr(target, "target_class", target)
        self.index = getattr(target, "index", 1)
        modules = [m for m in model.modules() if isinstance(cls, type) and isinstance(m, cls)]
        if not modules:
            raise NotImplementedError(
                f"{type(model).__name__} does not declare its attention modules; "
                "attention-based utility is unavailable for this architecture"
            )
        self.module = modules[-1]
        self.weights: torch.Tensor | None = None
        self._handle = None

    def _hook(self, _module: torch.nn.Module, _args: object, output: object) -> None:
        self.weights = output[self.index] if isinstance(output, tuple) else None

    def __enter__(self) -> Self:
        self._handle = self.module.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()
        self.weights = None


def _passage_masses(
    weights: torch.Tensor, answer_start: int, answer_tokens: int, token_sets: list[list[int]]
) -> np.ndarray:
    """Eq. 6 from one sequence's last-layer attention (heads × seq × seq): per passage, the
    attention to its tokens, summed over them and averaged over heads and answer tokens. The
    step generating answer token t runs at the position just before it."""
    queries = torch.arange(
        answer_start - 1, answer_start + answer_tokens - 1, device=weights.device
    )
    rows = weights[:, queries, :].float()  # heads × T × seq
    return np.asarray(
        [
            rows[:, :, torch.as_tensor(toks, device=rows.device)].sum(-1).mean().item()
            if toks
            else 0.0
            for toks in token_sets
        ],
        dtype=np.float64,
    )


def _tokens_in_span(
    offsets: list[tuple[int, int]], span: tuple[int, int], prompt_len: int, name: str
) -> list[int]:
    """Prompt token positions overlapping the character span of one passage."""
    start, end = span
    if not 0 <= start < end <= prompt_len:
        raise ValueError(f"{name} = {span} is not a (start, end) span inside the prompt")
    return [t for t, (a, b) in enumerate(offsets) if a >= 0 and a < end and b > start]


class EngineTokenScorer(ABC):
    """What the scorers on a generator's own engine or servers share (vLLM, OpenAI-compatible):
    its identity, ``score`` through their own ``score_ids``, and no attention weights — such
    engines do not expose them, so ``passage_attention`` refuses and ``attention_unavailable``
    says why (``supports_attention`` is the flag the pipeline reads)."""

    supports_attention = False
    attention_unavailable: str

    def __init__(self, generator: Any, show_progress: bool = True) -> None:
        # Its own setting, not the generator's: behind the generation cache the generator's
        # per-call bar is off (the cache draws one), and scoring has no other bar.
        self.generator = generator
        self.show_progress = show_progress

    @property
    def identity(self) -> str:
        return self.generator.identity

    def score(
        self, prompts: Sequence[str], continuations: Sequence[str]
    ) -> list[ScoredContinuation]:
        """Log-probs of each continuation's tokens after its prompt (pairs in order)."""
        return score_text_pairs(
            prompts,
            continuations,
            self.generator.tokenizer,
            self.generator.encode_prompts,
            self.score_ids,
        )

    @abstractmethod
    def score_ids(
        self, prompt_ids: Sequence[Sequence[int]], continuation_ids: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        """Log-probs (float32 arrays) of token-id continuations after token-id prompts."""


def score_text_pairs(
    prompts: Sequence[str],
    continuations: Sequence[str],
    tokenizer: Any,
    encode_prompts: Callable[[list[str]], list[list[int]]],
    score_ids: Callable[[list[list[int]], list[list[int]]], list[np.ndarray]],
) -> list[ScoredContinuation]:
    """Every scorer's ``score``: encode the prompts as the generator does (``encode_prompts``),
    the continuations without special tokens, score the token ids with the scorer's own
    ``score_ids``, and return each continuation with its tokens and word ids (for ConSens)."""
    prompts = check_texts(prompts, "prompts")
    continuations = check_texts(continuations, "continuations")
    same_length(prompts, continuations, "continuations")
    prompt_ids = encode_prompts(prompts)
    enc = tokenizer(continuations, add_special_tokens=False)
    cont_ids = [list(ids) for ids in enc["input_ids"]]
    scores = score_ids(prompt_ids, cont_ids)
    return [
        ScoredContinuation(
            token_ids=tuple(c_ids),
            tokens=tuple(tokenizer.convert_ids_to_tokens(c_ids)),
            word_ids=tuple(enc.word_ids(i)),
            token_logprobs=tuple(float(x) for x in lps),
            prompt_tokens=len(p_ids),
        )
        for i, (p_ids, c_ids, lps) in enumerate(zip(prompt_ids, cont_ids, scores, strict=True))
    ]


def same_length(first: Sequence[object], second: Sequence[object], name: str) -> None:
    if len(first) != len(second):
        raise ValueError(f"{len(first)} prompts but {len(second)} {name}: give one per prompt")


def scorable_pairs(
    prompt_ids: Sequence[Sequence[int]], continuation_ids: Sequence[Sequence[int]]
) -> list[int]:
    """The indices of the pairs with a continuation to score, after checking that there is one
    continuation per prompt and that each scored continuation has a prompt to follow."""
    same_length(prompt_ids, continuation_ids, "continuation_ids")
    todo = [i for i, continuation in enumerate(continuation_ids) if len(continuation)]
    for i in todo:
        if not len(prompt_ids[i]):
            raise ValueError(
                f"prompt {i} has no tokens: the first continuation token needs context"
            )
    return todo
