"""The metric catalogue: one entry per name, and the names every consumer derives from it."""

from __future__ import annotations

import pytest

from ragutil_dagster.metrics import catalog


def test_cut_off_names_share_a_column_without_taking_another_metrics_name() -> None:
    assert catalog.generic_name("erag_P_5") == catalog.generic_name("erag_P_1") == "erag_P_at_k"
    # Ranking Recall@k is not the set recall of LLM-specific utility §3.4 (bug B1 of issue 17).
    assert catalog.generic_name("utility_likelihood_recall_5") == "utility_likelihood_recall_at_k"
    assert catalog.generic_name("utility_likelihood_recall") == "utility_likelihood_recall"
    assert catalog.generic_name("queries") == "queries"


def test_every_name_resolves_to_its_entry() -> None:
    for entry in catalog.CATALOG:
        name = entry.name.replace("{k}", "5")
        assert catalog.metric(name) is entry
    assert catalog.metric("no_such_metric") is None


def test_mirage_metrics_come_in_the_papers_order() -> None:
    assert [m.symbol for m in catalog.mirage()] == ["NV", "CA", "CI", "CM"]


@pytest.mark.parametrize("entry", catalog.CATALOG, ids=lambda m: m.name)
def test_entries_are_complete(entry: catalog.Metric) -> None:
    assert entry.label and entry.paper
    assert entry.bounds is None or entry.bounds[0] < entry.bounds[1]
    assert not entry.ci or entry.level == "query"  # intervals are over per-query values
    assert not entry.per_document or entry.level == "query"
