"""Tiny, randomly initialised models written as ordinary HF / sentence-transformers directories.

They stand in for real checkpoints in tests and offline smoke runs: every builder trains its
tokenizer locally (``tokenizers`` library) on a small built-in text, initialises weights from a
seed, and writes a directory that ``transformers`` / ``sentence-transformers`` load like any
downloaded model. Same seed → byte-identical files → same :func:`resolve_model` identity.
"""

from __future__ import annotations

import shutil
import string
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

__all__ = [
    "TINY_NLI_LABELS",
    "TinyModels",
    "build_causal_lm",
    "build_cross_encoder",
    "build_embedder",
    "build_nli_classifier",
    "build_tiny_models",
    "corpus_lines",
    "train_bpe_tokenizer",
]

# Deliberately not the MNLI order (contradiction, neutral, entailment): consumers must read
# id2label.
TINY_NLI_LABELS: dict[int, str] = {0: "entailment", 1: "contradiction", 2: "neutral"}

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_CORPUS = """
The Eiffel Tower is a wrought-iron lattice tower in Paris, France, completed in 1889.
Mount Everest is Earth's highest mountain above sea level, located in the Himalayas.
The Nile is a major north-flowing river in northeastern Africa and one of the longest rivers.
Marie Curie was a physicist and chemist who conducted pioneering research on radioactivity.
Water boils at 100 degrees Celsius at sea level and freezes at 0 degrees Celsius.
The Great Wall of China is a series of fortifications built across northern China.
Python is a high-level programming language known for its readability.
The human heart pumps blood through the circulatory system of the body.
Shakespeare wrote plays such as Hamlet, Macbeth, Othello and King Lear.
The speed of light in vacuum is about 299,792 kilometres per second.
Question: who wrote Hamlet? Answer: William Shakespeare.
Question: what is the capital of France? Answer: Paris.
Question: where is Mount Everest? Answer: in the Himalayas, on the border of Nepal and China.
Question: when was the Eiffel Tower completed? Answer: in 1889.
A retrieved passage may support the answer, contradict it, or be unrelated to the question.
Premise: the cat sat on the mat. Hypothesis: an animal is on the mat. Label: entailment.
Premise: the sky is blue today. Hypothesis: the sky is green today. Label: contradiction.
Premise: a man plays guitar. Hypothesis: the man is a famous musician. Label: neutral.
Numbers like 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 appear in many answers.
The quick brown fox jumps over the lazy dog while the committee reviews the evidence.
"""


@dataclass(frozen=True)
class TinyModels:
    """Directories of one complete set of tiny models."""

    causal_lm: Path
    nli: Path
    embedder: Path
    cross_encoder: Path


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed torch for weight initialisation without disturbing the caller's global RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def corpus_lines() -> list[str]:
    """The built-in text the tiny tokenizers are trained on, one sentence per line."""
    return [line for line in _CORPUS.strip().splitlines() if line.strip()]


def train_bpe_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE (any text encodes, no unknown token), with <s>, </s>, <pad> specials."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    # Prepend <s> like Llama tokenizers do, so teacher-forced scoring sees a BOS position.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def _train_wordpiece_tokenizer() -> PreTrainedTokenizerFast:
    """BERT-style lower-cased WordPiece with [CLS] A [SEP] (B [SEP]) framing and segment ids.

    The vocabulary is learnt from the built-in text: every word it contains, plus single
    characters (word-initial and ``##`` continuation) so unseen words still split into pieces.
    It is built explicitly because the WordPiece trainer breaks frequency ties in hash order,
    which would make the files (and so the model identity) differ between runs.
    """
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    words = {
        piece
        for line in corpus_lines()
        for piece, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(line))
    }
    chars = string.ascii_lowercase + string.digits + string.punctuation
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    pieces = sorted(set(chars) | {f"##{c}" for c in chars} | words)
    tok.model = models.WordPiece(
        vocab={token: i for i, token in enumerate(specials + pieces)}, unk_token="[UNK]"
    )
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def _bert_config(tokenizer: PreTrainedTokenizerFast, hidden: int, **extra: object) -> BertConfig:
    return BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )


