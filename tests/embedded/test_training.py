"""The reader LM and NLI model trained on the CI-sized world: quality, loading, determinism."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from ragutil_dagster import prompts
from ragutil_dagster.embedded.training import (
    CONFIGS,
    FINGERPRINT_KEY,
    NLI_LABELS,
    TrainedWorld,
    build_tokenizer,
    fingerprint,
    train_reader,
)
from ragutil_dagster.embedded.world import make_reading_world, make_world
from ragutil_dagster.metrics.seper import SePerInput, seper_batch
from ragutil_dagster.models.entailment import Entailment
from ragutil_dagster.models.hf_backend import HFGenerator
from ragutil_dagster.sampling import SamplingParams

# The CI size (80 people, 20 companies, 600 reader steps) memorises its known facts but has not
# yet learnt to read (that takes the default size's 800-step gold-passage curriculum and more);
# the default size's reading quality is measured by `ragutil world build` and bench/validity.py.
CI_THRESHOLDS = {
    "closed_book.known": (">=", 0.8),
    "closed_book.unknown": ("<=", 0.1),
    "hard_negative_only.unknown": ("<=", 0.1),
}


@pytest.mark.parametrize("condition", sorted(CI_THRESHOLDS))
def test_ci_reader_meets_quality_thresholds(ci_trained: TrainedWorld, condition: str) -> None:
    op, bound = CI_THRESHOLDS[condition]
    row = ci_trained.quality[condition]
    assert row["n"] >= 10
    value = row["has_answer"]
    assert value >= bound if op == ">=" else value <= bound, (condition, value)


def test_build_json_records_config_timings_and_quality(ci_trained: TrainedWorld) -> None:
    report = json.loads((ci_trained.root / "build.json").read_text())
    assert report["reader_steps"] == CONFIGS["ci"].reader_steps
    assert report["quality"] == ci_trained.quality
    assert report["seconds"]["build_total"] > 0
    assert report[FINGERPRINT_KEY] == fingerprint("ci", 0) != fingerprint("ci", 1)


def test_models_load_as_plain_hugging_face_directories(ci_trained: TrainedWorld) -> None:
    tok = AutoTokenizer.from_pretrained(ci_trained.reader_dir)
    lm = AutoModelForCausalLM.from_pretrained(ci_trained.reader_dir)
    assert lm.config.model_type == "llama" and tok.eos_token_id == lm.generation_config.eos_token_id
    nli_tok = AutoTokenizer.from_pretrained(ci_trained.world_nli_dir)
    nli = AutoModelForSequenceClassification.from_pretrained(ci_trained.world_nli_dir)
    assert [nli.config.id2label[i] for i in range(3)] == list(NLI_LABELS)
    assert nli.config.label2id == {label: i for i, label in enumerate(NLI_LABELS)}
    enc = nli_tok(["Mirton", "1954"], ["Mirton", "1961"], padding=True, return_tensors="pt")
    assert nli(**enc).logits.shape == (2, 3)


def test_nli_separates_aliases_values_and_attributes(ci_trained: TrainedWorld) -> None:
    assert ci_trained.nli_accuracy >= 0.9
    tok = AutoTokenizer.from_pretrained(ci_trained.world_nli_dir)
    nli = AutoModelForSequenceClassification.from_pretrained(ci_trained.world_nli_dir).eval()
    city_a, city_b = make_world(0, "ci").pools.cities[:2]
    pairs = [(city_a, f"{city_a} City"), (city_a, city_b), (city_a, "chemist")]
    enc = tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt")
    with torch.inference_mode():
        labels = nli(**enc).logits.argmax(-1).tolist()
    assert [NLI_LABELS[i] for i in labels] == ["entailment", "contradiction", "neutral"]


def test_project_backends_load_the_models_and_seper_separates_known_facts(
    ci_trained: TrainedWorld,
) -> None:
    """HFGenerator + Entailment + metrics.seper on the trained pair: closed-book SePer is high
    on known facts and low on unknown ones (the reader's knowledge split, seen by SePer)."""
    world = make_world(0, "ci")
    questions = [q for q in world.questions if q.type == "single_hop"][:60]
    generator = HFGenerator(str(ci_trained.reader_dir), device="cpu", show_progress=False)
    entail = Entailment(
        str(ci_trained.world_nli_dir), device="cpu", cache=False, show_progress=False
    )
    samples = generator.sample(
        [prompts.closed_book(q.text) for q in questions],
        SamplingParams(n=10, temperature=1.0, max_new_tokens=6),
    )
    results = seper_batch(
        [
            SePerInput([s.text for s in ss], [s.token_logprobs for s in ss], q.answers, q.text)
            for q, ss in zip(questions, samples)
        ],
        entail,
    )
    known = [r.score for q, r in zip(questions, results) if q.known]
    unknown = [r.score for q, r in zip(questions, results) if not q.known]
    assert len(known) >= 10 and len(unknown) >= 10
    assert np.mean(known) >= 0.6 and np.mean(unknown) <= 0.2, (np.mean(known), np.mean(unknown))


@pytest.mark.slow
def test_same_seed_same_reader_weights(tmp_path: Path) -> None:
    world = make_world(3, "ci")
    reading = make_reading_world(world, "ci")
    tokenizer = build_tokenizer([world, reading])
    # Two curriculum steps, then the mixed streams: both paths of the training loop run.
    config = dataclasses.replace(
        CONFIGS["ci"], reader_steps=6, memory_batch=8, reading_batch=4, gold_alone_steps=2
    )
    runs = [
        train_reader(world, tokenizer, tmp_path / f"r{i}", config, seed=5, progress=False)
        for i in range(2)
    ]
    other = train_reader(world, tokenizer, tmp_path / "other", config, seed=6, progress=False)
    a, b, c = (load_file(str(d / "model.safetensors")) for d in (*runs, other))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert np.isfinite(sum(float(t.abs().sum()) for t in a.values()))
