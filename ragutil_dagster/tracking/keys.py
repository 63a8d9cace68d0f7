"""What one ``metric_scores`` partition was computed from, and the deterministic run key over it.

The key hashes every input that changes the numbers — dataset, setting, generator, the identity
of every model involved (generator, NLI, embedder, reranker), the config fingerprint and the
ragutil version — so a retry of the same inputs finds its MLflow run again and any change
starts a new run beside the old one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ragutil_dagster import __version__
from ragutil_dagster.config import ExperimentConfig, PromptConfig, Setting
from ragutil_dagster.infra.files import stable_hash
from ragutil_dagster.infra.versions import library_versions

RUN_KEY_TAG = "ragutil.run_key"
KIND_TAG = "ragutil.kind"
DAGSTER_RUN_TAG = "dagster.run_id"
DAGSTER_ASSET_TAG = "dagster.asset_key"
DAGSTER_PARTITION_TAG = "dagster.partition"
OFF_WORLD_TAG = "ragutil.off_world_warning"
PARTITION_CONFIG_PARAM = "partition_config_fingerprint"


GENERATION_ROLES = ("closed_book", "with_context")


def prompt_template_hash(prompts: PromptConfig) -> str:
    """Hash of the texts (not only the names) of a generator's templates: closed book, with
    context, and every other role set away from its built-in default. A built-in is keyed by its
    name, a user's template by role and source (two inline templates share the source)."""
    roles = [
        *GENERATION_ROLES,
        *(role for role in prompts.labels() if role not in GENERATION_ROLES),
    ]
    templates = {role: prompts.template(role) for role in roles}
    return stable_hash(
        {t.source if t.builtin else f"{role}:{t.source}": t.text for role, t in templates.items()},
        16,
    )


def prompt_params(prompts: PromptConfig) -> dict[str, str]:
    """What MLflow shows of a generator's templates: the closed-book and with-context templates'
    labels (a built-in's name, ``inline``, ``file:…``, ``prompts:/…``), every other role set away
    from its default, and the hash of their texts."""
    others = {
        role: label for role, label in prompts.labels().items() if role not in GENERATION_ROLES
    }
    return {
        "prompt_closed_book": prompts.closed_book.label,
        "prompt_with_context": prompts.with_context.label,
        "prompt_other_roles": ", ".join(f"{role}={label}" for role, label in others.items())
        or "none",
        "prompt_template_hash": prompt_template_hash(prompts),
    }


@dataclass(frozen=True)
class ModelIdentities:
    """The resolved identity (hub commit or directory fingerprint) of each model in a partition."""

    generator: str
    nli: str
    embedder: str | None = None
    reranker: str | None = None
    # The dtype the generator ran in, as its generations step recorded it; None where the backend
    # reports none (a server's dtype is part of its fingerprint in the generator's settings).
    generator_dtype: str | None = None
    # The dtype the NLI model ran in, as the NLI step recorded it (``nli.dtype: auto`` depends on
    # the CPU); None for a judge without one (the lexical judge) or a step that predates the entry.
    nli_dtype: str | None = None
    # A run retriever's run file, as its retrieval step read it (``sha256:<hex>``): a replaced file
    # is a new run, as a new embedder is.
    run_file: str | None = None
    # A multi-step round's query writer, as its retrieval step loaded it: another writer's queries
    # gather another context, so a new writer is a new run (None outside multi-step rounds).
    query_writer: str | None = None


