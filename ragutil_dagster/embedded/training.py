"""Train the synthetic world's reader LM and NLI model (``world-nli``) from scratch on CPU.

The reader is a small Llama-style causal LM over a word-level vocabulary of the world's text. It
learns (a) the *known* entities' facts — their passages as plain text and closed-book questions
about them — and (b) reading comprehension on a disjoint training world: questions answered from
a context of one to three passages, with MIRAGE-style distractors and two-hop questions. Loss is
on answer tokens only for questions, on every token for fact passages. The NLI model is a small
BERT classifier trained on answer pairs (aliases of one value → entailment, different values of
one attribute → contradiction, values of different attributes → neutral).

:func:`train_all` also fine-tunes the answer-equivalence NLI of real text
(:mod:`~ragutil_dagster.embedded.answer_nli`). All are saved as ordinary Hugging Face directories (``save_pretrained`` model + a
``PreTrainedTokenizerFast``), so the project's generator and entailment backends load them like
any other model. With the same seed, CPU training is bit-for-bit repeatable
(``torch.use_deterministic_algorithms``) at a given thread count.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors
from tqdm.auto import tqdm
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    BertConfig,
    BertForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from ragutil_dagster import prompts
from ragutil_dagster.embedded import layout
from ragutil_dagster.embedded.answer_nli import train_answer_nli
from ragutil_dagster.embedded.train_loop import (
    NLI_LABELS,
    deterministic,
    lr_schedule,
    optimiser_step,
    save_for_inference,
)
from ragutil_dagster.embedded.world import (
    ATTRIBUTE_BY_NAME,
    ATTRIBUTES,
    INDUSTRIES,
    OCCUPATIONS,
    YEARS,
    Entity,
    Passage,
    Question,
    World,
    make_reading_world,
    make_world,
    value_aliases,
    write_world,
)
from ragutil_dagster.infra.files import stable_hash, write_text_atomic
from ragutil_dagster.metrics.answers import has_answer

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[BOS]", "[EOS]", "[CLS]", "[SEP]")


# A retriever hands the reader k passages, the gold one anywhere among them or missing. Trained on
# one to three passages only, the reader collapsed at k = 5 (demo: EM 0.095 against 0.595 at
# k = 1): it had never seen a position past ~170 tokens nor a fourth document. So a reading batch
# holds the gold passage alone, two or three passages, or four to ten, shuffled.
CONTEXT_SIZES = ((1, 1, 0.3), (2, 3, 0.3), (4, 10, 0.4))
# Batches of longer contexts hold proportionally fewer examples (the batch's token count, and so a
# step's time, stays about that of a batch of three-passage contexts).
FULL_BATCH_PASSAGES = 3
# Room for ten passages and the question (a passage is at most ~55 tokens).
MAX_POSITIONS = 1024


@dataclass(frozen=True)
class TrainConfig:
    """How long and on what the two models train."""

    world_size: str
    reader_steps: int
    memory_batch: int
    reading_batch: int
    nli_steps: int
    nli_batch: int
    reading_steps: int = (
        4  # context-question steps per cycle (even), besides one "ask" and one "facts"
    )
    threads: int = 1
    # Curriculum: the first steps read single-hop questions with the gold passage alone, before
    # the mixed streams (reading otherwise emerges late, or not at all, beside memorisation).
    gold_alone_steps: int = 0
    # Weight of next-token loss on the context of reading examples (0: answer tokens only).
    context_loss: float = 0.0
    # Share of single-hop reading questions asked about each listed attribute (the rest at the
    # reading world's own rates): curriculum_shares in the gold-passage curriculum, answer_shares
    # in the mixed phase after it. See ReaderData._single_question.
    curriculum_shares: tuple[tuple[str, float], ...] = ()
    answer_shares: tuple[tuple[str, float], ...] = ()
    # Passages in a reading batch's contexts, drawn per batch: (fewest, most, probability).
    context_sizes: tuple[tuple[int, int, float], ...] = CONTEXT_SIZES
    lr: float = 2e-3
    hidden: int = 128
    layers: int = 4


# Answers the reader must be made to copy (see ReaderData._single_question): company names, and
# the company attributes (~5 % of reading questions each at the world's own rates). Years (161
# values) are learnt only in the curriculum; the smaller pools of industries and headquarters
# are learnt in the mixed phase, and added to the curriculum they keep reading from emerging.
CURRICULUM_SHARES = (("employer", 0.3), ("founded", 0.2))
ANSWER_SHARES = (("employer", 0.25), ("founded", 0.2), ("industry", 0.1), ("headquarters", 0.05))

CONFIGS: dict[str, TrainConfig] = {
    "default": TrainConfig(
        "default",
        reader_steps=3600,
        memory_batch=128,
        reading_batch=24,
        nli_steps=2000,
        nli_batch=64,
        reading_steps=4,
        gold_alone_steps=800,
        context_loss=0.3,
        curriculum_shares=CURRICULUM_SHARES,
        answer_shares=ANSWER_SHARES,
    ),
    # CI: memorisation only; reading needs the default size's 800 gold-passage steps and more.
    "ci": TrainConfig(
        "ci",
        reader_steps=600,
        memory_batch=64,
        reading_batch=24,
        nli_steps=1500,
        nli_batch=64,
        reading_steps=2,
        context_loss=0.3,
        answer_shares=ANSWER_SHARES,
    ),
}


# --- tokenizer ---------------------------------------------------------------------------------
def _world_texts(worlds: Sequence[World]) -> Iterator[str]:
    for w in worlds:
        yield from (p.text for p in w.passages)
        yield from (p.title for p in w.passages)
        yield from (q.text for q in w.questions)
        yield from (" ".join(e.aliases) for e in w.entities)
        yield " ".join(
            (*w.pools.first_names, *w.pools.surnames, *w.pools.cities, *w.pools.companies)
        )
    yield from (a.question + " " + (a.two_hop_question or "") for a in ATTRIBUTES)
    for pool, values in (("occupation", OCCUPATIONS), ("industry", INDUSTRIES), ("year", YEARS)):
        yield " ".join(" ".join(value_aliases(pool, v)) for v in values)
    yield " ".join(f"{c} City {c} Group" for c in worlds[0].pools.cities)
    yield " ".join(world_prompts().values()) + prompts.format_reference([("t", "x")] * 9)


# The templates whose words the world's tokenizer knows and whose text its models are
# fingerprinted with: the reader is trained on the first two and scored under the others. A
# template added later (an LLM's verbalized judgment, say) is no reason to retrain the world.
WORLD_PROMPT_NAMES = (
    "closed_book",
    "with_context",
    "seper_closed_book",
    "consens_evaluator",
    "seper_with_context",
)


def world_prompts() -> dict[str, str]:
    return {name: prompts.PROMPTS[name] for name in WORLD_PROMPT_NAMES}


def build_tokenizer(worlds: Sequence[World]) -> Tokenizer:
    """A word-level tokenizer whose vocabulary is every word and punctuation mark of the worlds."""
    pre = pre_tokenizers.Whitespace()
    words = {w for text in _world_texts(worlds) for w, _ in pre.pre_tokenize_str(text)}
    vocab = {t: i for i, t in enumerate((*SPECIAL_TOKENS, *sorted(words)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre
    return tok


def _reader_tokenizer(base: Tokenizer) -> PreTrainedTokenizerFast:
    tok = Tokenizer.from_str(base.to_str())
    bos = tok.token_to_id("[BOS]")
    tok.post_processor = processors.TemplateProcessing(
        single="[BOS] $A", pair="[BOS] $A $B", special_tokens=[("[BOS]", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="[BOS]",
        eos_token="[EOS]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        padding_side="left",
        model_max_length=MAX_POSITIONS,
        model_input_names=["input_ids", "attention_mask"],
    )


# SePer's code feeds "{question}? {answer}" to the NLI model. Answers of this world are
# unambiguous values, so the NLI tokenizer drops such a question prefix and compares the answers
# alone (with the prefix, the tiny model must first learn to skip ~10 shared words).
QUESTION_PREFIX = r"^[^?]*\?\s+(?=\S)"


def _nli_tokenizer(base: Tokenizer) -> PreTrainedTokenizerFast:
    tok = Tokenizer.from_str(base.to_str())
    tok.normalizer = normalizers.Replace(Regex(QUESTION_PREFIX), "")
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        padding_side="right",
        model_max_length=512,
    )


# --- reader training data ----------------------------------------------------------------------
@dataclass(frozen=True)
class _Example:
    prompt: str  # conditioning text (no loss)
    target: str  # trained text (loss)


def _ctx(passages: Sequence[Passage]) -> list[tuple[str, str]]:
    return [(p.title, p.text) for p in passages]


def _asked(q: Question, passages: Sequence[Passage]) -> _Example:
    """``q`` over ``passages``, its canonical answer as the target."""
    return _Example(prompts.with_context(q.text, _ctx(passages)), q.answers[0])


class ReaderData:
    """Random training examples for the reader, drawn deterministically from ``rng``.

    Two streams: *memory* (short: known facts as text, closed-book questions on known entities)
    and *reading* (long: questions over contexts from the reading world, two-hop questions, and
    known entities' questions with a relevant or irrelevant context).
    """

    def __init__(
        self,
        world: World,
        reading_worlds: Callable[[int], World],
        rng: random.Random,
        answer_shares: Sequence[tuple[str, float]] = (),
        curriculum_shares: Sequence[tuple[str, float]] = (),
        context_sizes: Sequence[tuple[int, int, float]] = CONTEXT_SIZES,
    ) -> None:
        self.world, self.rng = world, rng
        self.context_sizes = tuple(context_sizes)
        self.answer_shares, self.curriculum_shares = tuple(answer_shares), tuple(curriculum_shares)
        self._reading_worlds = reading_worlds
        self._draw = -1
        self._next_reading_world()
        known = [e for e in world.entities if e.known]
        self.closed_book = [
            _Example(prompts.closed_book(a.question.format(name=e.name)), e.attributes[a.name])
            for e in known
            for a in ATTRIBUTES
            if a.kind == e.kind
        ]
        self.fact_texts = [_Example("", p.text) for e in known for p in world.passages_of(e.id)]
        self.known_pairs = [(e, a) for e in known for a in ATTRIBUTES if a.kind == e.kind]
        # Known people sharing a surname: their passages are in the training text anyway, so they
        # can serve as namesake distractors without leaking an unknown fact.
        surnames: dict[str, list[Entity]] = {}
        for e in known:
            if e.kind == "person":
                surnames.setdefault(e.name.split()[-1], []).append(e)
        self.known_namesakes = {
            e.id: [o for o in family if o.id != e.id]
            for family in surnames.values()
            for e in family
        }

    def _next_reading_world(self) -> None:
        self._draw += 1
        self.reading = self._reading_worlds(self._draw)
        self.single = [q for q in self.reading.questions if q.type == "single_hop"]
        self.two_hop = [q for q in self.reading.questions if q.type == "two_hop"]
        self.single_by_attribute = {
            a: [q for q in self.single if q.attribute == a]
            for a in {a for a, _ in (*self.answer_shares, *self.curriculum_shares)}
        }
        # About one example per question, then the next world: a fixed reading world gets
        # memorised (each question seen a dozen times) and its answers recalled, not read.
        self._examples_left = len(self.reading.questions)

    def questions(self, n: int) -> list[_Example]:
        """Closed-book questions about known entities."""
        return [self.rng.choice(self.closed_book) for _ in range(n)]

    def facts(self, n: int) -> list[_Example]:
        """Passages about known entities, trained as plain text."""
        return [self.rng.choice(self.fact_texts) for _ in range(n)]

    def gold_alone(self, n: int) -> list[_Example]:
        """Single-hop reading-world questions with their gold passage as the only context."""
        out = []
        for _ in range(n):
            self._count_reading_example()
            q = self._single_question(self.curriculum_shares)
            out.append(_asked(q, [self._gold(q)]))
        return out

    def with_context(self, n: int) -> list[_Example]:
        """Context questions (see :meth:`reading_example`) over contexts of one drawn size: ``n``
        of them, proportionally fewer when the contexts are longer than
        :data:`FULL_BATCH_PASSAGES` passages."""
        size = self.context_size()
        count = n if size <= FULL_BATCH_PASSAGES else max(1, n * FULL_BATCH_PASSAGES // size)
        return [self.reading_example(size) for _ in range(count)]

    def context_size(self) -> int:
        """A number of passages, drawn from ``context_sizes``."""
        u, bound = self.rng.random(), 0.0
        for fewest, most, share in self.context_sizes:
            bound += share
            if u < bound:
                break
        return self.rng.randint(fewest, most)

    def reading_example(self, size: int) -> _Example:
        """One context question over ``size`` passages (two-hop: at least both hops):
        reading-world single-hop, two-hop, or a known entity's."""
        self._count_reading_example()
        u = self.rng.random()
        if u < 0.65:
            return self._single(self._single_question(self.answer_shares), size)
        if u < 0.85:
            return self._two_hop(self.rng.choice(self.two_hop), size)
        return self._known_with_context(size)

    def _single_question(self, shares: Sequence[tuple[str, float]]) -> Question:
        """A single-hop reading-world question, the attributes listed in ``shares`` at their share.

        The reader copies only answer words it has been trained to copy. Company names (the
        employer's answer) are the subject of every company passage and never its answer; a
        company attribute (founding year, industry, headquarters) is asked in ~5 % of reading
        questions. At the world's own rates the reader never learns to copy company names, and
        whether it learns years or industries depends on the seed.
        """
        u, bound = self.rng.random(), 0.0
        for attribute, share in shares:
            bound += share
            if u < bound and self.single_by_attribute[attribute]:
                return self.rng.choice(self.single_by_attribute[attribute])
        return self.rng.choice(self.single)

    def _gold(self, q: Question) -> Passage:
        """The reading-world passage answering single-hop question ``q``."""
        return self.reading.passage_by_id[q.positives[0].passage_id]

    def _count_reading_example(self) -> None:
        if self._examples_left == 0:
            self._next_reading_world()
        self._examples_left -= 1

    def _passage(self, question: Question, *roles: str) -> Passage:
        """A judged passage of the first role the question has; a random one when none."""
        for role in roles:
            ids = [j.passage_id for j in question.judgements if j.role == role]
            if ids:
                return self.reading.passage_by_id[self.rng.choice(ids)]
        return self._random_passages(1, {question.entity_id})[0]

    def _random_passages(self, k: int, avoid: set[str]) -> list[Passage]:
        """``k`` distinct reading-world passages about none of the entities in ``avoid``."""
        out: list[Passage] = []
        while len(out) < k:
            p = self.rng.choice(self.reading.passages)
            if p.entity_id not in avoid and p not in out:
                out.append(p)
        return out

    def _filled(self, ctx: list[Passage], size: int, avoid: set[str]) -> list[Passage]:
        """``ctx`` with random passages added up to ``size``, shuffled (the gold passage may be
        anywhere, as in a retriever's top k)."""
        ctx = ctx + self._random_passages(size - len(ctx), avoid | {p.entity_id for p in ctx})
        self.rng.shuffle(ctx)
        return ctx

    def _single(self, q: Question, size: int) -> _Example:
        ctx = [self._gold(q)]
        # A retriever's nearest misses come first: the namesake's passage stating the same
        # attribute (the hardest case) and the entity's other passage.
        for role, share in (("hard_negative_surname", 0.6), ("hard_negative_attribute", 0.5)):
            if len(ctx) < size and self.rng.random() < share:
                ctx.append(self._passage(q, role))
        return _asked(q, self._filled(ctx, size, {q.entity_id}))

    def _two_hop(self, q: Question, size: int) -> _Example:
        ctx = [self.reading.passage_by_id[j.passage_id] for j in q.positives]
        if len(ctx) < size and self.rng.random() < 0.5:
            ctx.append(self._passage(q, "hard_negative_surname", "hard_negative_attribute"))
        return _asked(q, self._filled(ctx, size, {q.entity_id}))

    def _known_with_context(self, size: int) -> _Example:
        # Known facts stay known whatever the context: the answer comes from memory when the
        # context is about someone else (SePer's Property 2: such passages bring no utility).
        e, a = self.rng.choice(self.known_pairs)
        u = self.rng.random()
        namesakes = self.known_namesakes.get(e.id, [])
        if u < 0.4:
            ctx = [self.world.passage_stating(e.id, a.name)]
        elif u < 0.6:
            ctx = [p for p in self.world.passages_of(e.id) if a.name not in p.attributes]
        elif u < 0.8 and namesakes:
            ctx = [self.world.passage_stating(self.rng.choice(namesakes).id, a.name)]
        else:
            ctx = self._random_passages(1, set())
        ctx = self._filled(ctx, size, set())
        return _Example(
            prompts.with_context(a.question.format(name=e.name), _ctx(ctx)), e.attributes[a.name]
        )


def _encode_batch(
    tok: PreTrainedTokenizerFast, batch: Sequence[_Example]
) -> tuple[torch.Tensor, ...]:
    """Right-padded input ids, attention mask, target labels (-100 outside the target) and
    context labels (the prompt's tokens after [BOS], -100 elsewhere)."""
    eos, pad = tok.eos_token_id, tok.pad_token_id
    prompt_ids = tok([ex.prompt for ex in batch])["input_ids"]  # [BOS] + prompt
    target_ids = tok([ex.target for ex in batch], add_special_tokens=False)["input_ids"]
    rows = [(p + t + [eos], len(p)) for p, t in zip(prompt_ids, target_ids)]
    width = max(len(ids) for ids, _ in rows)

    def padded(values: list[int], fill: int) -> list[int]:
        return values + [fill] * (width - len(values))

    input_ids = torch.tensor([padded(ids, pad) for ids, _ in rows])
    labels = torch.tensor([padded([-100] * n + ids[n:], -100) for ids, n in rows])
    context = torch.tensor(
        [padded([-100] + ids[1:n] + [-100] * (len(ids) - n), -100) for ids, n in rows]
    )
    mask = torch.tensor([padded([1] * len(ids), 0) for ids, _ in rows])
    return input_ids, mask, labels, context


def _reader_loss(
    model: LlamaForCausalLM,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    labels: torch.Tensor,
    context: torch.Tensor,
    context_weight: float,
) -> torch.Tensor:
    """Next-token cross-entropy on the target, plus ``context_weight`` times that on the context
    (the LM head runs on labelled positions only)."""
    hidden = model.model(input_ids=input_ids, attention_mask=mask).last_hidden_state[:, :-1]

    def cross_entropy(which: torch.Tensor) -> torch.Tensor:
        shifted = which[:, 1:]
        keep = shifted != -100
        return torch.nn.functional.cross_entropy(model.lm_head(hidden[keep]), shifted[keep])

    loss = cross_entropy(labels)
    return loss + context_weight * cross_entropy(context) if context_weight else loss


def train_reader(
    world: World,
    tokenizer: Tokenizer,
    out_dir: Path,
    config: TrainConfig,
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """Train the reader LM and save it as an HF directory at ``out_dir``; return the path.

    Reading comprehension is learnt on a stream of fresh :func:`make_reading_world` draws.
    """
    with deterministic(seed, config.threads):
        return _fit_reader(world, tokenizer, out_dir, config, seed, progress)


def _fit_reader(
    world: World,
    tokenizer: Tokenizer,
    out_dir: Path,
    config: TrainConfig,
    seed: int,
    progress: bool,
) -> Path:
    tok = _reader_tokenizer(tokenizer)
    model_config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=config.hidden,
        intermediate_size=2 * config.hidden,
        num_hidden_layers=config.layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        # Tied input and output embeddings make copying a context word into the answer cheap to
        # learn (the identity map); untied, every answer word's copy must be learnt separately.
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(model_config)
    model.train()
    data = ReaderData(
        world,
        lambda draw: make_reading_world(world, config.world_size, draw),
        random.Random(f"reader:{seed}"),
        config.answer_shares,
        config.curriculum_shares,
        config.context_sizes,
    )
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_schedule(s, config.reader_steps))
    # A cycle of reading steps around one step of closed-book questions and one of fact text
    # (memorising the known facts converges long before reading does). Batches of one kind have
    # similar lengths, so little compute goes to padding.
    half = (("read", data.with_context, config.reading_batch),) * (config.reading_steps // 2)
    streams = (
        *half,
        ("ask", data.questions, config.memory_batch),
        *half,
        ("facts", data.facts, config.reading_batch),
    )
    losses: dict[str, float] = {}
    bar = tqdm(range(config.reader_steps), desc="reader", disable=not progress, mininterval=2)
    for step in bar:
        if step < config.gold_alone_steps:
            name, draw, n = "gold", data.gold_alone, config.reading_batch
        else:
            name, draw, n = streams[step % len(streams)]
        context_weight = config.context_loss if name in ("gold", "read") else 0.0
        loss = _reader_loss(model, *_encode_batch(tok, draw(n)), context_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses[name] = 0.9 * losses.get(name, loss.item()) + 0.1 * loss.item()
        if step % 20 == 0:
            bar.set_postfix({k: f"{v:.2f}" for k, v in losses.items()})
    model.eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


# --- NLI ---------------------------------------------------------------------------------------
def _answer_groups(world: World) -> dict[str, list[tuple[str, ...]]]:
    """Per value pool, the alias tuple of every value the world can give as an answer."""
    pools = world.pools
    return {
        "city": [value_aliases("city", c) for c in pools.cities],
        "company": [value_aliases("company", c) for c in pools.companies],
        "occupation": [value_aliases("occupation", v) for v in OCCUPATIONS],
        "industry": [value_aliases("industry", v) for v in INDUSTRIES],
        "year": [value_aliases("year", v) for v in YEARS],
    }


def nli_pairs(
    world: World, rng: random.Random, n: int, with_question: float = 0.5
) -> list[tuple[str, str, int]]:
    """``n`` labelled (premise, hypothesis, label) answer pairs, label indexing :data:`NLI_LABELS`.

    A share ``with_question`` of the pairs carries the question prefix the SePer code puts
    before both texts.
    """
    groups = _answer_groups(world)
    names = sorted(groups)
    questions: dict[str, list[str]] = {p: [] for p in names}
    for q in world.questions:
        attr = ATTRIBUTE_BY_NAME[q.attribute.split(".")[-1]]
        questions[attr.pool].append(q.text)
    out: list[tuple[str, str, int]] = []
    for _ in range(n):
        pool = rng.choice(names)
        value = rng.choice(groups[pool])
        label = rng.randrange(3)
        a = rng.choice(value)
        if label == 2:
            b = rng.choice(value)
        elif label == 0:
            other = rng.choice(
                [v for v in groups[pool] if v is not value]
                if len(groups[pool]) > 1
                else groups[pool]
            )
            b = rng.choice(other)
        else:
            b = rng.choice(rng.choice(groups[rng.choice([p for p in names if p != pool])]))
        if rng.random() < 0.5:
            a, b = b, a
        if rng.random() < with_question and questions[pool]:
            q = rng.choice(questions[pool])
            a, b = f"{q} {a}", f"{q} {b}"
        out.append((a, b, label))
    return out


def train_nli(
    world: World,
    tokenizer: Tokenizer,
    out_dir: Path,
    config: TrainConfig,
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """Train the NLI classifier and save it as an HF directory at ``out_dir``; return the path."""
    with deterministic(seed, config.threads):
        return _fit_nli(world, tokenizer, out_dir, config, seed, progress)


def _fit_nli(
    world: World,
    tokenizer: Tokenizer,
    out_dir: Path,
    config: TrainConfig,
    seed: int,
    progress: bool,
) -> Path:
    tok = _nli_tokenizer(tokenizer)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=tokenizer.get_vocab_size(),
            hidden_size=64,
            num_hidden_layers=2,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            num_attention_heads=4,
            intermediate_size=256,
            max_position_embeddings=512,
            pad_token_id=tok.pad_token_id,
            num_labels=3,
            id2label=dict(enumerate(NLI_LABELS)),
            label2id={label: i for i, label in enumerate(NLI_LABELS)},
        )
    )
    # The first layer's queries and keys start as scaled identities: attention then starts out
    # matching equal words, which is what telling aliases from other values needs.
    attention = model.bert.encoder.layer[0].attention.self
    with torch.no_grad():
        for proj in (attention.query, attention.key):
            proj.weight.copy_(3.0 * torch.eye(proj.weight.shape[0]))
    model.train()
    rng = random.Random(f"nli:{seed}")
    # Post-LayerNorm BERT does not learn at all at 1e-3 here; at 5e-4 it converged or not
    # depending on the vocabulary (0.995 or 0.68 on the CI world when the prompt templates gained
    # a few words); 3e-4 learns on both (0.997 / 0.998).
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_schedule(s, config.nli_steps, 30))
    bar = tqdm(range(config.nli_steps), desc="nli", disable=not progress, mininterval=2)
    for step in bar:
        pairs = nli_pairs(world, rng, config.nli_batch)
        enc = tok(
            [a for a, _, _ in pairs], [b for _, b, _ in pairs], padding=True, return_tensors="pt"
        )
        loss = model(**enc, labels=torch.tensor([lab for _, _, lab in pairs])).loss
        optimiser_step(loss, opt, sched)
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    return save_for_inference(model, tok, out_dir)


# --- quality -----------------------------------------------------------------------------------
@torch.inference_mode()
def greedy_answers(
    model_dir: Path, prompt_texts: Sequence[str], batch_size: int = 64, max_new_tokens: int = 6
) -> list[str]:
    """Greedy answers of the reader at ``model_dir`` (a small helper for the quality table)."""
    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    out: list[str] = []
    for i in range(0, len(prompt_texts), batch_size):
        enc = tok(list(prompt_texts[i : i + batch_size]), return_tensors="pt", padding=True)
        gen = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens)
        out.extend(tok.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True))
    return out


