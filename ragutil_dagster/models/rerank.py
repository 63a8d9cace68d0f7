"""Cross-encoder reranking through sentence-transformers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ragutil_dagster.models.embedding import load_sentence_transformers
from ragutil_dagster.models.identity import ModelRef
from ragutil_dagster.models.inputs import check_texts

__all__ = ["CrossEncoderReranker"]


class CrossEncoderReranker:
    """Scores (query, passage) pairs with a single-output cross-encoder; higher = more relevant.

    Scores are the model's configured output (a sigmoid of the logit for the usual single-label
    rerankers), so they are comparable across queries of the same model.

    Args:
        model: hub id, local directory, or an already resolved :class:`ModelRef`.
        revision: hub revision (hub ids only).
        device: CUDA when present by default (weights in float16 there).
        batch_size: pairs per forward pass; pairs of different queries share batches.
        max_length: truncate pairs to this many tokens (model default when None).
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
        max_length: int | None = None,
        trust_remote_code: bool = False,
        show_progress: bool = True,
    ) -> None:
        from sentence_transformers import CrossEncoder

        self.ref, self.device, self._model = load_sentence_transformers(
            CrossEncoder,
            model,
            revision,
            device,
            trust_remote_code,
            "a cross-encoder",
            max_length=max_length,
        )
        if self._model.num_labels != 1:
            raise ValueError(
                f"reranker {self.ref.name} has {self._model.num_labels} outputs; a reranker "
                "needs exactly one relevance score per pair"
            )
        self._model.eval()
        self.batch_size = batch_size
        self.show_progress = show_progress

    @property
    def identity(self) -> str:
        """The model's identity (hub commit hash or directory fingerprint)."""
        return self.ref.identity

    def score(self, query: str, passages: Sequence[str]) -> np.ndarray:
        """Relevance of each passage to ``query`` → float32 array of shape ``(len(passages),)``."""
        if not isinstance(query, str):
            raise TypeError(f"query is {type(query).__name__}, expected str")
        return self.score_many([query], [passages])[0]

    def score_many(
        self, queries: Sequence[str], passages: Sequence[Sequence[str]]
    ) -> list[np.ndarray]:
        """Score many queries' candidate lists in shared batches; one array per query, in order."""
        queries = check_texts(queries, "queries")
        if len(queries) != len(passages):
            raise ValueError(
                f"{len(queries)} queries but {len(passages)} passage lists: one list per query"
            )
        lists = [check_texts(p, f"passages[{i}]") for i, p in enumerate(passages)]
        pairs = [(q, p) for q, plist in zip(queries, lists, strict=True) for p in plist]
        if not pairs:
            return [np.zeros(0, dtype=np.float32) for _ in lists]
        with torch.inference_mode():
            flat = self._model.predict(
                pairs,
                batch_size=self.batch_size,
                show_progress_bar=self.show_progress and len(pairs) > self.batch_size,
                convert_to_numpy=True,
            )
        flat = np.asarray(flat, dtype=np.float32).reshape(len(pairs))
        bounds = np.cumsum([len(p) for p in lists])[:-1]
        return list(np.split(flat, bounds))
