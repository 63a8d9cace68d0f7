"""LM-Polygraph 0.7.0's semantic entropy over a job of prompts — the peer side of
``bench/peer_lm_polygraph.py``, run by it as a subprocess with the python of LM-Polygraph's own
venv. Nothing of ragutil is imported here (ragutil is not installed in that venv).

    <venv>/bin/python bench/peer_lm_polygraph_child.py JOB.json OUT.json

The job (written by the bench) names the model directory, the NLI directory, the engine
(``hf``: ``WhiteboxModel`` over transformers, ``instruct=True``; ``vllm``: ``WhiteboxModelvLLM``
over a ``vllm.LLM``, ``instruct=True``, which adds its own system message), N, temperature, top-k / top-p, max new tokens, the stop string, the batch sizes
and the prompts: one item per (question, condition) with the prompt text and the question's NLI
prefix ("{question}?").

What runs, per batch of prompts, is LM-Polygraph's own code in ``UEManager``'s order for the
estimators asked for — ``SamplingGenerationCalculator`` (N ``generate`` calls), then
``SemanticMatrixCalculator`` (the NLI over every ordered pair of distinct samples),
``SemanticClassesCalculator`` (its bidirectional-entailment classes) and the estimators
``SemanticEntropy()`` (its default: class log-likelihoods summed, "mean" estimation) and
``SemanticEntropy(class_probability_estimation="frequency")`` (``SemanticEntropyEmpirical``) —
without the greedy decode ``UEManager`` always adds (no semantic-entropy estimator reads it;
leaving it out only makes this side faster). Two things the caller decides, as any user of the
calculators does:

* the NLI model: ragutil's (a BERT cross-encoder directory), loaded by ``DirectoryNLI`` below —
  LM-Polygraph's own ``MultilingualDeberta`` (the class ``load_nli_model`` picks for any path
  not under ``microsoft/``) with one line of its ``setup`` changed: it upper-cases
  ``model.deberta.config.label2id``, an attribute only DeBERTa models have; here it is
  ``model.config.label2id`` (the same dict for a DeBERTa);
* what the NLI reads: LM-Polygraph passes ``sample_texts`` as they are. The job's default
  (``nli_input: "question"``) passes ``"{question}? {text cut at the stop string}"`` instead,
  the text ragutil's NLI reads (SePer's form, ``metrics/seper.nli_text``); with
  ``also_bare: true`` the matrix, classes and estimators are computed a second time on the bare
  sample texts (LM-Polygraph as shipped), timed on their own.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import torch


def log(message: str) -> None:
    print(f"[lm-polygraph child] {message}", file=sys.stderr, flush=True)


def directory_nli(path: str, batch_size: int, device: str):
    """ragutil's NLI directory as LM-Polygraph's NLI model object (``.deberta``,
    ``.deberta_tokenizer``, ``.batch_size``, ``.device``), float32."""
    from lm_polygraph.utils.deberta import MultilingualDeberta
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    class DirectoryNLI(MultilingualDeberta):
        def setup(self) -> None:
            if self._deberta is not None:
                return
            self._deberta_tokenizer = AutoTokenizer.from_pretrained(self.deberta_path)
            self._deberta = AutoModelForSequenceClassification.from_pretrained(
                self.deberta_path, dtype=torch.float32
            )
            self._deberta.to(self.device)
            self._deberta.eval()
            # MultilingualDeberta: self._deberta.deberta.config.label2id = {k.upper(): v ...}
            self._deberta.config.label2id = {
                k.upper(): v for k, v in self._deberta.config.label2id.items()
            }

    return DirectoryNLI(path, batch_size=batch_size, device=device)


def hf_model(job: dict):
    from lm_polygraph.utils.generation_parameters import GenerationParameters
    from lm_polygraph.utils.model import WhiteboxModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(job["model_dir"], padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        job["model_dir"], dtype=getattr(torch, job["dtype"])
    )
    model.eval()
    params = GenerationParameters(
        temperature=job["temperature"],
        top_k=job["top_k"],
        top_p=job["top_p"],
        do_sample=True,
        stop_strings=list(job["stop"]) or None,
        allow_newlines=True,
        max_new_tokens=job["max_new_tokens"],
    )
    # instruct=True: LM-Polygraph wraps each prompt as one user message of the chat template
    # (add_generation_prompt=True, no special tokens added again), as ragutil's hf backend does.
    return WhiteboxModel(model, tokenizer, job["model_dir"], "CausalLM", params, instruct=True)


def vllm_model(job: dict):
    import inspect

    from lm_polygraph.model_adapters import WhiteboxModelvLLM
    from lm_polygraph.utils.generation_parameters import GenerationParameters
    from vllm import LLM, SamplingParams

    # instruct=True: WhiteboxModelvLLM sends each prompt through LLM.chat as a user message after
    # its own fixed system message (instruct=False would decode the prompt's ids with
    # skip_special_tokens=True, dropping a pre-applied chat template's special tokens). The bench
    # gives ragutil's vLLM generator that system message, so both render the same prompt.
    if job["system_prompt"] not in inspect.getsource(WhiteboxModelvLLM.generate):
        raise SystemExit("WhiteboxModelvLLM's system message is not the one the bench gave ragutil")
    llm = LLM(
        model=job["model_dir"],
        dtype=job["dtype"],
        max_model_len=job.get("max_model_len", 2048),
        seed=job["seed"],
        logprobs_mode="raw_logprobs",
        # The KV cache ragutil's generator is given (its kv_cache_space_gib → kv_cache_memory_bytes);
        # the thread binding comes from the environment, the same on both sides. Everything else
        # is vLLM's default.
        kv_cache_memory_bytes=int(job["kv_cache_space_gib"] * 2**30),
    )
    # logprobs=0: the sampled token's log-prob only (WhiteboxModelvLLM reads output.logprobs).
    sampling = SamplingParams(max_tokens=job["max_new_tokens"], logprobs=0)
    params = GenerationParameters(
        temperature=job["temperature"],
        top_k=job["top_k"] if job["top_k"] > 0 else -1,
        top_p=job["top_p"],
        do_sample=True,
        stop_strings=list(job["stop"]),
        allow_newlines=True,
        max_new_tokens=job["max_new_tokens"],
    )
    return WhiteboxModelvLLM(llm, sampling, params, device="cpu", instruct=True)


def vllm_prompt_ids(model, prompt: str, system_prompt: str) -> list[int]:
    """The ids LLM.chat prefills for ``prompt`` as WhiteboxModelvLLM sends it."""
    chat = [{"role": "system", "content": system_prompt}, {"role": "user", "content": prompt}]
    text = model.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    return list(model.tokenizer(text, add_special_tokens=False)["input_ids"])


def cut(text: str, stop: list[str]) -> str:
    """``text`` before its first stop string (ragutil's ``truncate_at_stop``)."""
    positions = [i for i in (text.find(s) for s in stop) if i >= 0]
    return text[: min(positions)] if positions else text


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    out_path = Path(sys.argv[2])
    torch.set_num_threads(job.get("threads") or torch.get_num_threads())
    started = time.perf_counter()
    import lm_polygraph
    from lm_polygraph.estimators import SemanticEntropy
    from lm_polygraph.stat_calculators import (
        SamplingGenerationCalculator,
        SemanticClassesCalculator,
        SemanticMatrixCalculator,
    )

    import_s = time.perf_counter() - started
    begun = time.perf_counter()
    model = hf_model(job) if job["engine"] == "hf" else vllm_model(job)
    nli = directory_nli(job["nli_dir"], job["nli_batch_size"], "cpu")
    load_s = time.perf_counter() - begun

    sampler = SamplingGenerationCalculator(samples_n=job["n"])
    matrix = SemanticMatrixCalculator(nli)
    classes = SemanticClassesCalculator()
    estimators = {
        "lm_polygraph_default": SemanticEntropy(),
        "empirical": SemanticEntropy(class_probability_estimation="frequency"),
    }
    stop = list(job["stop"])
    items = job["items"]
    tokenizer = model.tokenizer

    # Warm-up outside the timing (both paths warm their models up): one sampling call and one
    # NLI batch. On CPU a process's first forward pass can compute other values than the later
    # ones (ragutil's models/device.warm_up_on_cpu).
    begun = time.perf_counter()
    torch.manual_seed(job["seed"] + 10_000)
    warm = sampler({}, [items[0]["prompt"]], model, job["max_new_tokens"])
    matrix(
        {"sample_texts": warm["sample_texts"]}, [items[0]["prompt"]], model, job["max_new_tokens"]
    )
    warm_s = time.perf_counter() - begun

    torch.manual_seed(job["seed"])
    timing = {
        "sampling_s": 0.0,
        "nli_s": 0.0,
        "estimate_s": 0.0,
        "nli_bare_s": 0.0,
        "estimate_bare_s": 0.0,
    }
    results = []
    pairs = {"question": 0, "bare": 0}
    batch_size = job["batch_size"]
    begun_all = time.perf_counter()
    for start in range(0, len(items), batch_size):
        batch = items[start : start + batch_size]
        prompts = [item["prompt"] for item in batch]
        t0 = time.perf_counter()
        stats = sampler({}, prompts, model, job["max_new_tokens"])
        t1 = time.perf_counter()
        timing["sampling_s"] += t1 - t0

        def semantic(view: list[list[str]]) -> tuple[dict, dict]:
            deps = {**stats, "sample_texts": view}
            deps.update(matrix(deps, prompts, model, job["max_new_tokens"]))
            return deps

        def estimate(deps: dict) -> tuple[dict, dict]:
            deps.update(classes(deps, prompts, model, job["max_new_tokens"]))
            # The estimators read sample_texts only for their number; the log-probs and classes
            # are the sampled ones.
            values = {name: est(deps).tolist() for name, est in estimators.items()}
            return values, deps["semantic_classes_entail"]

        if job.get("nli_input", "question") == "question":
            view = [
                [f"{item['nli_prefix']} {cut(text, stop)}" for text in texts]
                for item, texts in zip(
                    batch,
                    [
                        [tokenizer.decode(toks, skip_special_tokens=True) for toks in per]
                        for per in stats["sample_tokens"]
                    ],
                )
            ]
        else:
            view = stats["sample_texts"]
        t0 = time.perf_counter()
        deps = semantic(view)
        t1 = time.perf_counter()
        values, sem = estimate(deps)
        t2 = time.perf_counter()
        timing["nli_s"] += t1 - t0
        timing["estimate_s"] += t2 - t1
        pairs["question"] += sum(len(set(v)) ** 2 for v in view)
        bare_values, bare_sem = None, None
        if job.get("also_bare") and job.get("nli_input", "question") == "question":
            t0 = time.perf_counter()
            bare_deps = semantic(stats["sample_texts"])
            t1 = time.perf_counter()
            bare_values, bare_sem = estimate(bare_deps)
            timing["nli_bare_s"] += t1 - t0
            timing["estimate_bare_s"] += time.perf_counter() - t1
            pairs["bare"] += sum(len(set(v)) ** 2 for v in stats["sample_texts"])
        for row, item in enumerate(batch):
            record = {
                "id": item["id"],
                "condition": item["condition"],
                "texts": stats["sample_texts"][row],
                "nli_texts": view[row],
                "tokens": [list(map(int, t)) for t in stats["sample_tokens"][row]],
                "log_likelihoods": [
                    list(map(float, ll)) for ll in stats["sample_log_likelihoods"][row]
                ],
                "log_probs": [float(lp) for lp in stats["sample_log_probs"][row]],
                "sample_to_class": [
                    int(sem["sample_to_class"][row][j]) for j in range(len(view[row]))
                ],
                "semantic_entropy": {name: float(v[row]) for name, v in values.items()},
            }
            if bare_values is not None:
                record["bare_sample_to_class"] = [
                    int(bare_sem["sample_to_class"][row][j]) for j in range(len(view[row]))
                ]
                record["bare_semantic_entropy"] = {
                    name: float(v[row]) for name, v in bare_values.items()
                }
            results.append(record)
        log(
            f"{min(start + batch_size, len(items))}/{len(items)} prompts, "
            f"{time.perf_counter() - begun_all:.1f} s"
        )
    loop_s = time.perf_counter() - begun_all
    # The token ids each prompt is prefilled as, for the bench to compare with ragutil's.
    if job["engine"] == "hf":
        prompt_ids = [model.tokenize([item["prompt"]])["input_ids"][0].tolist() for item in items]
    else:
        prompt_ids = [
            vllm_prompt_ids(model, item["prompt"], job["system_prompt"]) for item in items
        ]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out_path.write_text(
        json.dumps(
            {
                "lm_polygraph": lm_polygraph.__version__
                if hasattr(lm_polygraph, "__version__")
                else "0.7.0",
                "torch": torch.__version__,
                "transformers": __import__("transformers").__version__,
                "engine": job["engine"],
                "threads": torch.get_num_threads(),
                "import_s": import_s,
                "load_s": load_s,
                "warm_s": warm_s,
                "loop_s": loop_s,
                **timing,
                "nli_pairs": pairs["question"],
                "nli_pairs_bare": pairs["bare"],
                "prompt_ids": prompt_ids,
                "peak_rss_mb_self": usage.ru_maxrss / 1024,
                "pid": os.getpid(),
                "items": results,
            }
        )
    )


if __name__ == "__main__":
    main()
