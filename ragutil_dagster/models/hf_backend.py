"""transformers backend: :class:`HFGenerator`, the
:class:`~ragutil_dagster.models.generation.Generator` protocol on a loaded causal LM — its own
decoding loop and sampler (inverse-CDF over each sample's own uniform numbers) and each prompt's
prefill kept between adaptive rounds. ``VLLMGenerator`` (``models.vllm_backend``) and
``OpenAIGenerator`` (``models.openai_backend``) are the other backends.

Log-probabilities are those of the model's own distribution — log-softmax of the *raw* logits —
never of the temperature / top-k / top-p processed distribution the token was drawn from.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Unpack

if TYPE_CHECKING:
    from transformers import DynamicCache

import torch
from tqdm.auto import tqdm

from ragutil_dagster.models.causal_lm import (
    CausalLM,
    LoadOptions,
    left_pad,
    load_causal_lm,
    right_pad,
)
from ragutil_dagster.models.generation import (
    KeepGoing,
    Sample,
    checked_round_prompts,
    row_seed,
    sample_rounds_by_calls,
    still_drawing,
    truncate_at_stop,
)
from ragutil_dagster.models.identity import ModelRef
from ragutil_dagster.models.inputs import check_texts, length_batches
from ragutil_dagster.models.shared_prefix import (
    MASKED_SDPA,
    SHARED_PREFIX_ATTENTION,
    SharedPrefix,
    padded_width,
    switched_attention,
    width_runs,
)
from ragutil_dagster.sampling import SamplingParams

__all__ = ["HFGenerator", "KeptPrefill"]


@contextmanager
def _head_at(model: torch.nn.Module, positions: torch.Tensor) -> Iterator[None]:
    """``model``'s output head applied at ``positions[row]`` of each row only (right-padded rows
    end at different positions; the head's input is gathered, so the model's own logit
    post-processing still applies)."""
    rows = torch.arange(len(positions), device=positions.device)

    def gathered(_module: torch.nn.Module, args: tuple) -> tuple:
        return (args[0][rows, positions].unsqueeze(1), *args[1:])

    handle = model.get_output_embeddings().register_forward_pre_hook(gathered)
    try:
        yield
    finally:
        handle.remove()


def _sample_tokens(
    logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row by inverse-CDF sampling with the row's own uniform number; return
    the tokens and their log-probabilities under the raw logits (log-softmax, not the processed
    distribution they were drawn from). ``logits`` (float32) is overwritten.

    Temperature, then top-k, then top-p (nucleus: the smallest set of most likely tokens whose
    mass reaches ``top_p``), as transformers and vLLM apply them. The sampling passes run in place
    on unnormalised weights exp((logits − max) / T) — at T = 1 the very terms the
    log-probability's normaliser sums — and the CDF is searched per block of the vocabulary
    (:func:`_inverse_cdf`): a fresh softmax, CDF and log-sum-exp over 49k tokens for hundreds of
    rows cost more per step than the rest of sampling (``bench/hf_decode_profile.py`` profiles it).
    """
    if params.temperature == 0:
        tokens = logits.argmax(dim=-1)
        return tokens, logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(
            logits, dim=-1
        )
    # log w = (logit − max) / T: the raw log-probability is T · log w − log Σ exp(logit − max).
    weights = logits.sub_(logits.amax(dim=-1, keepdim=True))
    if params.temperature != 1:
        weights.div_(params.temperature)
    weights.exp_()
    # The normaliser and the logs in float64: a lone row's sum is split across threads, and a
    # short tensor's last elements take torch's scalar log; rounded to float32 a row's
    # log-probability is then the same in any batch.
    terms = weights if params.temperature == 1 else weights.pow(params.temperature)
    normaliser = terms.sum(dim=-1, dtype=torch.float64)
    if 0 < params.top_k < weights.shape[-1]:
        # in place: a token top-k drops is never drawn, so the drawn token's weight is kept
        weights.masked_fill_(
            weights < torch.topk(weights, params.top_k, dim=-1).values[:, -1:], 0.0
        )
    tokens = _inverse_cdf(weights, params.top_p, uniforms)
    log_weights = weights.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).double().log()
    return tokens, (params.temperature * log_weights - normaliser.log()).float()


