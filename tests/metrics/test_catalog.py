"""The metric catalogue: one entry per name, and the names every consumer derives from it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ragutil_dagster
from ragutil_dagster.metrics import catalog
from ragutil_dagster.metrics.catalog import SummaryKey
from ragutil_dagster.metrics.erag import ERAG_MEASURES


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


def _summary_keys(entry: catalog.Metric) -> list[SummaryKey]:
    """Every key a summary may hold for ``entry``: its value (at k = 5 for a cut-off metric), its
    n and, for MIRAGE's four, its count."""
    at_cut_off = entry.name.endswith("_{k}")
    return [
        SummaryKey(entry.name, 5 if at_cut_off else None),
        SummaryKey(entry.name, kind="n"),
        *([SummaryKey(entry.name, kind="count")] if entry in catalog.mirage() else []),
    ]


@pytest.mark.parametrize("entry", catalog.CATALOG, ids=lambda m: m.name)
def test_every_summary_key_round_trips_through_its_flat_name(entry: catalog.Metric) -> None:
    for key in _summary_keys(entry):
        assert SummaryKey.parse(key.flat) == key, key
        assert catalog.summary_entry(key.flat) is entry


def test_flat_names_are_todays_summary_keys() -> None:
    assert SummaryKey("erag_P_{k}", 5).flat == "erag_P_5"
    assert SummaryKey("erag_P_{k}", 5).n.flat == "n_erag_P_at_k"  # one n for every k
    assert SummaryKey("erag_P_{k}").flat == "erag_P_at_k"  # the column settings of every k share
    assert (
        SummaryKey("utility_likelihood_ndcg_known_{k}", 2).flat == "utility_likelihood_ndcg_known_2"
    )
    assert SummaryKey("mirage_context_acceptability", kind="count").flat == (
        "count_mirage_context_acceptability"
    )
    assert SummaryKey("delta_seper_s").n.flat == "n_delta_seper_s"
    # A cross-run column, a padded cut-off and an unknown name are no key of a summary.
    for name in ("erag_P_at_k", "erag_P_05", "count_erag_map", "n_erag_P_5", "no_such_metric"):
        assert SummaryKey.parse(name) is None, name
    with pytest.raises(ValueError, match="cut-off"):
        SummaryKey("erag_map", 5)
    with pytest.raises(ValueError, match="cut-off"):
        SummaryKey("erag_P_{k}", 5, kind="n")


def test_the_erag_entries_are_made_from_the_measures_of_metrics_erag() -> None:
    erag = [m.name for m in catalog.CATALOG if m.name.startswith("erag_")]
    assert erag == [catalog.erag_metric(m) for m in ERAG_MEASURES]
    assert catalog.erag_metric(ERAG_MEASURES[0]) == "erag_P_{k}"


# The modules that turn flat summary names back into keys, and why: summaries read from outside.
PARSERS = {"generic_name", "summary_entry", "validate_summary", "parse"}
READ_FROM_OUTSIDE = {
    "tracking/compare.py",  # a logged summary, of any version: cut-offs read at_k
    "assets/metric_scores.py",  # the summary it writes, with the retriever's read from JSON
}


def test_no_module_parses_summary_keys_but_the_catalogue_and_readers_of_logged_summaries() -> None:
    """The writer (``evaluation/summary.py``) builds :class:`SummaryKey` s and renders each once;
    only the catalogue's one parser reads flat names back, and only for summaries from outside.
    No regular expression reads them: the catalogue needs none."""
    package = Path(ragutil_dagster.__file__).parent
    calling = set()
    for path in package.rglob("*.py"):
        module = path.relative_to(package).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if module == "metrics/catalog.py" or not isinstance(node, ast.Call):
                continue
            function = node.func
            if (  # catalog.generic_name(…), SummaryKey.parse(…), or a name imported as such
                isinstance(function, ast.Attribute)
                and function.attr in PARSERS
                and isinstance(function.value, ast.Name)
                and function.value.id in ("catalog", "SummaryKey")
            ) or (isinstance(function, ast.Name) and function.id in PARSERS - {"parse"}):
                calling.add(module)
    assert calling == READ_FROM_OUTSIDE
    catalogue = ast.parse((package / "metrics/catalog.py").read_text(encoding="utf-8"))
    assert not any(
        isinstance(node, ast.Import) and any(a.name == "re" for a in node.names)
        for node in ast.walk(catalogue)
    )
