"""SePer / ΔSePer: the paper's worked cases (App. B.1), the reference code's semantics, properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragutil_dagster.metrics.seper import (
    SePerInput,
    delta_seper,
    least_standard_error,
    response_weights,
    semantic_entropy,
    seper,
    seper_batch,
    seper_standard_error,
)

from .conftest import CONTRADICT, ENTAIL, NEUTRAL, MeaningNLI, equal_logprobs


def counts(**answers: int) -> list[str]:
    return [text.replace("_", " ") for text, n in answers.items() for _ in range(n)]


@pytest.mark.parametrize("kernel", ["soft", "hard"])
def test_table6_single_doc_case(kernel: str) -> None:
    """App. B.1 Table 6: an irrelevant document leaves 10× "Reba McEntire" (ΔSePer 0); the
    positive one turns all ten into "Linda Davis" (ΔSePer 1.0)."""
    q = "Who sings does he love me with reba?"
    nli = MeaningNLI(question=q)
    gold = ["Linda Davis"]
    closed = seper(
        counts(Reba_McEntire=10), equal_logprobs(10), gold, nli, question=q, kernel=kernel
    )
    irrelevant = seper(
        counts(Reba_McEntire=10), equal_logprobs(10), gold, nli, question=q, kernel=kernel
    )
    positive = seper(
        counts(Linda_Davis=10), equal_logprobs(10), gold, nli, question=q, kernel=kernel
    )
    assert delta_seper(irrelevant, closed) == 0.0
    assert delta_seper(positive, closed) == pytest.approx(1.0)


@pytest.mark.parametrize("kernel", ["soft", "hard"])
@pytest.mark.parametrize(("yes", "no", "expected"), [(7, 3, 0.3), (8, 2, 0.2), (3, 7, 0.7)])
def test_table7_equal_likelihoods(kernel: str, yes: int, no: int, expected: float) -> None:
    """Table 7 with equal likelihoods: Yes/No counts 10/0 (closed book), 7/3, 8/2, 3/7 give
    ΔSePer 0.3, 0.2, 0.7 — the share of "No" answers."""
    nli = MeaningNLI()
    closed = seper(counts(Yes=10), equal_logprobs(10), "No", nli, kernel=kernel)
    assert closed.score == 0.0
    with_docs = seper(counts(Yes=yes, No=no), equal_logprobs(10), "No", nli, kernel=kernel)
    assert delta_seper(with_docs, closed) == pytest.approx(expected)


@pytest.mark.parametrize(("yes", "no", "printed"), [(7, 3, 0.15), (8, 2, 0.1)])
def test_table7_printed_values_need_unequal_likelihoods(yes: int, no: int, printed: float) -> None:
    """The printed 0.15 and 0.1 arise when the "No" samples are less likely than the "Yes" ones:
    with mean log-probs differing by log(ratio), softmax weights give "No" exactly that mass."""
    # Solve no·x / (no·x + yes) = printed for x = exp(logp_no − logp_yes).
    ratio = printed * yes / (no * (1 - printed))
    logp_yes = -0.2
    logprobs = [[logp_yes] * 2] * yes + [[logp_yes + math.log(ratio)] * 2] * no
    result = seper(counts(Yes=yes, No=no), logprobs, "No", MeaningNLI())
    assert result.score == pytest.approx(printed)
    assert ratio < 1  # the "No" answers were indeed the less likely ones


def test_weights_are_softmax_of_mean_or_summed_logprobs() -> None:
    logprobs = [[-1.0, -3.0], [-2.0], [-0.5, -0.5, -0.5]]
    mean_w = response_weights(logprobs, "mean")
    sum_w = response_weights(logprobs, "sum")
    expect_mean = np.exp([-2.0, -2.0, -0.5]) / np.exp([-2.0, -2.0, -0.5]).sum()
    expect_sum = np.exp([-4.0, -2.0, -1.5]) / np.exp([-4.0, -2.0, -1.5]).sum()
    np.testing.assert_allclose(mean_w, expect_mean)
    np.testing.assert_allclose(sum_w, expect_sum)


def test_question_prefix_and_pair_deduplication() -> None:
    """With a question, each NLI text is "q? text"; each distinct pair is sent once."""
    q = "Where was Ada born"
    nli = MeaningNLI({"Paris": "paris", "paris, France": "paris", "Rome": "rome"}, question=q)
    responses = ["Paris", "Paris", "paris, France", "Rome", "Paris"]
    result = seper(responses, equal_logprobs(5), ["Paris"], nli, question=q)
    assert len(nli.calls) == 1
    sent = nli.calls[0]
    assert len(sent) == len(set(sent))
    # The 3 distinct responses both ways against the gold "Paris" (itself a response: 5 pairs)
    # hold every pair the clustering reads. The reference loop would ask for N·(N−1) = 20
    # response pairs and 2·N = 10 gold pairs.
    assert len(sent) == 5
    assert all(
        p.startswith("Where was Ada born? ") and h.startswith("Where was Ada born? ")
        for p, h in sent
    )
    assert result.score == pytest.approx(0.8)
    np.testing.assert_array_equal(result.cluster_ids, [0, 0, 0, 1, 0])


def test_diverse_answers_need_about_half_the_reference_pairs() -> None:
    """Ten answers of ten meanings: each pair is judged one way only (the forward label already
    rules equivalence out), in one round per cluster opener, never twice."""
    nli = MeaningNLI()
    responses = [f"answer {i}" for i in range(10)]
    result = seper(responses, equal_logprobs(10), ["gold"], nli)
    sent = [pair for call in nli.calls for pair in call]
    assert len(sent) == len(set(sent))
    assert len(sent) == 45 + 20  # i < j forward, and both ways against the gold
    assert len(nli.calls) == 9  # the last opener has nobody after it
    np.testing.assert_array_equal(result.cluster_ids, np.arange(10))


def test_batch_makes_one_call_for_many_questions() -> None:
    nli = MeaningNLI()
    items = [
        SePerInput(counts(Yes=4, No=6), equal_logprobs(10), ["No"]),
        SePerInput(counts(Yes=9, No=1), equal_logprobs(10), ["No"]),
        SePerInput(counts(Yes=10), equal_logprobs(10), ["Yes"]),
    ]
    results = seper_batch(items, nli)
    assert len(nli.calls) == 1
    # Pairs among {Yes, No} are shared by all three questions: 2 ordered pairs + 2 self pairs.
    assert nli.pairs_sent == 4
    assert [r.score for r in results] == pytest.approx([0.6, 0.1, 1.0])
    singles = [
        seper(i.responses, i.token_logprobs, i.gold_answers, MeaningNLI()).score for i in items
    ]
    assert singles == pytest.approx([r.score for r in results])


def test_soft_kernel_takes_the_larger_entailment_direction() -> None:
    """k_i = max(P(r ⇒ a), P(a ⇒ r)): a response entailing the gold one way counts fully."""

    def one_way(premises, hypotheses):
        rows = []
        for p, h in zip(premises, hypotheses):
            if p == h:
                rows.append(ENTAIL)
            elif (p, h) == ("Paris, France", "Paris"):
                rows.append([0.1, 0.2, 0.7])
            elif (p, h) == ("Paris", "Paris, France"):
                rows.append(NEUTRAL)
            else:
                rows.append(CONTRADICT)
        return np.array(rows, dtype=float)

    result = seper(["Paris, France", "Rome"], equal_logprobs(2), "Paris", one_way)
    assert result.score == pytest.approx(0.5 * 0.7)


def test_hard_kernel_counts_whole_clusters_by_their_first_member() -> None:
    """Hard kernel: a cluster counts when its *first* member matches a gold answer loosely
    (neutral one way, entailment the other); every member's weight then counts."""
    table = {
        ("Paris", "Paris, France"): NEUTRAL,
        ("Paris, France", "Paris"): ENTAIL,
        ("Paris", "capital of France"): ENTAIL,
        ("capital of France", "Paris"): ENTAIL,
        ("Paris, France", "capital of France"): ENTAIL,
        ("capital of France", "Paris, France"): ENTAIL,
    }

    def nli(premises, hypotheses):
        return np.array(
            [
                ENTAIL if p == h else table.get((p, h), CONTRADICT)
                for p, h in zip(premises, hypotheses)
            ]
        )

    responses = ["Paris, France", "capital of France", "Rome", "capital of France"]
    result = seper(responses, equal_logprobs(4), "Paris", nli, kernel="hard")
    # Cluster 0 = {Paris France, capital of France ×2} (strict entailment both ways); its first
    # member matches "Paris" loosely (entail / neutral), so 3 of 4 equal weights count.
    np.testing.assert_array_equal(result.cluster_ids, [0, 0, 1, 0])
    assert result.score == pytest.approx(0.75)