# The CDF is searched in blocks of this many tokens: the block, then the token within it.
CDF_BLOCK = 1024


def _inverse_cdf(weights: torch.Tensor, top_p: float, uniforms: torch.Tensor) -> torch.Tensor:
    """The token each row's uniform number picks from its non-negative ``weights`` (top-p applied
    first): the block of :data:`CDF_BLOCK` tokens whose cumulative weight passes the target, then
    the token within that block. Two short cumulative sums instead of one over the vocabulary;
    a zero-weight token or block is never picked."""
    if top_p < 1:
        total = weights.sum(
            dim=-1, keepdim=True, dtype=torch.float64
        ).float()  # float64: as in _sample_tokens
        probs, order = torch.sort(weights / total, dim=-1, descending=True, stable=True)
        before = torch.cumsum(probs, dim=-1) - probs
        drop = before >= top_p
        drop[:, 0] = False
        return order.gather(
            -1, _inverse_cdf(probs.masked_fill(drop, 0.0), 1.0, uniforms).unsqueeze(-1)
        ).squeeze(-1)
    rows, vocab = weights.shape
    blocks = -(-vocab // CDF_BLOCK)
    if vocab % CDF_BLOCK:
        weights = torch.nn.functional.pad(weights, (0, blocks * CDF_BLOCK - vocab))
    by_block = weights.view(rows, blocks, CDF_BLOCK)
    block_cdf = by_block.sum(dim=-1).cumsum(dim=-1)
    target = (uniforms * block_cdf[:, -1]).unsqueeze(-1)
    block = _search(block_cdf, target)
    start = torch.where(block > 0, block_cdf.gather(-1, (block - 1).clamp_(min=0)), 0.0)
    within = (
        by_block.gather(1, block.unsqueeze(-1).expand(rows, 1, CDF_BLOCK)).squeeze(1).cumsum(dim=-1)
    )
    return (block * CDF_BLOCK + _search(within, target - start)).squeeze(-1)


def _search(cdf: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose cumulative weight exceeds ``target`` (right=True skips
    flat, zero-weight steps), at most the last index with weight (rounding can put the target at
    the total)."""
    last_with_weight = torch.searchsorted(cdf, cdf[:, -1:].contiguous())
    return torch.minimum(torch.searchsorted(cdf, target, right=True), last_with_weight)


@dataclass(frozen=True)
class KeptPrefill:
    """One prompt's prefill, kept between adaptive rounds: per layer its keys and values
    (``[kv_heads, length, head_dim]``, no padding), its last logits and its last position."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    logits: torch.Tensor
    last_position: torch.Tensor

    @staticmethod
    def join(
        kept: Sequence[KeptPrefill],
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor, torch.Tensor]:
        """Prompts' kept prefills as :meth:`HFGenerator._prefill` returns a group's: keys and
        values ``[prompts, kv_heads, width, head_dim]`` right-padded to the widest
        :func:`padded_width`, last logits, the 0/1 attention mask and the last positions."""
        width = max(padded_width(p.layers[0][0].shape[-2]) for p in kept)

        def padded(states: list[torch.Tensor]) -> torch.Tensor:
            return torch.stack(
                [torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[-2])) for t in states]
            )

        layers = [
            (padded([p.layers[i][0] for p in kept]), padded([p.layers[i][1] for p in kept]))
            for i in range(len(kept[0].layers))
        ]
        device = kept[0].logits.device
        mask = torch.stack(
            [
                torch.nn.functional.pad(
                    torch.ones(p.layers[0][0].shape[-2], dtype=torch.long, device=device),
                    (0, width - p.layers[0][0].shape[-2]),
                )
                for p in kept
            ]
        )
        return (
            layers,
            torch.stack([p.logits for p in kept]),
            mask,
            torch.stack([p.last_position for p in kept]),
        )


