"""The causal LM's and the NLI model's default dtypes (rules in models/device.py) and length batching."""

from __future__ import annotations

import warnings
from functools import partial

import pytest
import torch

from ragutil_dagster.models import device
from ragutil_dagster.models.causal_lm import load_causal_lm
from ragutil_dagster.models.device import default_causal_lm_dtype, default_nli_dtype, resolve_dtype
from ragutil_dagster.models.inputs import length_batches


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"amx_bf16": True, "avx512_bf16": False}, torch.bfloat16),
        ({"amx_bf16": False, "avx512_bf16": True}, torch.bfloat16),
        ({"amx_bf16": False, "avx512_bf16": False, "avx512_f": True}, torch.float32),
        ({}, torch.float32),  # a CPU torch reports nothing about (ARM, old torch)
    ],
)
def test_cpu_default_follows_native_bf16(monkeypatch, flags, expected) -> None:
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: flags)
    assert default_causal_lm_dtype(torch.device("cpu")) == expected
    assert default_nli_dtype(torch.device("cpu")) == torch.float32  # the NLI's labels on every CPU


def test_cuda_defaults_are_bfloat16_for_the_lm_and_float16_for_the_nli() -> None:
    assert default_causal_lm_dtype(torch.device("cuda")) == torch.bfloat16
    assert default_nli_dtype(torch.device("cuda")) == torch.float16


def test_auto_and_none_take_the_default_and_names_override_it() -> None:
    assert resolve_dtype("auto", default=torch.bfloat16) == torch.bfloat16
    assert resolve_dtype(None, default=torch.float32) == torch.float32
    assert resolve_dtype("float32", default=torch.bfloat16) == torch.float32
    assert resolve_dtype(torch.float16, default=torch.bfloat16) == torch.float16
    with pytest.raises(ValueError, match="unknown dtype 'float33'"):
        resolve_dtype("float33", default=torch.float32)


def test_loaded_model_follows_the_rule_on_this_machine(tiny_models) -> None:
    """The HF backend's model is loaded in the rule's dtype, and the generation cache's
    namespace (``settings``) says which."""
    lm = load_causal_lm(str(tiny_models.causal_lm), device="cpu")
    expected = device.default_causal_lm_dtype(torch.device("cpu"))
    assert lm.dtype == expected
    assert next(lm.model.parameters()).dtype == expected
    assert lm.settings["dtype"] == str(expected).removeprefix("torch.")


def test_length_batches_sort_and_respect_both_budgets() -> None:
    lengths = [5, 1, 9, 3, 3, 20, 2, 7]
    batches = length_batches(lengths, max_rows=3, max_tokens=16)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(lengths)
    for batch in batches:
        assert len(batch) <= 3
        # over the token budget only as a batch of one row longer than the budget itself
        assert len(batch) * max(lengths[i] for i in batch) <= 16 or len(batch) == 1
    assert [len(b) for b in batches] == [3, 2, 1, 1, 1]
    assert length_batches([], max_rows=4, max_tokens=8) == []


@pytest.mark.parametrize(
    ("flags", "dtype", "warned"),
    [
        ({}, torch.bfloat16, True),
        ({"amx_bf16": True}, torch.bfloat16, False),
        ({}, torch.float32, False),
    ],
)
def test_bfloat16_on_a_cpu_that_emulates_it_is_warned_about(
    monkeypatch, flags, dtype, warned
) -> None:
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: flags)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        device.warn_if_bf16_emulated(dtype, torch.device("cpu"), "model m")
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert bool(messages) == warned
    if warned:
        assert "model m runs in bfloat16" in messages[0] and "auto" in messages[0]


NO_SPLIT = {"VLLM_CPU_ATTN_SPLIT_KV": "0"}


