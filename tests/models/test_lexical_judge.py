"""The lexical answer judge (``nli: {model: lexical}``): has_answer as an NLI, through SePer."""

from __future__ import annotations

import numpy as np
import pytest

from ragutil_dagster.config import NliConfig
from ragutil_dagster.errors import ModelUnavailableError
from ragutil_dagster.metrics.answers import has_answer, lexical_entailment
from ragutil_dagster.metrics.seper import nli_text, seper
from ragutil_dagster.models.resolver import LEXICAL_NLI_IDENTITY, resolve
from ragutil_dagster.resources.models import ModelLoader

QUESTION = "Who was the Tangut general who fought Genghis Khan at Deshun?"


def test_entailment_is_containment_of_the_hypothesis_answer_without_the_shared_question() -> None:
    q = lambda text: nli_text(text, QUESTION)  # noqa: E731
    premises = [
        q("The general was Ma Jianlong."),
        q("Ma Jianlong"),
        q("Ma Jianlong"),
        "Deshun",
        q(""),
    ]
    hypotheses = [
        q("ma jianlong"),
        q("The general was Ma Jianlong."),
        q("Genghis Khan"),
        "deshun",
        q("x"),
    ]
    labels = lexical_entailment(premises, hypotheses).argmax(1)
    # entailment, neutral (the question's own words do not count), neutral, entailment (bare), neutral
    assert labels.tolist() == [2, 1, 1, 2, 1]


def test_seper_with_the_lexical_judge_is_the_weighted_share_of_samples_holding_the_answer() -> None:
    responses = [
        "Ma Jianlong",
        "It was Ma Jianlong.",
        "The Tangut general who fought Genghis Khan at Des",
        "I don't know",
        "Genghis Khan",
    ]
    logprobs = [[-0.1], [-0.5], [-1.0], [-2.0], [-0.3]]
    result = seper(responses, logprobs, ["Ma Jianlong"], lexical_entailment, question=QUESTION)
    holds = np.array([has_answer(r, ["Ma Jianlong"]) for r in responses], dtype=float)
    assert result.score == pytest.approx(float(result.weights @ holds))
    hard = seper(
        responses, logprobs, ["Ma Jianlong"], lexical_entailment, question=QUESTION, kernel="hard"
    )
    assert hard.score == pytest.approx(float(result.weights @ holds))


def test_the_registry_serves_it_as_the_nli_and_the_resolver_refuses_it_as_a_model() -> None:
    registry = ModelLoader()
    judge = registry.entailment(NliConfig(model="lexical"))
    assert judge.identity == registry.identity("lexical") == LEXICAL_NLI_IDENTITY
    counted = judge.stats.pairs  # the loader serves one judge per process: other tests count too
    assert judge(["q? Paris, France"], ["q? paris"]).argmax(1).tolist() == [2]
    assert judge.stats.pairs == counted + 1
    with pytest.raises(ModelUnavailableError, match="lexical answer judge"):
        resolve("lexical")