def test_greedy_clustering_reassigns_like_the_reference_loop() -> None:
    """Each cluster opener is compared with *all* later responses, re-assigning matches that an
    earlier cluster had taken (the semantic-entropy code's `get_semantic_ids`)."""
    equivalent = {frozenset({"A", "B"}), frozenset({"B", "C"})}

    def nli(premises, hypotheses):
        return np.array(
            [
                ENTAIL if p == h or frozenset({p, h}) in equivalent else CONTRADICT
                for p, h in zip(premises, hypotheses)
            ]
        )

    result = seper(["A", "C", "B"], equal_logprobs(3), "A", nli)
    # A opens 0 and takes B; C opens 1 and takes B back.
    np.testing.assert_array_equal(result.cluster_ids, [0, 1, 1])
    expected_entropy = -(1 / 3 * math.log(1 / 3) + 2 / 3 * math.log(2 / 3))
    assert result.semantic_entropy == pytest.approx(expected_entropy)


def test_strict_and_loose_clustering_differ_on_one_way_entailment() -> None:
    def nli(premises, hypotheses):
        return np.array(
            [
                ENTAIL if p == h else (ENTAIL if (p, h) == ("X", "Y") else NEUTRAL)
                for p, h in zip(premises, hypotheses)
            ]
        )

    strict = seper(["X", "Y"], equal_logprobs(2), "X", nli, strict=True)
    loose = seper(["X", "Y"], equal_logprobs(2), "X", nli, strict=False)
    np.testing.assert_array_equal(strict.cluster_ids, [0, 1])
    np.testing.assert_array_equal(loose.cluster_ids, [0, 0])
    assert loose.semantic_entropy == pytest.approx(0.0)


