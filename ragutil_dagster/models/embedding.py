"""Dense text embeddings through sentence-transformers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ragutil_dagster.models.device import resolve_device
from ragutil_dagster.models.identity import (
    ModelRef,
    ModelUnavailableError,
    error_summary,
    resolve_model,
)
from ragutil_dagster.models.inputs import check_texts

__all__ = ["Embedder"]


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

        self.ref = model if isinstance(model, ModelRef) else resolve_model(model, revision)
        self.device = resolve_device(device)
        model_kwargs = {"dtype": torch.float16} if self.device.type == "cuda" else None
        try:
            self._model = SentenceTransformer(
                str(self.ref.path),
                device=str(self.device),
                trust_remote_code=trust_remote_code,
                local_files_only=True,
                model_kwargs=model_kwargs,
            )
        except (OSError, ValueError, KeyError) as err:
            raise ModelUnavailableError(
                f"model {self.ref.name} ({self.ref.path}) could not be loaded as a "
                f"sentence-transformers encoder: {error_summary(err)}"
            ) from None
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