def build_causal_lm(
    directory: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    vocab_size: int = 512,
    max_positions: int = 2048,
    chat_template: bool = True,
) -> Path:
    """Write a Llama-architecture causal LM (random weights) and its locally trained tokenizer.

    ``chat_template`` stores a minimal role-tagged template so chat formatting can be exercised.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_bpe_tokenizer(vocab_size)
    if chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        # Far above the usual 0.02 so the random model has a peaked, non-uniform distribution.
        initializer_range=0.25,
    )
    with _seeded(seed):
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _save_bert_classifier(
    out: Path, tokenizer: PreTrainedTokenizerFast, config: BertConfig, seed: int
) -> Path:
    """Initialise a BERT sequence classifier from ``seed`` and save it with its tokenizer."""
    with _seeded(seed):
        model = BertForSequenceClassification(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_nli_classifier(directory: str | Path, *, seed: int = 0, hidden_size: int = 32) -> Path:
    """Write a BERT sequence-pair classifier with labels in :data:`TINY_NLI_LABELS` order."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_wordpiece_tokenizer()
    config = _bert_config(
        tokenizer,
        hidden_size,
        num_labels=len(TINY_NLI_LABELS),
        id2label=dict(TINY_NLI_LABELS),
        label2id={v: k for k, v in TINY_NLI_LABELS.items()},
        initializer_range=0.2,
    )
    return _save_bert_classifier(out, tokenizer, config, seed)


def build_cross_encoder(directory: str | Path, *, seed: int = 0, hidden_size: int = 32) -> Path:
    """Write a BERT single-logit pair scorer, loadable by ``sentence_transformers.CrossEncoder``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_wordpiece_tokenizer()
    config = _bert_config(tokenizer, hidden_size, num_labels=1, initializer_range=0.2)
    return _save_bert_classifier(out, tokenizer, config, seed)


def build_embedder(directory: str | Path, *, seed: int = 0, hidden_size: int = 32) -> Path:
    """Write a sentence-transformers model: tiny BERT → mean pooling → L2 normalisation."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    backbone = out / "_backbone"
    tokenizer = _train_wordpiece_tokenizer()
    with _seeded(seed):
        model = BertModel(_bert_config(tokenizer, hidden_size, initializer_range=0.2))
    model.save_pretrained(backbone)
    tokenizer.save_pretrained(backbone)
    encoder = Transformer(str(backbone), max_seq_length=128)
    st = SentenceTransformer(
        modules=[encoder, Pooling(hidden_size, "mean"), Normalize()], device="cpu"
    )
    st.save(str(out))
    shutil.rmtree(backbone)
    return out


def build_tiny_models(root: str | Path, *, seed: int = 0) -> TinyModels:
    """Build one of each tiny model under ``root`` (sub-directories lm, nli, embedder, reranker)."""
    root = Path(root)
    return TinyModels(
        causal_lm=build_causal_lm(root / "lm", seed=seed),
        nli=build_nli_classifier(root / "nli", seed=seed),
        embedder=build_embedder(root / "embedder", seed=seed),
        cross_encoder=build_cross_encoder(root / "reranker", seed=seed),
    )


# Qwen2.5-0.5B's published architecture (config.json of Qwen/Qwen2.5-0.5B), for GPU benchmarks
# that need a realistically sized model without downloading one.
QWEN2_5_0_5B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
}


def build_random_qwen(
    directory: str | Path, tokenizer: PreTrainedTokenizerFast, *, seed: int = 0
) -> Path:
    """Write a randomly initialised model of Qwen2.5-0.5B's configuration with ``tokenizer``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        **QWEN2_5_0_5B,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    out = Path(directory)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