def test_several_gold_answers_score_each_answer_then_reduce() -> None:
    """Per-answer scores (the reference code mis-pairs them): the soft kernel keeps the best one
    by default, as the authors' code; the paper's eq. 10 mean and the union on request."""
    nli = MeaningNLI()
    responses = counts(Paris=6, Lyon=3, Rome=1)
    golds = ["Paris", "Lyon", "Berlin"]
    by_max = seper(responses, equal_logprobs(10), golds, nli)
    by_mean = seper(responses, equal_logprobs(10), golds, nli, gold_reduce="mean")
    by_any = seper(responses, equal_logprobs(10), golds, nli, gold_reduce="any")
    np.testing.assert_allclose(by_max.per_gold, [0.6, 0.3, 0.0])
    assert by_max.score == pytest.approx(0.6)
    assert by_mean.score == pytest.approx(0.3)
    assert by_any.score == pytest.approx(0.9)


def test_hard_kernel_counts_a_cluster_matching_any_gold_alias_once() -> None:
    """The authors' hard kernel: a cluster counts once when it matches *any* gold answer. Five
    "JFK" and five "John F. Kennedy" with both as gold answers, and an NLI that finds each
    response equivalent only to its own string: SePer_H = 1.0 (per-answer max would say 0.5)."""
    nli = MeaningNLI()  # each text means itself: "JFK" and "John F. Kennedy" are not equivalent
    golds = ["JFK", "John F. Kennedy"]
    responses = [golds[0]] * 5 + [golds[1]] * 5
    hard = seper(responses, equal_logprobs(10), golds, nli, kernel="hard")
    np.testing.assert_array_equal(hard.cluster_ids, [0] * 5 + [1] * 5)
    np.testing.assert_allclose(hard.per_gold, [0.5, 0.5])
    assert hard.score == pytest.approx(1.0)
    assert seper(
        responses, equal_logprobs(10), golds, nli, kernel="hard", gold_reduce="max"
    ).score == pytest.approx(0.5)
    assert seper(
        responses, equal_logprobs(10), golds, nli, kernel="hard", gold_reduce="mean"
    ).score == pytest.approx(0.5)
    # The soft kernel of the authors' code keeps the best answer's score; "any" is its union.
    assert seper(responses, equal_logprobs(10), golds, nli, kernel="soft").score == pytest.approx(
        0.5
    )
    assert seper(
        responses, equal_logprobs(10), golds, nli, kernel="soft", gold_reduce="any"
    ).score == pytest.approx(1.0)