@torch.inference_mode()
def nli_accuracy(model_dir: Path, world: World, n: int = 600, seed: int = 12345) -> float:
    """Accuracy of the NLI model at ``model_dir`` on fresh answer pairs of ``world``."""
    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    pairs = nli_pairs(world, random.Random(f"nli-eval:{seed}"), n)
    enc = tok([a for a, _, _ in pairs], [b for _, b, _ in pairs], padding=True, return_tensors="pt")
    pred = model(**enc).logits.argmax(-1)
    return float((pred == torch.tensor([lab for _, _, lab in pairs])).float().mean())


def _rate(answers: Sequence[str], golds: Sequence[Sequence[str]]) -> float:
    return sum(has_answer(a, g) for a, g in zip(answers, golds)) / max(1, len(answers))


def _gold_among(world: World, q: Question, k: int, position: int) -> list[Passage] | None:
    """The gold passage of single-hop ``q`` at ``position`` (mod ``k``) among its question's
    judged negatives, then passages about other entities (seeded by the question), ``k`` in all;
    None when the question has more than ``k`` judged passages."""
    judged = [world.passage_by_id[j.passage_id] for j in q.judgements]
    if len(judged) > k:
        return None
    gold = world.passage_by_id[q.positives[0].passage_id]
    taken = {p.entity_id for p in judged}
    others = [p for p in world.passages if p.entity_id not in taken]
    ctx = [p for p in judged if p is not gold]
    ctx += random.Random(f"gold-among:{q.id}").sample(others, k - len(judged))
    ctx.insert(position % k, gold)
    return ctx


