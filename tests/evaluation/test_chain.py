"""One evaluation chain: a config with ``sampling.adaptive`` on means the same through the chain's
stages, ``ragutil score`` (evaluation/records.py) and bench/seper_e2e.py's ragutil path."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from ragutil_dagster.config import parse_config
from ragutil_dagster.data.qa import QADataset
from ragutil_dagster.data.records import read_records
from ragutil_dagster.definitions import build_resources
from ragutil_dagster.evaluation import chain
from ragutil_dagster.evaluation.records import score_records
from ragutil_dagster.tables import DECODING_SAMPLE, QRELS_SCHEMA

BENCH = Path(__file__).resolve().parents[2] / "bench"

RECORDS = [
    {
        "id": "r1",
        "question": "Where was Ada born?",
        "answers": ["Paris"],
        "contexts": ["Ada was born in Paris.", {"id": "d2", "text": "Rome is big."}],
    },
    {
        "id": "r2",
        "question": "Who wrote it?",
        "answers": ["Bo Li", "Li"],
        "contexts": [{"text": "Bo Li wrote it."}],
    },
]


@pytest.mark.slow
def test_adaptive_config_means_the_same_through_stages_score_and_bench(
    tiny_world, make_tiny_config, tmp_path, monkeypatch
) -> None:
    _, world, models = tiny_world
    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path / "home"))
    spec = make_tiny_config(models, world)
    spec["sampling"] = {
        **spec["sampling"],
        "n": 6,
        "adaptive": {"first_round": 2, "round_size": 2, "target_se": 0.2},
    }
    experiment = parse_config(spec)
    generator_spec = experiment.generators[0]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    records = read_records(path)
    loader = build_resources(str(tmp_path / "home"), show_progress=False, for_dagster=False)
    models_ = loader["models"]
    generator = models_.generator(generator_spec)
    entail = models_.entailment(experiment.nli)

    # The stages, composed by hand.
    sampler = chain.Sampler.of(experiment, generator_spec.name, generator)
    no_qrels = pl.DataFrame(schema=QRELS_SCHEMA)
    prompts = pl.concat(
        [
            chain.closed_book(sampler, records.queries),
            chain.with_context(sampler, records.queries, records.corpus, records.run, no_qrels),
        ]
    )
    samples, _ = chain.sample_prompts_by_config(sampler, prompts, records.queries, entail)
    drawn = (
        samples.filter(pl.col("decoding") == DECODING_SAMPLE)
        .group_by("query_id", "condition", "doc_id")
        .len()
    )
    assert set(drawn["len"]) <= {2, 4, 6}  # the rounds of the adaptive schedule
    nli_table = chain.nli(samples, records.queries, entail)
    by_stages = dict(
        chain.scores(samples, records.queries, nli_table, records.run)
        .per_query.select("query_id", "delta_seper_s")
        .iter_rows()
    )

    # ragutil score's path.
    scored = score_records(
        records, experiment, generator_spec, generator, models_.scorer(generator_spec), entail
    )
    by_score = {row["id"]: row["delta_seper_s"] for row in scored}
    assert all("sample_fraction" in row for row in scored)

    # The bench's ragutil path, on the same records as its workload.
    monkeypatch.syspath_prepend(str(BENCH))
    from seper_e2e import Workload, measured, ragutil_path

    work = Workload(
        QADataset("records", records.queries, records.corpus, no_qrels, None),
        {"records": records.run},
        experiment.sampling,
        sampler.templates,
        experiment.seed,
    )
    phase = measured("ragutil", None, records.queries.height, ragutil_path(work, generator, entail))
    by_bench = phase.deltas[("records", "rag", "s")]

    assert set(by_stages) == {"r1", "r2"}
    assert by_score == pytest.approx(by_stages, abs=1e-12)
    assert by_bench == pytest.approx(by_stages, abs=1e-12)
