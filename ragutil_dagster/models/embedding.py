"""Dense text embeddings through sentence-transformers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ragutil_dagster.errors import ModelUnavailableError
from ragutil_dagster.models.device import resolve_device
from ragutil_dagster.models.identity import ModelRef, error_summary
from ragutil_dagster.models.inputs import check_texts
from ragutil_dagster.models.resolver import resolve

__all__ = ["Embedder", "load_sentence_transformers"]


def load_sentence_transformers(
    model_class: type,
    model: str | ModelRef,
    revision: str | None,
    device: str | None,
    trust_remote_code: bool,
    what: str,
    **options: object,
) -> tuple[ModelRef, torch.device, object]:
    """Resolve ``model`` and load it as a sentence-transformers ``model_class`` (SentenceTransformer,
    CrossEncoder) from local files, float16 on CUDA; a load failure is one
    :class:`ModelUnavailableError` naming the model and ``what`` it was loaded as."""
    ref = model if isinstance(model, ModelRef) else resolve(model, revision)
    resolved_device = resolve_device(device)
    model_kwargs = {"dtype": torch.float16} if resolved_device.type == "cuda" else None
    try:
        loaded = model_class(
            str(ref.path),
            device=str(resolved_device),
            trust_remote_code=trust_remote_code,
            local_files_only=True,
            model_kwargs=model_kwargs,
            **options,
        )
    except (OSError, ValueError, KeyError) as err:
        raise ModelUnavailableError(
            f"model {ref.name} ({ref.path}) could not be loaded as {what}: {error_summary(err)}"
        ) from None
    return ref, resolved_device, loaded


class Embedder:
    """A sentence-transformers encoder producing L2-normalised float32 vectors.

    Args:
        model: hub id, local directory, or an already resolved :class:`ModelRef`.
        revision: hub revision (hub ids only).
        device: ``"cpu"``, ``"cuda"``, ...; CUDA when present by default (weights in float16 there).
        batch_size: texts per forward pass.
        max_seq_length: truncate inputs to this many tokens (model default when None).
        trust_remote_code: allow code shipped with the model; off unless configured.
        show_progress: tqdm bar for inputs longer than one batch.
    """

    def __init__(
        self,
        model: str | ModelRef,
        *,
        revision: str | None = None,
        device: str | None = None,
        batch_size: int = 64,
        max_seq_length: int | None = None,
        trust_remote_code: bool = False,
        show_progress: bool = True,
    ) -> None:
        from sentence_transformers import SentenceTransformer

        self.ref, self.device, self._model = load_sentence_transformers(
            SentenceTransformer,
            model,
            revision,
            device,
            trust_remote_code,
            "a sentence-transformers encoder",
        )
        if max_seq_length is not None:
            self._model.max_seq_length = max_seq_length
        self._model.eval()
        self.batch_size = batch_size
        self.show_progress = show_progress

    @property
    def identity(self) -> str:
        """The model's identity (hub commit hash or directory fingerprint)."""
        return self.ref.identity

    @property
    def dim(self) -> int:
        """Embedding dimension."""
        dim = self._model.get_embedding_dimension()
        if dim is None:
            raise RuntimeError(f"model {self.ref.name} does not declare its embedding dimension")
        return int(dim)

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None) -> np.ndarray:
        """Embed ``texts`` → float32 array of shape ``(len(texts), dim)``, rows of unit L2 norm."""
        items = check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        size = batch_size or self.batch_size
        with torch.inference_mode():
            vectors = self._model.encode(
                items,
                batch_size=size,
                show_progress_bar=self.show_progress and len(items) > size,
                normalize_embeddings=True,
                convert_to_numpy=True,
            )
        return np.ascontiguousarray(vectors, dtype=np.float32)