def test_semantic_entropy_of_weights_by_cluster() -> None:
    assert semantic_entropy(np.array([0, 0, 1, 1]), np.full(4, 0.25)) == pytest.approx(math.log(2))
    assert semantic_entropy(np.array([0, 0, 0]), np.full(3, 1 / 3)) == pytest.approx(0.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"responses": [], "token_logprobs": []}, "no responses"),
        ({"responses": ["a", "b"], "token_logprobs": [[-1.0]]}, "2 responses but 1"),
        ({"responses": ["a"], "token_logprobs": [[]]}, "response #0 has no token log-probs"),
        ({"responses": ["a"], "token_logprobs": [[float("nan")]]}, "NaN"),
        ({"gold_answers": [""]}, "gold answer #0 is empty"),
        ({"gold_answers": []}, "list of gold aliases is empty"),
        ({"kernel": "fuzzy"}, "kernel must be"),
        ({"gold_reduce": "sum"}, "gold_reduce must be"),
    ],
)
def test_bad_input_names_the_problem(kwargs: dict, message: str) -> None:
    args = {
        "responses": ["a"],
        "token_logprobs": [[-1.0]],
        "gold_answers": ["a"],
        "entail": MeaningNLI(),
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        seper(**args)


def test_entail_with_wrong_shape_is_reported() -> None:
    with pytest.raises(ValueError, match=r"expected \(\d+, 3\)"):
        seper(["a"], [[-1.0]], "a", lambda p, h: np.zeros((len(p), 2)))


# --- properties -----------------------------------------------------------------------------

ANSWERS = ["Paris", "Rome", "Lyon", "paris"]
samples = st.lists(
    st.tuples(st.sampled_from(ANSWERS), st.lists(st.floats(-8, 0), min_size=1, max_size=4)),
    min_size=1,
    max_size=10,
)


def soft_nli(premises, hypotheses):
    """A non-degenerate NLI: probabilities depend on the pair's characters."""
    rows = []
    for p, h in zip(premises, hypotheses):
        if p.lower() == h.lower():
            rows.append([0.05, 0.15, 0.8])
        else:
            e = (sum(map(ord, p + h)) % 7) / 10
            rows.append([0.9 - e, 0.1, e])
    return np.array(rows)


@settings(max_examples=60, deadline=None)
@given(samples, st.sampled_from(["soft", "hard"]), st.sampled_from(ANSWERS))
def test_score_in_unit_interval_and_weights_sum_to_one(data, kernel, gold) -> None:
    responses = [r for r, _ in data]
    logprobs = [lp for _, lp in data]
    result = seper(responses, logprobs, gold, soft_nli, kernel=kernel)
    assert 0.0 <= result.score <= 1.0 + 1e-12
    assert result.weights.sum() == pytest.approx(1.0)
    assert result.semantic_entropy >= -1e-12


@settings(max_examples=40, deadline=None)
@given(samples, st.sampled_from(["soft", "hard"]))
def test_identical_responses_with_and_without_context_give_zero_delta(data, kernel) -> None:
    responses = [r for r, _ in data]
    logprobs = [lp for _, lp in data]
    with_ctx, without_ctx = seper_batch(
        [SePerInput(responses, logprobs, ["Paris"]), SePerInput(responses, logprobs, ["Paris"])],
        soft_nli,
        kernel=kernel,
    )
    assert delta_seper(with_ctx, without_ctx) == 0.0


def reference_clusters(texts: list[str], label, strict: bool) -> list[int]:
    """The semantic-entropy code's loop as written there: both labels of every visited pair."""
    ids = [-1] * len(texts)
    next_id = 0
    for i, first in enumerate(texts):
        if ids[i] != -1:
            continue
        ids[i] = next_id
        for j in range(i + 1, len(texts)):
            forward, backward = label(first, texts[j]), label(texts[j], first)
            if (
                (forward == backward == 2)
                if strict
                else (0 not in (forward, backward) and (forward, backward) != (1, 1))
            ):
                ids[j] = next_id
        next_id += 1
    return ids


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from("ABCD"), min_size=1, max_size=10),
    st.dictionaries(
        st.tuples(st.sampled_from("ABCD"), st.sampled_from("ABCD")),
        st.sampled_from([0, 1, 2]),
        min_size=4,
    ),
    st.booleans(),
)
def test_judged_pairs_give_the_reference_loops_clusters(responses, labels, strict) -> None:
    """Whatever the NLI's labels (one-way entailment, neutral, non-transitive), the clusters from
    the pairs judged in rounds equal the reference loop's with every pair judged."""
    rows = (CONTRADICT, NEUTRAL, ENTAIL)

    def label(premise: str, hypothesis: str) -> int:
        return labels.get((premise, hypothesis), 2 if premise == hypothesis else 0)

    def nli(premises, hypotheses):
        return np.array([rows[label(p, h)] for p, h in zip(premises, hypotheses)]).reshape(
            len(premises), 3
        )

    result = seper(responses, equal_logprobs(len(responses)), "A", nli, strict=strict)
    reference = reference_clusters(responses, label, strict)
    # Cluster numbers follow the openers, so the partitions must be equal as numbered.
    np.testing.assert_array_equal(result.cluster_ids, reference)


