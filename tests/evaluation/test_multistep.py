"""Multi-step rounds as pure functions (evaluation/multistep.py): gathering passages across rounds,
the written query, the writer's prompt, the rounds themselves with a scripted writer and search,
and ΔSePer per round with its gain over the round before."""

from __future__ import annotations

import polars as pl
import pytest

from ragutil_dagster.assets.partitions import build_partitions
from ragutil_dagster.config import parse_config
from ragutil_dagster.errors import ConfigError
from ragutil_dagster.evaluation.conditions import PromptBudget
from ragutil_dagster.evaluation.multistep import (
    gather,
    next_query_prompt,
    round_gains,
    run_rounds,
    written_query,
)


def test_gather_appends_unseen_passages_in_order_up_to_the_cap() -> None:
    context = [("a", 3.0), ("b", 2.0)]
    found = [("b", 9.0), ("c", 1.0), ("d", 0.5)]
    assert gather(context, found, None) == [("a", 3.0), ("b", 2.0), ("c", 1.0), ("d", 0.5)]
    assert gather(context, found, 3) == [("a", 3.0), ("b", 2.0), ("c", 1.0)]
    assert gather(context, found, 2) == context


def test_the_written_query_is_the_first_line_or_else_the_question() -> None:
    assert written_query("\n  employer of Ann Lee \nmore", "Q?") == "employer of Ann Lee"
    assert written_query(" \n ", "Q?") == "Q?"


def test_the_writers_prompt_drops_later_passages_to_fit() -> None:
    context = [("a", "alpha one"), ("b", "beta two three four five six")]
    full = next_query_prompt("q1", "Who?", context, None)
    assert (
        "Doc 1: alpha one\nDoc 2: beta" in full
        and full.endswith("Next query:")
        and "Question: Who?" in full
    )
    words = lambda prompts: [len(p.split()) for p in prompts]
    fitted = next_query_prompt("q1", "Who?", context, PromptBudget(len(full.split()) - 2, words))
    assert "alpha one" in fitted and "beta" not in fitted


def test_rounds_search_the_written_queries_and_gather_what_they_find() -> None:
    questions = {"q1": "Where was Ann born?", "q2": "When was Acme founded?"}
    texts = {
        "a": "Ann works at Acme.",
        "b": "Acme was founded in 1990.",
        "c": "Bob lives in Rome.",
        "d": "Noise.",
    }
    index = {
        "Acme": [("b", 2.0), ("a", 1.0)],
        "Rome": [("c", 1.5)],
        "Where was Ann born?": [("d", 0.1)],
    }
    searched: list[dict[str, str]] = []
    prompts_seen: list[list[str]] = []

    def search(written: dict[str, str]) -> dict[str, list[tuple[str, float]]]:
        searched.append(dict(written))
        return {qid: index.get(text, []) for qid, text in written.items()}

    def write(prompts: list[str]) -> list[str]:
        prompts_seen.append(prompts)
        return ["Acme\nignored", ""][: len(prompts)]

    rounds = run_rounds(
        questions,
        {"q1": [("a", 5.0)], "q2": [("c", 4.0)]},
        texts.__getitem__,
        search,
        write,
        3,
        3,
        None,
    )
    # Round 2: q1 searched "Acme" (b is new, a held); q2 wrote nothing and searched its question.
    assert searched[0] == {"q1": "Acme", "q2": "When was Acme founded?"}
    assert "Doc 1: Ann works at Acme." in prompts_seen[0][0]
    assert (
        "Doc 2: Acme was founded in 1990." in prompts_seen[1][0]
    )  # round 3 reads round 2's gathering
    assert rounds.contexts == {"q1": [("a", 5.0), ("b", 2.0)], "q2": [("c", 4.0)]}
    run = rounds.run("bm25")
    assert run.filter(pl.col("query_id") == "q1").select("rank", "score").rows() == [
        (1, 2.0),
        (2, 1.0),
    ]
    assert set(run["retriever"]) == {"bm25"}
    assert rounds.queries.sort("query_id", "round").rows() == [
        ("q1", 1, "Where was Ann born?", 1),
        ("q1", 2, "Acme", 1),
        ("q1", 3, "Acme", 0),
        ("q2", 1, "When was Acme founded?", 1),
        ("q2", 2, "When was Acme founded?", 0),
        ("q2", 3, "When was Acme founded?", 0),
    ]


def _scores(values_s: list[float], values_h: list[float], tokens: list[int]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "query_id": [f"q{i}" for i in range(len(values_s))],
            "delta_seper_s": values_s,
            "delta_seper_h": values_h,
            "context_tokens_after": tokens,
        }
    )


