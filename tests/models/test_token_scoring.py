"""TokenScorer: teacher-forced log-probs and last-layer attention mass per passage."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from ragutil_dagster.models.token_scoring import TokenScorer

DOC1 = "Doc 1 (Title: Nile) The Nile is a river in Africa."
DOC2 = "Doc 2 (Title: Paris) Paris is the capital of France."
PROMPT = f"Answer the question.\n{DOC1}\n{DOC2}\nQuestion: what is the capital of France?\nAnswer:"
SPANS = [
    (PROMPT.index(DOC1), PROMPT.index(DOC1) + len(DOC1)),
    (PROMPT.index(DOC2), PROMPT.index(DOC2) + len(DOC2)),
]


@pytest.fixture(scope="module")
def scorer(tiny_models) -> TokenScorer:
    # float32: compared with a float32 forward pass of an independent copy at 1e-5.
    return TokenScorer(
        str(tiny_models.causal_lm), device="cpu", dtype="float32", batch_size=2, show_progress=False
    )


@pytest.fixture(scope="module")
def eager_model(tiny_models):
    """An independent copy of the model with eager attention, as the reference."""
    return AutoModelForCausalLM.from_pretrained(
        tiny_models.causal_lm, attn_implementation="eager"
    ).eval()


def test_score_matches_a_plain_forward_pass(scorer: TokenScorer, eager_model) -> None:
    prompts = [PROMPT, "Question: who wrote Hamlet? Answer:", "Hi"]
    answers = [" Paris, France", " William Shakespeare", " the Eiffel Tower is in Paris"]
    scored = scorer.score(prompts, answers)  # batch_size=2: two batches, left-padded
    tok = scorer.lm.tokenizer
    for prompt, answer, got in zip(prompts, answers, scored, strict=True):
        p = tok(prompt)["input_ids"]
        c = tok(answer, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = eager_model(input_ids=torch.as_tensor([p + c])).logits[0].float()
        expected = torch.log_softmax(logits, -1)[len(p) - 1 : -1].gather(
            -1, torch.as_tensor(c)[:, None]
        )[:, 0]
        assert got.token_ids == tuple(c) and got.prompt_tokens == len(p)
        np.testing.assert_allclose(got.token_logprobs, expected.numpy(), atol=1e-5, rtol=0)
        assert got.logprob == pytest.approx(float(expected.sum()), abs=1e-4)
        assert "".join(got.tokens).replace("Ġ", " ") == answer
        assert len(got.word_ids) == len(c) and got.word_ids[0] == 0


def test_empty_continuation_and_mismatched_inputs(scorer: TokenScorer) -> None:
    assert scorer.score(["Hi"], [""])[0].token_logprobs == ()
    with pytest.raises(ValueError, match="one per prompt"):
        scorer.score(["a", "b"], ["x"])


def test_passage_attention_matches_last_layer_attentions(scorer: TokenScorer, eager_model) -> None:
    answer = " Paris"
    got = scorer.passage_attention([PROMPT], [answer], [SPANS])[0]
    assert scorer.lm.model.config._attn_implementation != "eager"  # switched back afterwards
    ids, offsets = scorer.lm.encode_prompt_with_offsets(PROMPT)
    cont = scorer.lm.tokenizer(answer, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        att = eager_model(
            input_ids=torch.as_tensor([ids + cont]), output_attentions=True
        ).attentions[-1][0]
    expected = []
    for start, end in SPANS:
        toks = [t for t, (a, b) in enumerate(offsets) if a >= 0 and a < end and b > start]
        rows = att[:, len(ids) - 1 : len(ids) + len(cont) - 1][:, :, toks]  # heads × T × span
        expected.append(float(rows.sum(-1).mean()))
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert 0 < got.sum() <= 1 + 1e-6


def test_passage_spans_are_validated(scorer: TokenScorer) -> None:
    empty = scorer.passage_attention([PROMPT], [""], [SPANS])[0]
    assert empty.shape == (2,) and np.isnan(empty).all()
    with pytest.raises(ValueError, match=r"passage_spans\[0\]\[1\]"):
        scorer.passage_attention([PROMPT], [" Paris"], [[SPANS[0], (5, 10_000)]])


def test_batched_passage_attention_equals_one_pair_at_a_time(scorer: TokenScorer) -> None:
    short = f"{DOC2}\nQuestion: capital of France?\nAnswer:"
    short_spans = [(0, len(DOC2))]
    prompts = [PROMPT, short, PROMPT, short]
    answers = [" Paris", " Paris is the capital", "", " France"]
    spans = [SPANS, short_spans, SPANS, short_spans]
    batched = scorer.passage_attention(prompts, answers, spans)  # batch_size=2, left-padded
    alone = [scorer.passage_attention([p], [a], [s])[0] for p, a, s in zip(prompts, answers, spans)]
    assert [b.shape for b in batched] == [(2,), (1,), (2,), (1,)]
    assert np.isnan(batched[2]).all()
    for got, expected in zip(batched, alone, strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-5)
    assert all(b.sum() > 0 for i, b in enumerate(batched) if i != 2)


def test_attention_batches_respect_the_row_and_element_budgets(scorer: TokenScorer) -> None:
    heads = scorer.lm.model.config.num_attention_heads
    lengths = [10, 10, 10, 20, 40]
    assert scorer._attention_batches(list(range(5)), lengths) == [[0, 1], [2, 3], [4]]
    tight = TokenScorer(scorer.lm, batch_size=8, max_attention_elements=2 * heads * 20 * 20)
    # Two rows of width 20 fit; a third does not; width 40 exceeds the budget and runs alone.
    assert tight._attention_batches(list(range(5)), lengths) == [[0, 1, 2], [3], [4]]