def test_vllm_gets_every_core_of_a_small_machine(monkeypatch) -> None:
    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: {1, 0})
    assert device.vllm_cpu_environment({}) == {"VLLM_CPU_OMP_THREADS_BIND": "0,1"} | NO_SPLIT
    # the user's binding wins; a large machine keeps vLLM's own (a core for its scheduler)
    assert device.vllm_cpu_environment({"VLLM_CPU_OMP_THREADS_BIND": "0-3"}) == NO_SPLIT
    monkeypatch.setattr(
        device.os, "sched_getaffinity", lambda pid: set(range(device.SMALL_MACHINE_CPUS + 1))
    )
    assert device.vllm_cpu_environment({}) == NO_SPLIT


def test_vllm_attention_splits_no_keys_by_batch_unless_the_user_says(monkeypatch) -> None:
    """Key splitting by batch size makes a sample's text depend on its batch mates (adaptive
    rounds against fixed N); ragutil turns it off on every CPU, and leaves the user's value."""
    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: {0, 1})
    place = partial(
        device.vllm_cpu_placement,
        kv_cache_gib=1.0,
        kv_bytes_per_token=1,
        max_model_len=8,
        available_bytes=GIB,
    )
    ours = place(environ={})
    assert ours.environment()["VLLM_CPU_ATTN_SPLIT_KV"] == "0"
    assert ours.metadata()["vllm_cpu_attn_split_kv"] == "0 (ragutil)"
    theirs = place(environ={"VLLM_CPU_ATTN_SPLIT_KV": "1"})
    assert "VLLM_CPU_ATTN_SPLIT_KV" not in theirs.environment()
    assert theirs.metadata()["vllm_cpu_attn_split_kv"] == "1 (environment)"


GIB = 1 << 30


def test_the_kv_cache_is_sized_from_the_model_and_the_free_memory(monkeypatch) -> None:
    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: {0, 1})
    per_token, length = (
        46_080,
        2048,
    )  # SmolLM2-135M in float32: 2 × 30 layers × 3 KV heads × 64 × 4 bytes
    place = partial(
        device.vllm_cpu_placement, kv_bytes_per_token=per_token, max_model_len=length, environ={}
    )
    # a large machine: a quarter of the free memory, below the default batch's full need
    roomy = place(kv_cache_gib=None, available_bytes=20 * GIB)
    assert roomy.kv_cache_gib == pytest.approx(5.0) and roomy.kv_cache_source == "machine"
    assert roomy.environment() == {"VLLM_CPU_OMP_THREADS_BIND": "0,1"} | NO_SPLIT
    assert roomy.metadata() == {
        "vllm_cpu_threads_bind": "0,1 (machine)",
        "vllm_cpu_reserved_cpus": "0",
        "vllm_kv_cache_gib": "5.000 (machine)",
        "vllm_cpu_attn_split_kv": "0 (ragutil)",
    }
    # a short context: what 256 full-length sequences can fill, no more
    short = device.vllm_cpu_placement(
        kv_cache_gib=None,
        kv_bytes_per_token=per_token,
        max_model_len=64,
        available_bytes=20 * GIB,
        environ={},
    )
    assert short.kv_cache_gib * GIB == pytest.approx(per_token * 64 * device.VLLM_MAX_SEQS)
    # a crowded machine: at least one full-length sequence; none at all is a clear error
    assert (
        place(kv_cache_gib=None, available_bytes=per_token * length + 1).kv_cache_gib * GIB
        == per_token * length
    )
    with pytest.raises(ValueError, match="max_model_len = 2048 tokens needs 0.09 GiB"):
        place(kv_cache_gib=None, available_bytes=per_token * length - 1)
    # the configured size and the user's own binding win
    mine = device.vllm_cpu_placement(
        kv_cache_gib=1.5,
        kv_bytes_per_token=per_token,
        max_model_len=length,
        available_bytes=GIB,
        environ={"VLLM_CPU_OMP_THREADS_BIND": "1"},
    )
    assert (mine.kv_cache_gib, mine.kv_cache_source, mine.threads_bind, mine.threads_source) == (
        1.5,
        "config",
        "1",
        "environment",
    )
    assert mine.environment() == NO_SPLIT