@settings(max_examples=40, deadline=None)
@given(samples, st.randoms(use_true_random=False))
def test_soft_score_is_invariant_to_permuting_responses(data, rng) -> None:
    shuffled = list(data)
    rng.shuffle(shuffled)
    a = seper([r for r, _ in data], [lp for _, lp in data], "Paris", soft_nli)
    b = seper([r for r, _ in shuffled], [lp for _, lp in shuffled], "Paris", soft_nli)
    assert a.score == pytest.approx(b.score, abs=1e-12)


def softmax_weights(mean_logprobs: list[float]) -> np.ndarray:
    values = np.exp(np.asarray(mean_logprobs) - max(mean_logprobs))
    return values / values.sum()


def authors_hard_seper(responses: list[str], golds: list[str], weights: np.ndarray, label) -> float:
    """The authors' hard kernel as their code intends it (each cluster paired with each answer,
    not by their reshape): strict clusters, each counted once, by its summed weight, when its
    first member matches any gold answer by the loose rule."""
    ids = reference_clusters(responses, label, strict=True)
    total = 0.0
    for cluster in set(ids):
        members = [i for i, c in enumerate(ids) if c == cluster]
        first = responses[members[0]]
        labels = [(label(first, g), label(g, first)) for g in golds]
        if any(0 not in pair and pair != (1, 1) for pair in labels):
            total += sum(weights[i] for i in members)
    return total


def authors_soft_seper(
    responses: list[str], golds: list[str], weights: np.ndarray, entail
) -> float:
    """The authors' soft kernel as their code intends it: per gold answer Σ_i w_i ·
    max(P(r_i ⇒ a), P(a ⇒ r_i)), the best answer's sum kept."""

    def p(premise: str, hypothesis: str) -> float:
        return float(entail([premise], [hypothesis])[0][2])

    return max(sum(w * max(p(r, g), p(g, r)) for r, w in zip(responses, weights)) for g in golds)


arbitrary_labels = st.dictionaries(
    st.tuples(st.sampled_from("ABCDE"), st.sampled_from("ABCDE")),
    st.sampled_from([0, 1, 2]),
    min_size=4,
)
gold_lists = st.lists(st.sampled_from("ABCDE"), min_size=1, max_size=3, unique=True)
mean_logprob_lists = st.lists(st.floats(-6, 0), min_size=1, max_size=10)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from("ABCD"), min_size=1, max_size=10),
    gold_lists,
    arbitrary_labels,
    mean_logprob_lists,
)
def test_default_kernels_equal_the_authors_code_with_several_gold_answers(
    responses, golds, labels, means
) -> None:
    """Whatever the NLI says (one-way, neutral, non-transitive) and however many gold answers:
    the defaults give the authors' SePer_H (union over answers) and SePer_S (best answer)."""
    rows = (CONTRADICT, NEUTRAL, ENTAIL)
    n = min(len(responses), len(means))
    responses, means = responses[:n], means[:n]

    def label(premise: str, hypothesis: str) -> int:
        return labels.get((premise, hypothesis), 2 if premise == hypothesis else 0)

    def nli(premises, hypotheses):
        return np.array([rows[label(p, h)] for p, h in zip(premises, hypotheses)]).reshape(
            len(premises), 3
        )

    weights = softmax_weights(means)
    logprobs = [[m] for m in means]
    hard = seper(responses, logprobs, golds, nli, kernel="hard")
    assert hard.score == pytest.approx(
        authors_hard_seper(responses, golds, weights, label), abs=1e-12
    )
    soft = seper(responses, logprobs, golds, soft_nli, kernel="soft")
    assert soft.score == pytest.approx(
        authors_soft_seper(responses, golds, weights, soft_nli), abs=1e-12
    )