class HFGenerator:
    """transformers backend: many prompts per batch, one prefill per prompt for its n samples.

    Each group of prompts is prefilled once (:meth:`_prefill`) and its n samples decode against
    one copy of the prompt's keys and values (:class:`SharedPrefix`; ``num_return_sequences``
    would instead repeat the prompt before prefill, costing n prefills). Decoding is our own
    loop over the cache: each sample draws from its own pre-generated uniform numbers
    (:func:`row_seed`), and its logits do not depend on the batch it is decoded in, bit for bit
    (:mod:`~ragutil_dagster.models.shared_prefix`), so a sample is the same whichever prompts
    share its batch, in fixed-N calls and adaptive rounds alike. Tokens and
    log-probs stay in tensors during the loop (one host sync per step); finished samples are
    compacted out of the batch in bulk (when a quarter of it is finished), and stop strings are
    looked for in the last few tokens only. Log-probabilities are log-softmax of the raw logits
    (in float32), not of the processed sampling distribution.

    Args:
        model: hub id, local directory, resolved :class:`ModelRef`, or a loaded :class:`CausalLM`
            (to share weights with a ``TokenScorer``).
        load_options: revision, device, dtype, use_chat_template, system_prompt,
            trust_remote_code, as
            :func:`load_causal_lm` (dtype ``None`` / ``"auto"``: bfloat16 on CUDA and on CPUs
            with native bfloat16, float32 elsewhere).
        max_batch_rows: samples decoded together (prompts per group = max_batch_rows // n).
        max_prefill_tokens: padded prompt tokens per prefill forward pass.
        max_kept_prefix_tokens: prompt tokens whose keys and values :meth:`sample_rounds` keeps
            between adaptive rounds (SmolLM2-135M: 23 KB per token in bfloat16, 1.5 GB at the
            default).
        show_progress: tqdm bar over prompts.
    """

    backend = "hf"

    def __init__(
        self,
        model: str | ModelRef | CausalLM,
        *,
        max_batch_rows: int = 64,
        max_prefill_tokens: int = 16384,
        max_kept_prefix_tokens: int = 65536,
        show_progress: bool = True,
        **load_options: Unpack[LoadOptions],
    ) -> None:
        self.lm = load_causal_lm(model, **load_options)
        self.max_batch_rows = max_batch_rows
        self.max_prefill_tokens = max_prefill_tokens
        self.max_kept_prefix_tokens = max_kept_prefix_tokens
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
        groups = length_batches(
            [len(ids) for ids in encoded],
            max(1, self.max_batch_rows // params.n),
            self.max_prefill_tokens,
        )
        with tqdm(
            total=len(prompts), desc="sampling", unit="prompt", disable=not self.show_progress
        ) as bar:
            for group in groups:
                samples = self._sample_group(
                    [prompts[i] for i in group], [encoded[i] for i in group], params
                )
                for i, got in zip(group, samples, strict=True):
                    results[i] = got
                bar.update(len(group))
        return results

    def sample_rounds(
        self, prompts: Sequence[str], rounds: Sequence[SamplingParams], keep_going: KeepGoing
    ) -> list[list[list[Sample]]]:
        """:func:`sample_rounds` with each prompt prefilled once for all its rounds.

        The prompts go in waves of at most ``max_kept_prefix_tokens`` prompt tokens, shortest
        first. A wave is prefilled once and its keys and values kept (:class:`KeptPrefill`); each
        round decodes the wave's prompts still drawing, in groups as :meth:`sample` forms them,
        against those kept keys and values, and ``keep_going`` is asked once per wave and round.
        Prefilling every round again cost about as much as the samples adaptive sampling saves
        (``bench/adaptive_cost.py`` measures it). A model decoded without a shared prefix (:meth:`_prefill`) is
        sampled by calls (:func:`sample_rounds_by_calls`)."""
        prompts = checked_round_prompts(prompts, rounds)
        if not prompts:
            return []
        if not self._shares_prefix():
            return sample_rounds_by_calls(self, prompts, rounds, keep_going)
        encoded = self.lm.encode_prompts(prompts)
        self._check_lengths(encoded)
        lengths = [len(ids) for ids in encoded]
        drawn: list[list[list[Sample]]] = [[] for _ in prompts]
        with tqdm(
            total=len(prompts),
            desc="sampling in rounds",
            unit="prompt",
            disable=not self.show_progress,
        ) as bar:
            for wave in length_batches(lengths, len(prompts), self.max_kept_prefix_tokens):
                kept = dict(
                    zip(
                        wave,
                        self._kept_prefills([encoded[i] for i in wave], rounds[0].n),
                        strict=True,
                    )
                )
                active = wave
                for number, params in enumerate(rounds):
                    groups = length_batches(
                        [lengths[i] for i in active],
                        max(1, self.max_batch_rows // params.n),
                        self.max_prefill_tokens,
                    )
                    for group in groups:
                        members = [active[g] for g in group]
                        samples = self._decode_group(
                            [prompts[m] for m in members],
                            [encoded[m] for m in members],
                            params,
                            *KeptPrefill.join([kept[m] for m in members]),
                        )
                        for m, got in zip(members, samples, strict=True):
                            drawn[m].append(got)
                    if number == len(rounds) - 1:
                        break
                    active = still_drawing(keep_going, active, drawn)
                    if not active:
                        break
                bar.update(len(wave))
        return drawn

    @torch.inference_mode()
    def _kept_prefills(self, encoded: list[list[int]], n: int) -> list[KeptPrefill]:
        """Each prompt's prefill, in the groups :meth:`sample` would prefill them for ``n`` samples."""
        kept: list[KeptPrefill | None] = [None] * len(encoded)
        for group in length_batches(
            [len(ids) for ids in encoded], max(1, self.max_batch_rows // n), self.max_prefill_tokens
        ):
            layers, logits, _, last_positions = self._prefill([encoded[i] for i in group])
            for row, i in enumerate(group):
                length = len(encoded[i])
                kept[i] = KeptPrefill(
                    [(k[row, :, :length], v[row, :, :length]) for k, v in layers],
                    logits[row],
                    last_positions[row],
                )
        return kept

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

    @torch.inference_mode()
    def _sample_group(
        self, prompts: list[str], encoded: list[list[int]], params: SamplingParams
    ) -> list[list[Sample]]:
        return self._decode_group(prompts, encoded, params, *self._prefill(encoded))

    @torch.inference_mode()
    def _decode_group(
        self,
        prompts: list[str],
        encoded: list[list[int]],
        params: SamplingParams,
        prefilled: list[tuple[torch.Tensor, torch.Tensor]] | DynamicCache,
        logits: torch.Tensor,
        mask: torch.Tensor,
        last_positions: torch.Tensor,
    ) -> list[list[Sample]]:
        """``params.n`` samples of each prompt, decoded from its prefill (:meth:`_prefill`)."""
        from transformers import DynamicCache

        lm, n, steps = self.lm, params.n, params.max_new_tokens
        # Rows i*n .. i*n+n-1 are prompt i's samples. With a shared prefix the prompts' cache
        # stays one copy each and ``cache`` holds only the generated tokens; otherwise the
        # prompt's cache is copied n times and decoded with a growing attention mask.
        shared = isinstance(prefilled, list)
        if shared:
            prefix = SharedPrefix.from_layers(prefilled, mask, n)
            cache = DynamicCache(config=lm.model.config)
        else:
            cache = prefilled
            cache.batch_repeat_interleave(n)
            width = mask.shape[1]
            mask = torch.cat([mask, mask.new_ones((len(prompts), steps))], dim=1)
            mask = mask.repeat_interleave(n, dim=0)
        logits = logits.float().repeat_interleave(n, dim=0)
        rows = len(prompts) * n
        next_pos = (last_positions + 1).repeat_interleave(n)
        uniforms = self._uniforms(prompts, params).to(lm.device)
        eos = torch.as_tensor(sorted(lm.eos_ids), device=lm.device)
        # Per row (sample): its tokens and log-probs by step, how many it has, and whether it is
        # done. ``slots`` maps the batch's positions to rows; finished rows stay in the batch
        # (decoding a token nobody reads) until a quarter of it can leave — of its rows, or with a
        # shared prefix of its prompts, whose rows leave together — then the batch and its caches
        # are compacted once, instead of copying the cache whenever a row finishes.
        token_ids = torch.full((rows, steps), lm.pad_id, dtype=torch.long, device=lm.device)
        token_logprobs = torch.zeros((rows, steps), dtype=torch.float32, device=lm.device)
        lengths = torch.zeros(rows, dtype=torch.long, device=lm.device)
        done = torch.zeros(rows, dtype=torch.bool, device=lm.device)
        cut_texts: dict[int, str] = {}
        slots = torch.arange(rows, device=lm.device)
        attention = (
            switched_attention(lm.model, SHARED_PREFIX_ATTENTION) if shared else nullcontext()
        )
        with attention:
            for step in range(steps):
                tokens, chosen = _sample_tokens(logits, params, uniforms[slots, step])
                live_in_batch = ~done[slots]
                live = slots[live_in_batch]
                token_ids[live, step] = tokens[live_in_batch]
                token_logprobs[live, step] = chosen[live_in_batch]
                lengths[live] += 1
                finished = torch.isin(tokens[live_in_batch], eos)
                if params.stop:
                    finished |= self._stopped(
                        live, finished, token_ids, step, params.stop, cut_texts
                    )
                done[live[finished]] = True
                if step == steps - 1 or bool(done.all()):
                    break
                kept = ~done[slots]
                if shared:
                    kept = kept.view(-1, n).any(dim=1)
                if 4 * int((~kept).sum()) >= len(kept):
                    keep = kept.nonzero().squeeze(-1)
                    if shared:
                        prefix = prefix.select(keep)
                        keep = (keep[:, None] * n + torch.arange(n, device=lm.device)).flatten()
                    if cache.get_seq_length() > 0:
                        cache.batch_select_indices(keep)
                    next_pos, tokens, slots = next_pos[keep], tokens[keep], slots[keep]
                    if not shared:
                        mask = mask[keep]
                inputs = (
                    {"shared_prefix": prefix}
                    if shared
                    else {"attention_mask": mask[:, : width + step + 1]}
                )
                out = lm.model(
                    input_ids=tokens.unsqueeze(-1),
                    position_ids=next_pos.unsqueeze(-1),
                    past_key_values=cache,
                    use_cache=True,
                    **inputs,
                )
                logits = out.logits[:, -1, :].float()
                next_pos = next_pos + 1
        return self._samples(encoded, n, token_ids, token_logprobs, lengths, done, cut_texts)

    def _shares_prefix(self) -> bool:
        """Whether decoding runs against a :class:`SharedPrefix`: the model's attention can be
        switched and its cache has only plain full-attention layers (:meth:`_prefill`)."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        return self.lm.model._can_set_attn_implementation() and all(
            type(layer) is DynamicLayer
            for layer in DynamicCache(config=self.lm.model.config).layers
        )

    def _prefill(
        self, encoded: list[list[int]]
    ) -> tuple[
        list[tuple[torch.Tensor, torch.Tensor]] | DynamicCache,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
    ]:
        """The prompts' keys and values, last logits, attention mask and last positions.

        Prompts of a group can differ in length several-fold (a closed-book question beside a
        prompt of five passages): padding them all to the widest would prefill mostly padding.
        They are prefilled in buckets of one :func:`padded_width`, right-padded to it under an
        explicit mask (:data:`MASKED_SDPA`), which gives a prompt the keys, values and logits it
        has in any other batch (:mod:`~ragutil_dagster.models.shared_prefix`). The buckets' keys
        and values are joined per layer (``[prompts, kv_heads, length, head_dim]``, masked zeros
        after each prompt's positions), so decoding runs the whole group as one batch against a
        :class:`SharedPrefix`. Models whose cache has other than plain full-attention layers
        (sliding windows), or whose attention cannot be switched (remote code outside
        transformers' attention interface), are prefilled as one left-padded batch and their
        cache is returned as it is, to be decoded with a growing mask.
        """
        from transformers import DynamicCache

        lm = self.lm
        config = lm.model.config
        if not self._shares_prefix():
            ids, mask, positions = left_pad(encoded, lm.pad_id, lm.device)
            cache = DynamicCache(config=config)
            out = lm.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            return cache, out.logits[:, -1, :], mask, positions[:, -1]
        lengths = [len(ids) for ids in encoded]
        last_positions = torch.as_tensor(lengths, device=lm.device) - 1
        caches, logits, masks = [], [], []
        with switched_attention(lm.model, MASKED_SDPA):
            for start, end, bucket_width in width_runs(
                [padded_width(length) for length in lengths]
            ):
                ids, mask, positions = right_pad(
                    encoded[start:end], lm.pad_id, lm.device, bucket_width
                )
                cache = DynamicCache(config=config)
                with _head_at(lm.model, last_positions[start:end]):
                    out = lm.model(
                        input_ids=ids,
                        attention_mask=mask,
                        position_ids=positions,
                        past_key_values=cache,
                        use_cache=True,
                        logits_to_keep=0,
                    )
                caches.append(cache)
                logits.append(out.logits[:, -1, :])
                masks.append(mask)
        width = max(m.shape[1] for m in masks)

        def joined(states: list[torch.Tensor]) -> torch.Tensor:
            # [rows, heads, length, head_dim]: masked zeros after each bucket's positions.
            return torch.cat(
                [torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[-2])) for t in states]
            )

        layers = [
            (
                joined([c.layers[i].keys for c in caches]),
                joined([c.layers[i].values for c in caches]),
            )
            for i in range(len(caches[0].layers))
        ]
        mask = torch.cat([torch.nn.functional.pad(m, (0, width - m.shape[1])) for m in masks])
        return layers, torch.cat(logits), mask, last_positions

    def _stopped(
        self,
        live: torch.Tensor,
        at_eos: torch.Tensor,
        token_ids: torch.Tensor,
        step: int,
        stop: tuple[str, ...],
        cut_texts: dict[int, str],
    ) -> torch.Tensor:
        """Which ``live`` rows completed a stop string with this step's token (their text, cut
        before it, goes to ``cut_texts``).

        A stop string first appears at the end of the text, so only the last tokens are decoded:
        enough for the longest stop string even at one byte per token (4 bytes per character),
        plus a margin for the window's first character, which a cut can garble. Only on a hit is
        the whole row decoded, to cut at the earliest occurrence as :func:`truncate_at_stop` does.
        """
        window = 4 * max(len(s) for s in stop) + 4
        candidates = live[~at_eos]
        hit = torch.zeros_like(at_eos)
        if not len(candidates):
            return hit
        tails = self.lm.tokenizer.batch_decode(
            token_ids[candidates, max(0, step + 1 - window) : step + 1].tolist(),
            skip_special_tokens=True,
        )
        for position, tail in enumerate(tails):
            if not any(s in tail for s in stop):
                continue
            row = int(candidates[position])
            text, found = truncate_at_stop(self._decode(token_ids[row, : step + 1].tolist()), stop)
            if found:
                cut_texts[row] = text
                hit[(live == row).nonzero().squeeze(-1)] = True
        return hit

    def _samples(
        self,
        encoded: list[list[int]],
        n: int,
        token_ids: torch.Tensor,
        token_logprobs: torch.Tensor,
        lengths: torch.Tensor,
        done: torch.Tensor,
        cut_texts: dict[int, str],
    ) -> list[list[Sample]]:
        """The decoded rows as samples, ``n`` per prompt in order."""
        ids_rows, logprob_rows = token_ids.tolist(), token_logprobs.tolist()
        samples = []
        for row, (length, finished) in enumerate(zip(lengths.tolist(), done.tolist(), strict=True)):
            ids = ids_rows[row][:length]
            samples.append(
                Sample(
                    text=cut_texts[row] if row in cut_texts else self._decode(ids),
                    token_ids=tuple(ids),
                    token_logprobs=tuple(logprob_rows[row][:length]),
                    finish_reason="stop" if finished else "length",
                    prompt_tokens=len(encoded[row // n]),
                )
            )
        return [samples[i * n : (i + 1) * n] for i in range(len(encoded))]

    def _uniforms(self, prompts: list[str], params: SamplingParams) -> torch.Tensor:
        """Per-sample uniform draws, one per decoding step, from each sample's own seed."""
        draws = []
        for prompt in prompts:
            for j in range(params.n):
                gen = torch.Generator().manual_seed(
                    row_seed(params.seed, prompt, params.first_index + j)
                )
                draws.append(torch.rand(params.max_new_tokens, generator=gen))
        return torch.stack(draws)

    def _decode(self, ids: list[int]) -> str:
        return self.lm.tokenizer.decode(ids, skip_special_tokens=True)