@dataclass(frozen=True)
class PartitionRun:
    """One ``metric_scores`` partition (setting × generator) as an MLflow run."""

    experiment: ExperimentConfig = field(repr=False)
    setting: Setting
    generator: str
    identities: ModelIdentities
    version: str = __version__

    @property
    def mlflow_experiment(self) -> str:
        """One MLflow experiment per dataset."""
        return mlflow_experiment_name(self.setting.dataset)

    @property
    def run_name(self) -> str:
        return partition_run_name(self.setting.key, self.generator)

    @property
    def key(self) -> str:
        return stable_hash(
            {
                "dataset": self.setting.dataset,
                "setting": self.setting.key,
                "generator": self.generator,
                "identities": asdict(self.identities),
                "config": self.experiment.fingerprint(),
                "version": self.version,
            },
            length=32,
        )

    @property
    def partition_config_fingerprint(self) -> str:
        return partition_config_fingerprint(self.experiment, self.setting.key, self.generator)

    def params(self) -> dict[str, str]:
        """The run's parameters, as MLflow stores them (strings)."""
        experiment = self.experiment
        retriever = experiment.retriever(self.setting.retriever)
        generator = experiment.generator(self.generator)
        reranker = experiment.reranker if self.setting.reranker else None
        compressor = experiment.compressor(self.setting)
        sampling = experiment.sampling
        values: dict[str, object] = {
            "experiment": experiment.name,
            "dataset": self.setting.dataset,
            "setting": self.setting.key,
            "retriever": retriever.name,
            "retriever_kind": retriever.kind,
            "k": self.setting.k,
            "reranker": reranker.name if reranker else "none",
            "reranker_model": reranker.model if reranker else "none",
            "reranker_identity": self.identities.reranker or "none",
            "generator": generator.name,
            "generator_model": generator.model,
            "generator_revision": generator.revision or "none",
            "generator_identity": self.identities.generator,
            "generator_backend": generator.backend,
            "generator_dtype": self.identities.generator_dtype or "none",
            **{f"{library}_version": version for library, version in library_versions().items()},
            "nli_model": experiment.nli.model,
            "nli_revision": experiment.nli.revision or "none",
            "nli_identity": self.identities.nli,
            "nli_dtype": self.identities.nli_dtype or experiment.nli.dtype,
            "nli_answer_check": experiment.nli.answer_check or "none",
            "embedder": retriever.model or "none",
            "embedder_revision": retriever.revision or "none",
            "embedder_identity": self.identities.embedder or "none",
            "run_file_version": self.identities.run_file or "none",
            "compression": compressor.key if compressor else "none",
            "compression_method": compressor.method if compressor else "none",
            "compression_budget": compressor.budget if compressor else "none",
            "compression_embedder": compressor.ranking_embedder
            if compressor and compressor.method == "extractive"
            else "none",
            "multistep_round": self.setting.step or 1,
            "query_writer": experiment.query_writer().name if self.setting.step else "none",
            "query_writer_identity": self.identities.query_writer or "none",
            "multistep_max_passages": (experiment.multistep.max_passages or "none")
            if self.setting.step
            else "none",
            "n": sampling.n,
            "adaptive": "none" if sampling.adaptive is None else sampling.adaptive.key,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "max_new_tokens": sampling.max_new_tokens,
            "seed": experiment.seed,
            **prompt_params(experiment.prompts_for(self.generator)),
            "consens_leave_one_out": experiment.consens.leave_one_out,
            "erag_label": experiment.erag.label,
            "utility_candidates": experiment.utility.candidates,
            "utility_methods": ",".join(experiment.utility.methods) or "none",
            "config_fingerprint": experiment.fingerprint(),
            PARTITION_CONFIG_PARAM: self.partition_config_fingerprint,
            "ragutil_version": self.version,
        }
        return {name: str(value) for name, value in values.items()}


def partition_run_name(setting: str, generator: str) -> str:
    """The MLflow run name of a ``metric_scores`` partition: ``world__bm25__k5|reader``."""
    return f"{setting}|{generator}"


def partition_config_fingerprint(experiment: ExperimentConfig, setting: str, generator: str) -> str:
    """The slice of the config a setting × generator partition reads: the partition runs of a
    config are those whose partitions read its slices, so a partition ``ragutil run`` skipped
    (its slice unchanged by an edit elsewhere in the config) keeps its run."""
    return experiment.partition_fingerprint([setting, generator])


def mlflow_experiment_name(dataset: str) -> str:
    return f"ragutil/{dataset}"
