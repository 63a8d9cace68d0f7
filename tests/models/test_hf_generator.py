"""HFGenerator specifics: the sampler's distribution, filters, EOS, grouping, chat template."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from ragutil_dagster.models.causal_lm import load_causal_lm
from ragutil_dagster.models.generation import truncate_at_stop
from ragutil_dagster.models.hf_backend import HFGenerator
from ragutil_dagster.sampling import SamplingParams

PROMPT = "Question: where is Mount Everest? Answer:"


@pytest.fixture(scope="module")
def gen(tiny_models) -> HFGenerator:
    # float32: the sampler is checked against logits computed alone, where bfloat16 ties would
    # reorder the top-k.
    return HFGenerator(
        str(tiny_models.causal_lm), device="cpu", dtype="float32", show_progress=False
    )


def _next_token_probs(gen: HFGenerator, prompt: str) -> torch.Tensor:
    ids = torch.as_tensor([gen.lm.encode_prompts([prompt])[0]])
    with torch.no_grad():
        return gen.lm.model(input_ids=ids).logits[0, -1].float()


def test_first_token_frequencies_follow_the_filtered_distribution(gen: HFGenerator) -> None:
    """Inverse-CDF sampling with temperature and top-k draws from the right distribution."""
    logits = _next_token_probs(gen, PROMPT)
    temperature, top_k, n = 0.7, 5, 3000
    gen.max_batch_rows = n
    try:
        samples = gen.sample(
            [PROMPT], SamplingParams(n=n, max_new_tokens=1, temperature=temperature, top_k=top_k)
        )[0]
    finally:
        gen.max_batch_rows = 64
    kept = torch.topk(logits, top_k).indices
    expected = torch.softmax(logits[kept] / temperature, dim=-1).numpy()
    counts = np.array([sum(s.token_ids[0] == int(t) for s in samples) for t in kept])
    assert counts.sum() == n  # nothing outside the top-k
    # Each frequency within 4 standard errors of its probability.
    se = np.sqrt(expected * (1 - expected) / n)
    assert np.all(np.abs(counts / n - expected) < 4 * se + 1e-3), (counts / n, expected)
    # Returned log-probs are the raw model's, not the filtered ones.
    raw = torch.log_softmax(logits, dim=-1)
    assert samples[0].token_logprobs[0] == pytest.approx(
        float(raw[samples[0].token_ids[0]]), abs=1e-5
    )


def test_top_p_keeps_to_the_nucleus(gen: HFGenerator) -> None:
    logits = _next_token_probs(gen, PROMPT)
    probs, order = torch.sort(torch.softmax(logits, dim=-1), descending=True)
    top_p = 0.5
    size = int((torch.cumsum(probs, 0) - probs < top_p).sum())
    nucleus = {int(t) for t in order[:size]}
    drawn = {
        s.token_ids[0]
        for s in gen.sample([PROMPT], SamplingParams(n=64, max_new_tokens=1, top_p=top_p))[0]
    }
    assert drawn <= nucleus
    assert len(drawn) > 1 or size == 1


def test_more_samples_extend_fewer(gen: HFGenerator) -> None:
    few = gen.sample([PROMPT], SamplingParams(n=2, max_new_tokens=5, seed=4))[0]
    many = gen.sample([PROMPT], SamplingParams(n=5, max_new_tokens=5, seed=4))[0]
    assert [s.token_ids for s in many[:2]] == [s.token_ids for s in few]
    for a, b in zip(many[:2], few, strict=True):
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-5)


def test_grouping_does_not_change_results(gen: HFGenerator, tiny_models) -> None:
    prompts = [PROMPT, "The Eiffel Tower is", "Water boils at", "Shakespeare wrote"]
    big = gen.sample(prompts, SamplingParams(n=3, max_new_tokens=6, seed=2))
    small = HFGenerator(gen.lm, max_batch_rows=3, max_prefill_tokens=16, show_progress=False)
    for a, b in zip(
        big, small.sample(prompts, SamplingParams(n=3, max_new_tokens=6, seed=2)), strict=True
    ):
        assert [s.token_ids for s in a] == [s.token_ids for s in b]


def test_eos_ends_a_sample_and_is_scored(gen: HFGenerator) -> None:
    free = gen.sample([PROMPT], SamplingParams(n=1, max_new_tokens=12, seed=6))[0][0]
    eos = free.token_ids[3]  # pretend the 4th sampled token is end-of-sequence
    lm = dataclasses.replace(gen.lm, eos_ids=frozenset({eos}))
    ended = HFGenerator(lm, show_progress=False).sample(
        [PROMPT], SamplingParams(n=1, max_new_tokens=12, seed=6)
    )[0][0]
    first = free.token_ids.index(eos)
    assert ended.finish_reason == "stop"
    assert ended.token_ids == free.token_ids[: first + 1]
    assert ended.token_logprobs == pytest.approx(free.token_logprobs[: first + 1], abs=1e-5)


def test_chat_template_formats_prompts(tiny_models) -> None:
    chat = load_causal_lm(
        str(tiny_models.causal_lm), device="cpu", use_chat_template=True, system_prompt="Be brief."
    )
    text = chat.format_prompt("hi")
    assert text == "<|system|>Be brief.\n<|user|>hi\n<|assistant|>"
    sample = HFGenerator(chat, show_progress=False).sample(
        ["hi"], SamplingParams(n=1, max_new_tokens=2)
    )[0][0]
    assert sample.prompt_tokens == len(chat.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert HFGenerator(chat).settings["chat_template"] is True


def test_invalid_requests_say_what_is_wrong(gen: HFGenerator) -> None:
    with pytest.raises(ValueError, match="top_p"):
        gen.sample([PROMPT], SamplingParams(top_p=0))
    with pytest.raises(ValueError, match="n must be"):
        gen.sample([PROMPT], SamplingParams(n=0))
    with pytest.raises(ValueError, match=r"stop\[0\]"):
        gen.sample([PROMPT], SamplingParams(stop=[""]))
    with pytest.raises(TypeError, match=r"prompts\[1\]"):
        gen.sample([PROMPT, None], SamplingParams(n=1))  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"prompts\[0\] has \d+ tokens"):
        gen.sample(["word " * 3000], SamplingParams(n=1, max_new_tokens=1))
    assert gen.sample([], SamplingParams(n=2)) == []


def test_truncate_at_stop_takes_the_earliest() -> None:
    assert truncate_at_stop("abc\nQuestion: x", ["Question", "\n"]) == ("abc", True)
    assert truncate_at_stop("abc", ["z"]) == ("abc", False)
    assert SamplingParams(stop=["a"]).stop == ("a",)


def test_directory_without_a_model_fails_clearly(tmp_path) -> None:
    from ragutil_dagster.errors import ModelUnavailableError

    (tmp_path / "README").write_text("empty")
    with pytest.raises(ModelUnavailableError, match="could not be loaded as a causal LM"):
        HFGenerator(str(tmp_path))


def test_stop_strings_match_cutting_the_free_run(gen: HFGenerator) -> None:
    """Stop strings are looked for in the last tokens only: every sample of a run with stop
    strings must equal the same draws without them, cut at the earliest occurrence."""
    prompts = [PROMPT, "The capital of France is", "hi"]
    free = gen.sample(prompts, SamplingParams(n=6, max_new_tokens=24, seed=4))
    stop = ("e", "ar", "\u00e9")  # one character, two, and a two-byte character
    stopped = gen.sample(prompts, SamplingParams(n=6, max_new_tokens=24, seed=4, stop=stop))
    hits = 0
    for free_row, stopped_row in zip(free, stopped, strict=True):
        for f, s in zip(free_row, stopped_row, strict=True):
            assert s.token_ids == f.token_ids[: len(s.token_ids)]
            cut, hit = truncate_at_stop(f.text, stop)
            if hit and s.finish_reason == "stop" and s.token_ids[-1] not in gen.lm.eos_ids:
                hits += 1
                assert s.text == truncate_at_stop(gen._decode(list(s.token_ids)), stop)[0]
                assert s.text == cut
            else:
                assert s.text == f.text and s.token_ids == f.token_ids
    assert hits >= 3


def test_padded_width_depends_on_the_length_alone_and_bounds_the_padding() -> None:
    from ragutil_dagster.models.causal_lm import right_pad
    from ragutil_dagster.models.shared_prefix import padded_width

    for length in range(1, 5000):
        width = padded_width(length)
        assert length <= width and width % 16 == 0
        assert width - length < 16 or width <= 1.125 * length
    assert [padded_width(n) for n in (1, 16, 17, 128, 129, 505, 513)] == [
        16,
        16,
        32,
        128,
        144,
        512,
        576,
    ]
    ids, mask, positions = right_pad(
        [[5, 6, 7], [8]], pad_id=0, device=torch.device("cpu"), width=4
    )
    assert ids.tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]] and mask.sum(-1).tolist() == [3, 1]
    assert positions[:, 0].tolist() == [0, 0]
    with pytest.raises(ValueError, match="width of 2"):
        right_pad([[5, 6, 7]], pad_id=0, device=torch.device("cpu"), width=2)


def test_a_sample_does_not_depend_on_its_batch_mates_in_bfloat16(tiny_models) -> None:
    """Sample i of a prompt is bit-identical — tokens and log-probs — alone, beside prompts of
    other lengths in one wide group or in small groups, and drawn in adaptive rounds; each
    prompt is prefilled once at its own padded width. In bfloat16 the padding, the kernel's
    shapes and torch's scalar tails once changed most sampled texts (docs/metrics.md)."""
    from ragutil_dagster.models.generation import sample_rounds
    from ragutil_dagster.models.shared_prefix import padded_width

    gen = HFGenerator(
        str(tiny_models.causal_lm), device="cpu", dtype="bfloat16", show_progress=False
    )
    prompts = [
        "hi",
        PROMPT,
        PROMPT * 4,
        "The capital of France is",
        PROMPT * 9,
        "Once upon a time",
        PROMPT * 2,
    ]
    params = SamplingParams(n=4, max_new_tokens=12, seed=3, stop=("\n",))
    positions: list[int] = []

    def count(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] > 1:
            positions.append(int(ids.numel()))

    handle = gen.lm.model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        together = gen.sample(prompts, params)
    finally:
        handle.remove()
    assert sum(positions) == sum(padded_width(len(ids)) for ids in gen.lm.encode_prompts(prompts))
    alone = [gen.sample([prompt], params)[0] for prompt in prompts]
    small_groups = HFGenerator(gen.lm, max_batch_rows=8, show_progress=False).sample(
        prompts, params
    )
    rounds = [
        dataclasses.replace(params, n=2),
        dataclasses.replace(params, n=1, first_index=2),
        dataclasses.replace(params, n=1, first_index=3),
    ]
    in_rounds = [
        [s for got in drawn for s in got]
        for drawn in sample_rounds(gen, prompts, rounds, lambda indices, _: [True] * len(indices))
    ]
    for other in (alone, small_groups, in_rounds):
        for a_row, b_row in zip(together, other, strict=True):
            assert [(s.token_ids, s.token_logprobs, s.text) for s in a_row] == [
                (s.token_ids, s.token_logprobs, s.text) for s in b_row
            ]


