"""Adding a metric takes one module and its registration (docs/architecture.md, "add a metric"):
the toy metric of ``toy_metric.py``, once registered, is a column of the per-query table that its
schema declares, a summary mean with its n, a bounded value the asset check reads, an MLflow
interval and a key of ``ragutil score``'s records — with no other file touched."""

from __future__ import annotations

import polars as pl
import pytest

from ragutil_dagster.assets.metric_scores import score_checks
from ragutil_dagster.evaluation.paper_scores import document_scores, query_scores
from ragutil_dagster.evaluation.records import record_key
from ragutil_dagster.evaluation.summary import summarize
from ragutil_dagster.metrics import catalog
from ragutil_dagster.tracking.partition_run import interval_metrics

from .test_document_scores import CASES, tables
from .toy_metric import HAS_ANSWER_GAIN, has_answer_gain


@pytest.fixture
def clean_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations of one test do not outlive it."""
    monkeypatch.setattr(catalog, "_REGISTERED", [])
    monkeypatch.setattr(catalog, "_INDEX", catalog._INDEX)


def scored() -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    groups, queries, run = tables(CASES)
    # the rag condition of each case: its first document's group, as the rag prompt
    rag = groups.filter(pl.col("doc_id").str.ends_with("-d1")).with_columns(
        condition=pl.lit("rag"), doc_id=pl.lit(None, pl.String)
    )
    groups = pl.concat([groups, rag])
    return queries, query_scores(groups, queries), document_scores(groups, queries, run)


@pytest.mark.usefixtures("clean_catalog")
def test_a_registered_metric_reaches_every_consumer() -> None:
    assert catalog.register(HAS_ANSWER_GAIN) is HAS_ANSWER_GAIN
    queries, per_query, documents = scored()

    assert per_query["has_answer_gain"].to_list() == has_answer_gain(per_query).to_list()
    assert catalog.validate_scores("metric_scores", per_query) is per_query
    # optional: a partition scored before the registration has no such column
    assert catalog.score_schema("metric_scores")[1]["has_answer_gain"] == pl.Float64
    assert catalog.validate_scores("metric_scores", per_query.drop("has_answer_gain")) is not None
    # the skip rule's code version changes with it: what it computes is part of the scores' code
    assert "def has_answer_gain" in catalog.registered_fingerprint()
    summary = summarize(per_query, documents, k=1)
    assert summary["has_answer_gain"] == pytest.approx(per_query["has_answer_gain"].mean())
    assert summary["n_has_answer_gain"] == per_query.height
    assert catalog.validate_summary(summary) is summary
    assert catalog.metric("has_answer_gain") is HAS_ANSWER_GAIN
    assert "has_answer_gain" in catalog.with_ci()
    assert {"has_answer_gain_ci_low", "has_answer_gain_ci_high"} <= set(
        interval_metrics(per_query, seed=0)
    )
    assert record_key("has_answer_gain") in {record_key(n) for n in catalog.per_query_means()}

    checks = {c.check_name: c.passed for c in score_checks(queries, per_query, documents, summary)}
    assert checks["scores_in_range"]
    out_of_range = per_query.with_columns(has_answer_gain=pl.lit(1.5))
    checks = {
        c.check_name: c.passed for c in score_checks(queries, out_of_range, documents, summary)
    }
    assert not checks["scores_in_range"]


@pytest.mark.usefixtures("clean_catalog")
def test_a_registration_is_refused_when_the_name_is_taken_or_nothing_computes_it() -> None:
    with pytest.raises(ValueError, match=r"repeated: \['delta_seper_s'\]"):
        catalog.register(
            catalog.Metric("delta_seper_s", "x", "toy", level="query", query_column=has_answer_gain)
        )
    with pytest.raises(ValueError, match="needs a query_column"):
        catalog.register(catalog.Metric("toy_number", "toy", "toy"))
    with pytest.raises(ValueError, match="no per-document column"):
        catalog.register(
            catalog.Metric(
                "toy_gain",
                "toy",
                "toy",
                level="query",
                per_document=True,
                query_column=has_answer_gain,
            )
        )
    with pytest.raises(ValueError, match="makes a metric of level query"):
        catalog.Metric("toy_number", "toy", "toy", query_column=has_answer_gain)
    assert catalog.entries() == catalog.CATALOG


def test_without_registration_the_catalogue_is_the_built_in_one() -> None:
    assert catalog.metric("has_answer_gain") is None
    assert "has_answer_gain" not in {**catalog.score_schema("metric_scores")[1]}
    assert catalog.registered_fingerprint() == ""