def reader_quality(model_dir: Path, world: World) -> dict[str, dict[str, float]]:
    """has_answer of greedy answers on the world's questions, per condition.

    Returns ``{condition: {"has_answer": rate, "n": count}}`` for closed book (known / unknown
    single-hop), gold passage only, hard negative only (same surname / same entity), gold beside
    its same-surname distractor, gold among every judged passage of its question (five: the
    hard negatives and two random ones) and among ten (five more passages about other
    entities), at every position in turn, and two-hop with both hops, only hop 1, only hop 2.
    """
    p = world.passage_by_id
    single = [q for q in world.questions if q.type == "single_hop"]
    unknown = [q for q in single if not q.known]
    two_hop = [q for q in world.questions if q.type == "two_hop"]

    def ctx(q: Question, roles: Sequence[str]) -> list[Passage] | None:
        found = [p[j.passage_id] for r in roles for j in q.judgements if j.role == r][: len(roles)]
        return found if len(found) == len(roles) else None

    def hop(q: Question, h: int) -> list[Passage]:
        return [p[j.passage_id] for j in q.positives if j.hop == h]

    conditions: dict[str, list[tuple[str, Sequence[str]]]] = {
        "closed_book.known": [(prompts.closed_book(q.text), q.answers) for q in single if q.known],
        "closed_book.unknown": [(prompts.closed_book(q.text), q.answers) for q in unknown],
    }
    for name, roles in (
        ("gold_only.unknown", ("positive",)),
        ("hard_negative_surname_only.unknown", ("hard_negative_surname",)),
        ("hard_negative_attribute_only.unknown", ("hard_negative_attribute",)),
        ("gold_with_surname_distractor.unknown", ("positive", "hard_negative_surname")),
    ):
        conditions[name] = [
            (prompts.with_context(q.text, _ctx(c)), q.answers)
            for q in unknown
            if (c := ctx(q, roles)) is not None
        ]
    for k in (5, 10):
        conditions[f"gold_among_{k}.unknown"] = [
            (prompts.with_context(q.text, _ctx(c)), q.answers)
            for i, q in enumerate(unknown)
            if (c := _gold_among(world, q, k, i)) is not None
        ]
    conditions["two_hop.both"] = [
        (prompts.with_context(q.text, _ctx(hop(q, 1) + hop(q, 2))), q.answers) for q in two_hop
    ]
    for h in (1, 2):
        conditions[f"two_hop.hop{h}_only"] = [
            (prompts.with_context(q.text, _ctx(hop(q, h))), q.answers) for q in two_hop
        ]
    flat = [(name, pr, g) for name, items in conditions.items() for pr, g in items]
    answers = greedy_answers(model_dir, [pr for _, pr, _ in flat])
    table: dict[str, dict[str, float]] = {}
    for name in conditions:
        rows = [(a, g) for (n, _, g), a in zip(flat, answers) if n == name]
        table[name] = {
            "has_answer": _rate([a for a, _ in rows], [g for _, g in rows]),
            "n": len(rows),
        }
    hard = [k for k in table if k.startswith("hard_negative")]
    total = sum(table[k]["n"] for k in hard)
    table["hard_negative_only.unknown"] = {
        "has_answer": sum(table[k]["has_answer"] * table[k]["n"] for k in hard) / max(1, total),
        "n": total,
    }
    return table