def test_shared_prefix_decoding_equals_decoding_copied_caches(
    gen: HFGenerator, monkeypatch
) -> None:
    """The prompts' cache kept once per prompt (grouped-query attention over it, finished prompts
    leaving the batch) gives the samples of the cache copied n times, and the model's attention
    implementation is restored afterwards."""
    from ragutil_dagster.models import hf_backend

    config = gen.lm.model.config
    assert config.num_key_value_heads < config.num_attention_heads  # grouped-query, as SmolLM2
    prompts = ["hi", PROMPT, PROMPT * 4, "The capital of France is", "Once upon a time"]
    params = SamplingParams(n=4, max_new_tokens=24, seed=5, stop=("\n", "."))
    built = []
    original = hf_backend.SharedPrefix.from_layers

    def recorded(*args, **kwargs):
        built.append(True)
        return original(*args, **kwargs)

    monkeypatch.setattr(hf_backend.SharedPrefix, "from_layers", recorded)
    shared = gen.sample(prompts, params)
    assert built and config._attn_implementation == "sdpa"
    monkeypatch.setattr(type(gen.lm.model), "_can_set_attn_implementation", lambda self: False)
    copied = gen.sample(prompts, params)
    assert len(built) == 1
    lengths = {len(s.token_ids) for row in shared for s in row}
    assert len(lengths) > 2  # samples finished at different steps: the batch was compacted
    # float32 rounding apart: the fused kernel sums the prompt's positions block by block
    for a_row, b_row in zip(shared, copied, strict=True):
        for a, b in zip(a_row, b_row, strict=True):
            assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
            np.testing.assert_allclose(a.token_logprobs, b.token_logprobs, atol=1e-5, rtol=1e-5)