def test_round_gains_are_the_mean_paired_differences_with_intervals() -> None:
    one = _scores([0.0, 0.2, 0.4, 0.2], [0.1, 0.1, 0.1, 0.1], [10, 10, 10, 10])
    two = _scores([0.5, 0.2, 0.4, 0.7], [0.3, 0.1, 0.1, 0.1], [20, 22, 20, 18])
    table = round_gains([one, two], seed=0)
    assert table["step"].to_list() == [1, 2]
    first, second = table.row(0, named=True), table.row(1, named=True)
    assert first["gain_s"] is None and first["delta_seper_s"] == pytest.approx(0.2)
    assert second["delta_seper_s"] == pytest.approx(0.45)
    assert second["gain_s"] == pytest.approx(0.25)
    assert second["gain_s_low"] <= 0.25 <= second["gain_s_high"] and second["gain_s_low"] >= 0.0
    assert second["gain_h"] == pytest.approx(0.05)
    assert second["context_tokens"] == pytest.approx(20.0)
    # Only the questions both rounds scored are paired.
    fewer = round_gains([one, two.head(2)], seed=0).row(1, named=True)
    assert fewer["queries"] == 2 and fewer["gain_s"] == pytest.approx(0.25)


def _config(**multistep) -> dict:
    return {
        "name": "ms",
        "datasets": [{"name": "world", "format": "synthetic"}],
        "retrievers": [
            {"name": "bm25", "kind": "bm25"},
            {"name": "dense", "kind": "dense", "model": "m"},
        ],
        "k": [1, 2],
        "generators": [{"name": "reader", "model": "m"}, {"name": "writer", "model": "w"}],
        "nli": {"model": "n"},
        "multistep": multistep,
    }


def test_multistep_adds_a_setting_per_later_round_of_each_chained_retriever() -> None:
    experiment = parse_config(_config(steps=3, retrievers=["bm25"], query_writer="writer"))
    keys = [s.key for s in experiment.settings()]
    assert keys == [
        "world__bm25__k1",
        "world__bm25__k1__step-2",
        "world__bm25__k1__step-3",
        "world__bm25__k2",
        "world__bm25__k2__step-2",
        "world__bm25__k2__step-3",
        "world__dense__k1",
        "world__dense__k2",
    ]
    assert experiment.setting("world__bm25__k2__step-3").step == 3
    assert experiment.query_writer().name == "writer"
    assert parse_config(_config(steps=2)).query_writer().name == "reader"


@pytest.mark.parametrize(
    ("multistep", "message"),
    [
        ({"steps": 1}, "multistep.steps"),
        ({"steps": 2, "query_writer": "nobody"}, "'nobody' is not a generator of this config"),
        ({"steps": 2, "retrievers": ["bm26"]}, r"\['bm26'\] are not retrievers"),
        ({"steps": 2, "max_passages": 1}, r"max_passages \(1\) is below k = 2"),
        ({"steps": 2, "max_pasages": 4}, "did you mean 'max_passages'"),
    ],
)
def test_multistep_config_errors_name_the_field(multistep: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(_config(**multistep))


def test_a_run_retriever_is_left_out_of_the_rounds_and_refused_by_name(tmp_path) -> None:
    run_file = tmp_path / "mine.trec"
    run_file.write_text("q1 Q0 d1 1 1.0 mine\n")
    config = _config(steps=2)
    config["retrievers"] = [
        {"name": "bm25", "kind": "bm25"},
        {"name": "mine", "kind": "run", "path": str(run_file)},
    ]
    assert [r.name for r in parse_config(config).multistep_retrievers()] == ["bm25"]
    config["multistep"]["retrievers"] = ["mine"]
    with pytest.raises(ConfigError, match=r"multistep\.retrievers: \['mine'\] are of kind run"):
        parse_config(config)


def test_only_the_rounds_depend_on_the_query_writers_identity() -> None:
    parts = build_partitions(
        parse_config(_config(steps=3, retrievers=["bm25"], query_writer="writer"))
    )
    (dependency,) = parts.query_writer_dependencies()
    assert dependency.asset_key.to_user_string() == "model/generator"
    rounds = [s.key for s in parts.experiment.settings() if s.step]
    assert dependency.partition_mapping.downstream_partition_keys_by_upstream_partition_key == {
        "writer": rounds
    }
    assert not build_partitions(
        parse_config({**_config(steps=2), "multistep": None})
    ).query_writer_dependencies()
