"""The data sections: datasets (with their chunking), first-stage retrievers and the reranker."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ragutil_dagster.config.base import ModelName, Slug, _Strict
from ragutil_dagster.infra.files import user_path


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