def test_no_prompts_encode_to_no_ids(gen: HFGenerator) -> None:
    assert gen.lm.encode_prompts([]) == []  # the fast tokenizer itself fails on an empty batch


def test_rounds_prefill_each_prompt_once_and_continue_the_fixed_draw(
    gen: HFGenerator, monkeypatch
) -> None:
    """Adaptive rounds keep every prompt's prefill between rounds — in waves when the kept tokens
    would exceed ``max_kept_prefix_tokens`` — and a prompt's samples are the first of a fixed-N
    draw; a model decoded without a shared prefix draws the same rounds by calls."""
    from ragutil_dagster.models.generation import sample_rounds

    prompts = ["hi", PROMPT, PROMPT * 4, "The capital of France is", "Once upon a time"]
    rounds = [SamplingParams(n=4, max_new_tokens=10, seed=8, stop=("\n",))]
    rounds += [dataclasses.replace(rounds[0], n=2, first_index=first) for first in (4, 6)]
    # prompt 0 stops after the first round, prompt 2 after the second, the rest draw all three
    stops = {0: 4, 2: 6}
    asked: list[list[int]] = []

    def keep_going(indices: list[int], samples: list[list]) -> list[bool]:
        asked.append(list(indices))
        return [len(got) < stops.get(i, 8) for i, got in zip(indices, samples, strict=True)]

    prefilled: list[int] = []

    def count(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] > 1:
            prefilled.append(ids.shape[0])

    fixed = gen.sample(prompts, dataclasses.replace(rounds[0], n=8))
    handle = gen.lm.model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        kept = sample_rounds(gen, prompts, rounds, keep_going)
        assert sum(prefilled) == len(prompts) and len(asked) == 2
        prefilled.clear()
        asked.clear()
        monkeypatch.setattr(
            gen, "max_kept_prefix_tokens", 2 * len(gen.lm.encode_prompts([PROMPT * 4])[0])
        )
        in_waves = sample_rounds(gen, prompts, rounds, keep_going)
        assert sum(prefilled) == len(prompts) and len(asked) > 2  # asked once per wave and round
        prefilled.clear()
        monkeypatch.setattr(type(gen.lm.model), "_can_set_attn_implementation", lambda self: False)
        by_calls = sample_rounds(gen, prompts, rounds, keep_going)
        assert sum(prefilled) > len(prompts)  # each round prefilled its prompts again
    finally:
        handle.remove()
    for i, expected in enumerate(fixed):
        drawn = stops.get(i, 8)
        for result in (kept, in_waves, by_calls):
            samples = [s for got in result[i] for s in got]
            assert [s.token_ids for s in samples] == [s.token_ids for s in expected[:drawn]]
            np.testing.assert_allclose(
                [lp for s in samples for lp in s.token_logprobs],
                [lp for s in expected[:drawn] for lp in s.token_logprobs],
                atol=1e-5,
                rtol=0,
            )