def format_quality(table: dict[str, dict[str, float]]) -> str:
    """The quality table as aligned text lines."""
    width = max(len(k) for k in table)
    lines = [f"{'condition':<{width}}  has_answer      n", "-" * (width + 18)]
    lines += [
        f"{k:<{width}}  {v['has_answer']:>10.3f}  {int(v['n']):>5d}" for k, v in table.items()
    ]
    return "\n".join(lines)


# --- everything ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainedWorld:
    """Paths and measurements of a built world with its trained reader and NLI models."""

    root: Path
    world_dir: Path
    reader_dir: Path
    world_nli_dir: Path
    answer_nli_dir: Path | None  # None when the build skipped it
    quality: dict[str, dict[str, float]]
    nli_accuracy: float
    seconds: dict[str, float]  # wall time per phase
    cpu_seconds: dict[str, float]  # this process's CPU time per phase (robust to a shared CPU)
    config: TrainConfig
    seed: int


class _Clock:
    """Wall and process CPU seconds per named phase."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        self.wall[name] = time.perf_counter() - wall
        self.cpu[name] = time.process_time() - cpu

    def total(self, name: str, parts: Sequence[str]) -> None:
        self.wall[name] = sum(self.wall[p] for p in parts)
        self.cpu[name] = sum(self.cpu[p] for p in parts)


def _world_and_tokenizer(config: TrainConfig, seed: int) -> tuple[World, Tokenizer]:
    """The evaluation world of ``seed`` and the tokenizer over it and its reading world."""
    world = make_world(seed, config.world_size)
    return world, build_tokenizer([world, make_reading_world(world, config.world_size)])


FINGERPRINT_KEY = "fingerprint"


def fingerprint(size: str, seed: int) -> str:
    """A hash of what the world's models of ``size`` and ``seed`` are trained on: the world, the
    first reading world, the tokenizer (vocabulary and rules), the prompt templates and the
    training configuration. Stored in ``build.json``: models trained under another fingerprint
    belong to another world (see :mod:`~ragutil_dagster.embedded.shipped`)."""
    config = CONFIGS[size]
    world, tokenizer = _world_and_tokenizer(config, seed)
    reading = make_reading_world(world, config.world_size)

    def content(w: World) -> list[dict]:
        return [asdict(x) for x in (*w.entities, *w.passages, *w.questions)]

    return stable_hash(
        {
            "world": content(world),
            "reading_world": content(reading),
            "tokenizer": tokenizer.to_str(),
            "prompts": world_prompts(),
            "config": asdict(config),
            "seed": seed,
        }
    )


def train_world_nli(
    out_dir: str | Path, size: str = "ci", seed: int = 0, progress: bool = True
) -> Path:
    """The world's NLI alone (as :func:`train_all` trains it), at ``out_dir``; return the path."""
    config = CONFIGS[size]
    world, tokenizer = _world_and_tokenizer(config, seed)
    return train_nli(world, tokenizer, Path(out_dir), config, seed, progress)