@settings(max_examples=100, deadline=None)
@given(samples, gold_lists, st.sampled_from(["soft", "hard"]))
def test_union_bounds_the_best_answer_which_bounds_the_mean(data, golds, kernel) -> None:
    """Σ_u p(u) max_g ≥ max_g Σ_u p(u) ≥ mean_g Σ_u p(u); one gold answer makes them equal."""
    responses = [r for r, _ in data]
    logprobs = [lp for _, lp in data]
    by = {
        rule: seper(responses, logprobs, golds, soft_nli, kernel=kernel, gold_reduce=rule).score
        for rule in ("any", "max", "mean")
    }
    assert by["any"] >= by["max"] - 1e-12 and by["max"] >= by["mean"] - 1e-12
    if len(golds) == 1:
        assert by["any"] == pytest.approx(by["max"]) and by["max"] == pytest.approx(by["mean"])


@settings(max_examples=60, deadline=None)
@given(
    samples, gold_lists, st.sampled_from(["soft", "hard"]), st.sampled_from(["any", "max", "mean"])
)
def test_score_is_the_weighted_sum_of_the_samples_credits(data, golds, kernel, rule) -> None:
    """SePerResult.credits: each sample's kernel value after the gold rule, Σ w_i c_i = score."""
    responses = [r for r, _ in data]
    result = seper(
        responses, [lp for _, lp in data], golds, soft_nli, kernel=kernel, gold_reduce=rule
    )
    assert result.weights @ result.credits == pytest.approx(result.score, abs=1e-12)
    assert result.credits.shape == (len(responses),)


def test_standard_error_of_split_samples_is_the_delta_method() -> None:
    """Equal weights: N / (N − 1) · Σ w² (c − S)² is the sample variance over N, S(1 − S)·N/(N−1)/N."""
    credits, weights = [1.0] * 5 + [0.0] * 5, [0.1] * 10
    assert seper_standard_error(credits, weights) == pytest.approx(math.sqrt(0.25 * 10 / 9 / 10))
    assert seper_standard_error([1, 1, 0, 0], [0.25] * 4) == pytest.approx(
        math.sqrt(0.25 * 4 / 3 / 4)
    )


def test_agreeing_samples_keep_the_jeffreys_floor() -> None:
    """Four equally weighted agreeing samples: the Beta(4.5, 0.5) posterior sd, not 0; more
    agreeing samples narrow it; one sample says nothing (the prior's 0.5)."""
    four = seper_standard_error([1.0] * 4, [0.25] * 4)
    assert four == pytest.approx(math.sqrt(4.5 * 0.5 / (5**2 * 6)))
    assert seper_standard_error([1.0] * 10, [0.1] * 10) < four
    assert seper_standard_error([0.0] * 4, [0.25] * 4) == pytest.approx(four)
    assert seper_standard_error([0.7], [1.0]) == 0.5


def test_uneven_weights_count_fewer_effective_samples() -> None:
    """One dominant weight: Kish's n_eff ≈ 1, so agreement among the samples proves little."""
    even = seper_standard_error([1.0] * 4, [0.25] * 4)
    skewed = seper_standard_error([1.0] * 4, [0.97, 0.01, 0.01, 0.01])
    assert skewed > even


@pytest.mark.parametrize(
    ("credits", "weights", "message"),
    [
        ([1.0, 0.0], [0.5], "2 credits for 1 weights"),
        ([], [], "0 credits"),
        ([1.0, 0.0], [0.7, 0.7], "sum to 1"),
    ],
)
def test_standard_error_rejects_mismatched_input(credits, weights, message) -> None:
    with pytest.raises(ValueError, match=message):
        seper_standard_error(credits, weights)


@pytest.mark.parametrize("n", [1, 2, 4, 10, 68])
def test_the_least_standard_error_is_that_of_n_agreeing_equal_samples_and_bounds_every_other(
    n: int,
) -> None:
    least = least_standard_error(n)
    assert least == pytest.approx(seper_standard_error([1.0] * n, [1 / n] * n))
    rng = np.random.default_rng(n)
    for _ in range(200):
        weights = rng.dirichlet(np.ones(n))
        credits = rng.choice([0.0, 0.5, 1.0], size=n)
        assert seper_standard_error(credits, weights) >= least - 1e-12
    with pytest.raises(ValueError, match="at least one sample"):
        least_standard_error(0)