def train_all(
    out_dir: str | Path,
    size: str = "ci",
    seed: int = 0,
    progress: bool = True,
    answer_nli_size: str | None = "default",
) -> TrainedWorld:
    """Build the world for ``seed`` and train its models into ``out_dir``.

    Layout (:mod:`~ragutil_dagster.embedded.layout`): ``world/`` (BEIR + ground truth),
    ``reader/``, ``world-nli/`` and, unless ``answer_nli_size`` is None, the answer NLI ``nli/``
    (HF directories), and ``build.json`` (config, timings, quality table). ``size`` is
    ``"default"`` or ``"ci"``.
    """
    if size not in CONFIGS:
        raise ValueError(f"unknown size {size!r}; choose one of {sorted(CONFIGS)}")
    config = CONFIGS[size]
    root = Path(out_dir)
    clock = _Clock()
    with clock("world"):
        world, tokenizer = _world_and_tokenizer(config, seed)
        world_dir = write_world(world, root / layout.WORLD)
    with clock("reader"):
        reader_dir = train_reader(world, tokenizer, root / layout.READER, config, seed, progress)
    with clock("nli"):
        nli_dir = train_nli(world, tokenizer, root / layout.WORLD_NLI, config, seed, progress)
    answer_nli_dir = None
    if answer_nli_size is not None:
        with clock("answer_nli"):
            answer_nli_dir = train_answer_nli(
                root / layout.ANSWER_NLI, answer_nli_size, seed, progress
            )
    clock.total(
        "build_total", [p for p in ("world", "reader", "nli", "answer_nli") if p in clock.wall]
    )
    with clock("quality"):
        quality = reader_quality(reader_dir, world)
        nli_acc = nli_accuracy(nli_dir, world)
    seconds, cpu_seconds = clock.wall, clock.cpu
    trained = TrainedWorld(
        root,
        world_dir,
        reader_dir,
        nli_dir,
        answer_nli_dir,
        quality,
        nli_acc,
        seconds,
        cpu_seconds,
        config,
        seed,
    )
    report = {
        "seed": seed,
        "size": size,
        FINGERPRINT_KEY: fingerprint(size, seed),
        "config": asdict(config),
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "reader_steps": config.reader_steps,
        "nli_steps": config.nli_steps,
        "quality": quality,
        "nli_accuracy": nli_acc,
    }
    write_text_atomic(root / layout.BUILD_RECORD, json.dumps(report, indent=2))
    return trained
