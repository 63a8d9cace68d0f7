"""Every entry point a user feeds, given bad input: one clear error naming the file, the record
(1-based line, or id) and the field — or, for the inputs ragutil deliberately accepts, what it
makes of them.

The table below is also the source of ``docs/bad_inputs.md``:
``python3 tests/reliability/test_bad_inputs.py > docs/bad_inputs.md`` runs every case and writes
the messages a user actually sees.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
import yaml

from ragutil_dagster.config import DatasetConfig, load_config
from ragutil_dagster.data.chunking import chunk_words
from ragutil_dagster.data.corpus import (
    read_beir,
    read_corpus,
    read_jsonl_queries,
    read_qrels,
)
from ragutil_dagster.data.qa import QADataset, load_dataset
from ragutil_dagster.data.records import read_records
from ragutil_dagster.data.run_files import read_external_run
from ragutil_dagster.errors import ConfigError, CorpusValidationError, ModelUnavailableError
from ragutil_dagster.models.identity import resolve_model
from ragutil_dagster.models.resolver import model_location, resolve

Content = str | bytes | list


@dataclass(frozen=True)
class Case:
    """One bad (or odd) input.

    ``run(folder)`` writes the input under ``folder`` and feeds it to the entry point a user
    reaches; ``error`` is the exception the user must get (``None``: the input is accepted),
    ``fragments`` the parts its message must contain — file, ``:line``, field, reason — and
    ``accepted(result, folder)`` checks what an accepted input became and says it in words.
    """

    id: str
    entry: str
    example: str
    run: Callable[[Path], object]
    error: type[Exception] | None
    fragments: tuple[str, ...] = ()
    accepted: Callable[[object, Path], str] | None = None


def write(folder: Path, name: str, content: Content) -> Path:
    """``content``: text, bytes, or a list of JSONL records (a str item is written verbatim)."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, list):
        content = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in content)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


# --- a small valid BEIR / QA dataset that each dataset case breaks in one place ---------------

CORPUS = [
    {"_id": "d1", "title": "Ada", "text": "Ada was born in Paris."},
    {"_id": "d2", "text": "Rome."},
]
QUERIES = [{"_id": "q1", "text": "Where was Ada born?", "answers": ["Paris"]}]
QRELS = "query-id\tcorpus-id\tscore\nq1\td1\t1\n"


def dataset(folder: Path, files: dict[str, Content] | None = None) -> QADataset:
    """Write the valid dataset with ``files`` (name → content) replaced or added, then load it."""
    contents = {"corpus.jsonl": CORPUS, "queries.jsonl": QUERIES, "qrels/test.tsv": QRELS} | (
        files or {}
    )
    for name, content in contents.items():
        write(folder / "ds", name, content)
    return load_dataset(DatasetConfig(name="ds", format="beir", path=str(folder / "ds")))


# --- score records ----------------------------------------------------------------------------

RECORD = {
    "id": "r1",
    "question": "Where was Ada born?",
    "answers": ["Paris"],
    "contexts": ["Ada was born in Paris."],
}


def without(record: dict, field: str) -> dict:
    return {k: v for k, v in record.items() if k != field}


def records(folder: Path, *lines: Content) -> object:
    return read_records(write(folder, "records.jsonl", list(lines)))


# --- experiment configs -----------------------------------------------------------------------

CONFIG = {
    "name": "exp",
    "datasets": [{"name": "world", "format": "synthetic"}],
    "retrievers": [{"name": "bm25", "kind": "bm25"}],
    "k": [1, 5],
    "generators": [{"name": "reader", "model": "embedded:reader"}],
    "nli": {"model": "embedded:nli"},
}


def config(folder: Path, text: str | None = None, **changes: object) -> object:
    """Load ``exp.yaml``: the valid config with ``changes`` (a dict value updates that section),
    or ``text`` verbatim."""
    if text is None:
        data = dict(CONFIG)
        for key, value in changes.items():
            data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
        text = yaml.safe_dump(data, sort_keys=False)
    return load_config(write(folder, "exp.yaml", text))


# --- run files of a user's own retriever (kind: run) ------------------------------------------


def external_run(
    folder: Path, name: str, content: Content, query_ids: tuple[str, ...] = ("q1",)
) -> object:
    """Read run file ``name`` as the retrieval step reads it, against the small dataset's
    passages (d1, d2) and ``query_ids``."""
    ids = pl.Series([d["_id"] for d in CORPUS])
    return read_external_run(
        write(folder, name, content), "mine", "small", pl.Series(query_ids), ids
    )


def parquet_run(folder: Path, **columns: list) -> object:
    pl.DataFrame(columns).write_parquet(folder / "run.parquet")
    return external_run(folder, "run.parquet", (folder / "run.parquet").read_bytes())


# --- models -----------------------------------------------------------------------------------


def nli_without_tokenizer(folder: Path) -> object:
    """A real (tiny) NLI classifier whose tokenizer files were not copied along."""
    from ragutil_dagster.models.entailment import Entailment
    from ragutil_dagster.testing.tiny import build_nli_classifier

    model = build_nli_classifier(folder / "nli-model")
    for file in model.iterdir():
        if file.name.startswith(("tokenizer", "vocab", "special_tokens")):
            file.unlink()
    return Entailment(str(model), cache=False, show_progress=False)


def k_beyond_corpus(folder: Path) -> object:
    """The retrieval step of a setting whose k exceeds the dataset's two passages."""
    import dagster as dg

    from ragutil_dagster.assets import build_assets
    from ragutil_dagster.config import parse_config
    from ragutil_dagster.resources.models import ModelLoader
    from ragutil_dagster.resources.storage import ArtifactStore

    spec = {
        **CONFIG,
        "datasets": [{"name": "ds", "format": "beir", "path": str(folder / "ds")}],
        "k": [1, 50],
    }
    experiment = parse_config(spec)
    loaded = dataset(folder)
    store = ArtifactStore(home=str(folder / "home"))
    store.write_table("corpus", "ds", loaded.corpus)
    store.write_table("queries", "ds", loaded.queries)
    store.write_table("queries", "ds", loaded.qrels, "qrels")
    _, assets = build_assets(experiment)
    retrieval = next(
        a
        for a in assets
        if isinstance(a, dg.AssetsDefinition) and dg.AssetKey("retrieval_run") in a.keys
    )
    context = dg.build_asset_context(
        partition_key="ds__bm25__k50", resources={"store": store, "models": ModelLoader()}
    )
    return list(retrieval(context))


TEN_MB = 10 * 2**20


def big_passage_kept(corpus: object, folder: Path) -> str:
    text = corpus["text"][0]
    assert corpus.height == 2 and len(text) == TEN_MB
    passages = chunk_words(corpus, words=100)
    expected = math.ceil(len(text.split()) / 100) + 1  # the big one in 100-word windows, plus d2
    assert passages.height == expected
    assert passages.filter(pl.col("doc_id") == "big")["text"].str.len_chars().max() < 1000
    return (
        f"the 10 MiB passage is kept whole by ingest and cut by chunk_words(words=100) "
        f"into {expected - 1} passages; prompt-time truncation is the generator's (docs/reliability.md, Guards)"
    )


def ids_read(column: str, expected: list[str]) -> Callable[[object, Path], str]:
    def check(table: object, folder: Path) -> str:
        assert table[column].to_list() == expected
        return f"{column}s {expected}"

    return check


CASES = [
    # --- corpus: JSONL ------------------------------------------------------------------------
    Case(
        "jsonl-malformed-line",
        "corpus (JSONL)",
        'line 3 is `{"id": "b", "text": ` (cut off; line 2 blank)',
        lambda d: read_corpus(
            write(d, "corpus.jsonl", [{"id": "a", "text": "x"}, "", '{"id": "b", "text": '])
        ),
        CorpusValidationError,
        ("corpus.jsonl:3:", "invalid JSON"),
    ),
    Case(
        "jsonl-missing-field",
        "corpus (JSONL)",
        "line 2 has no `text`",
        lambda d: read_corpus(write(d, "corpus.jsonl", [{"id": "a", "text": "x"}, {"id": "b"}])),
        CorpusValidationError,
        ("corpus.jsonl:2:", "field 'text'", "missing"),
    ),
    Case(
        "jsonl-wrong-type",
        "corpus (JSONL)",
        '`"text": 3`',
        lambda d: read_corpus(write(d, "corpus.jsonl", [{"id": "a", "text": 3}])),
        CorpusValidationError,
        ("corpus.jsonl:1:", "field 'text'", "expected a string, got int"),
    ),
    Case(
        "jsonl-duplicate-ids",
        "corpus (JSONL)",
        "id `a` on lines 1 and 2",
        lambda d: read_corpus(
            write(d, "corpus.jsonl", [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}])
        ),
        CorpusValidationError,
        ("corpus.jsonl:2:", "field 'id'", "duplicate id 'a' (first seen on line 1)"),
    ),
    Case(
        "jsonl-empty-text",
        "corpus (JSONL)",
        '`"text": "   "`',
        lambda d: read_corpus(write(d, "corpus.jsonl", [{"id": "a", "text": "   "}])),
        CorpusValidationError,
        ("corpus.jsonl:1:", "field 'text'", "empty text"),
    ),
    Case(
        "jsonl-not-an-object",
        "corpus (JSONL)",
        'line 2 is `["b", "text"]`',
        lambda d: read_corpus(write(d, "corpus.jsonl", [{"id": "a", "text": "x"}, ["b", "text"]])),
        CorpusValidationError,
        ("corpus.jsonl:2:", "expected a JSON object, got list"),
    ),
    Case(
        "jsonl-non-utf8",
        "corpus (JSONL)",
        "Latin-1 byte `\\xe9` on line 2",
        lambda d: read_corpus(
            write(d, "corpus.jsonl", b'{"id": "a", "text": "x"}\n{"id": "b", "text": "caf\xe9"}\n')
        ),
        CorpusValidationError,
        ("corpus.jsonl:2:", "not valid UTF-8"),
    ),
    Case(
        "jsonl-trailing-garbage",
        "corpus (JSONL)",
        '`{"id": "a", "text": "x"} extra`',
        lambda d: read_corpus(write(d, "corpus.jsonl", ['{"id": "a", "text": "x"} extra'])),
        CorpusValidationError,
        ("corpus.jsonl:1:", "invalid JSON: Extra data"),
    ),
    Case(
        "jsonl-nan-id",
        "corpus (JSONL)",
        '`"id": NaN`',
        lambda d: read_corpus(write(d, "corpus.jsonl", ['{"id": NaN, "text": "x"}'])),
        CorpusValidationError,
        ("corpus.jsonl:1:", "field 'id'", "NaN is not a JSON number"),
    ),
    Case(
        "corpus-empty-file",
        "corpus (JSONL)",
        "a 0-byte corpus.jsonl",
        lambda d: read_corpus(write(d, "corpus.jsonl", "")),
        CorpusValidationError,
        ("corpus.jsonl:", "no records"),
    ),
    Case(
        "corpus-missing-file",
        "corpus (JSONL)",
        "a path that does not exist",
        lambda d: read_corpus(d / "corpus.jsonl"),
        CorpusValidationError,
        ("corpus.jsonl:", "no such file"),
    ),
    Case(
        "corpus-unknown-format",
        "corpus",
        "`corpus.csv`",
        lambda d: read_corpus(write(d, "corpus.csv", "id,text\n")),
        CorpusValidationError,
        ("corpus.csv:", "unknown corpus format"),
    ),
    Case(
        "corpus-bom",
        "corpus (JSONL)",
        "UTF-8 byte-order mark before line 1",
        lambda d: read_corpus(write(d, "corpus.jsonl", b'\xef\xbb\xbf{"id": "a", "text": "x"}\n')),
        None,
        accepted=ids_read("id", ["a"]),
    ),
    Case(
        "corpus-blank-lines",
        "corpus (JSONL)",
        "blank lines before, between and after records",
        lambda d: read_corpus(
            write(
                d,
                "corpus.jsonl",
                ["", {"id": "a", "text": "x"}, "  ", {"id": "b", "text": "y"}, ""],
            )
        ),
        None,
        accepted=lambda t, d: (
            ids_read("id", ["a", "b"])(t, d) + " (blank lines are skipped; "
            "error line numbers stay physical, see jsonl-malformed-line)"
        ),
    ),
    Case(
        "corpus-10mb-passage",
        "corpus (JSONL)",
        "one passage of 10 MiB (2 Mi words)",
        lambda d: read_corpus(
            write(
                d,
                "corpus.jsonl",
                [{"id": "big", "text": "word " * (TEN_MB // 5)}, {"id": "d2", "text": "Rome."}],
            )
        ),
        None,
        accepted=big_passage_kept,
    ),
    # --- corpus: DPR TSV and Parquet ----------------------------------------------------------
    Case(
        "tsv-bad-header",
        "corpus (DPR TSV)",
        "header `doc\\ttext\\ttitle`",
        lambda d: read_corpus(write(d, "psgs.tsv", "doc\ttext\ttitle\n1\tx\tT\n")),
        CorpusValidationError,
        ("psgs.tsv:1:", "expected the header 'id, text, title'"),
    ),
    Case(
        "tsv-unclosed-quote",
        "corpus (DPR TSV)",
        "line 2's text opens a quote it never closes",
        lambda d: read_corpus(
            write(d, "psgs.tsv", 'id\ttext\ttitle\n1\t"Ada was\tAda\n2\tRome.\tRome\n')
        ),
        CorpusValidationError,
        ("psgs.tsv:2:", "expected 3 tab-separated fields", "unclosed quote"),
    ),
    Case(
        "parquet-null-text",
        "corpus (Parquet)",
        "row 2 has `text` null",
        lambda d: read_corpus(_parquet(d, {"id": ["a", "b"], "text": ["x", None]})),
        CorpusValidationError,
        ("corpus.parquet:2:", "field 'text'", "empty text"),
    ),
    Case(
        "parquet-missing-column",
        "corpus (Parquet)",
        "columns `id, body`",
        lambda d: read_corpus(_parquet(d, {"id": ["a"], "body": ["x"]})),
        CorpusValidationError,
        ("corpus.parquet:", "field 'text'", "missing column"),
    ),
    Case(
        "parquet-corrupt",
        "corpus (Parquet)",
        "a truncated file",
        lambda d: read_corpus(write(d, "corpus.parquet", b"PAR1\x00\x01")),
        CorpusValidationError,
        ("corpus.parquet:", "unreadable Parquet file"),
    ),
    # --- queries and qrels --------------------------------------------------------------------
    Case(
        "queries-empty-file",
        "queries",
        "a 0-byte queries.jsonl",
        lambda d: read_jsonl_queries(write(d, "queries.jsonl", "")),
        CorpusValidationError,
        ("queries.jsonl:", "no records"),
    ),
    Case(
        "queries-empty-question",
        "queries",
        'line 2 `"text": ""`',
        lambda d: dataset(
            d, {"queries.jsonl": [QUERIES[0], {"_id": "q2", "text": "", "answers": ["x"]}]}
        ),
        CorpusValidationError,
        ("queries.jsonl:2:", "field 'text'", "empty text"),
    ),
    Case(
        "qrels-unknown-doc-id",
        "qrels (BEIR)",
        "line 2 judges `d9`, not in corpus.jsonl",
        lambda d: dataset(d, {"qrels/test.tsv": "q1\td1\t1\nq1\td9\t1\n"}),
        CorpusValidationError,
        ("test.tsv:2:", "field 'doc_id'", "absent from corpus.jsonl, e.g. 'd9'"),
    ),
    Case(
        "qrels-unknown-query-id",
        "qrels (BEIR)",
        "line 3 judges query `q9`",
        lambda d: dataset(d, {"qrels/test.tsv": QRELS + "q9\td1\t1\n"}),
        CorpusValidationError,
        ("test.tsv:3:", "field 'query_id'", "absent from queries.jsonl, e.g. 'q9'"),
    ),
    Case(
        "qrels-trec-bad-score",
        "qrels (TREC)",
        "`q2 0 d3 high` on line 2",
        lambda d: read_qrels(write(d, "qrels.txt", "q1 0 d1 2\nq2 0 d3 high\n")),
        CorpusValidationError,
        ("qrels.txt:2:", "field 'score'", "expected an integer, got 'high'"),
    ),
    Case(
        "qrels-bad-score-first-line",
        "qrels (TREC)",
        "`q1 0 d1 1.5` on line 1 (was skipped as a header)",
        lambda d: read_qrels(write(d, "qrels.txt", "q1 0 d1 1.5\nq2 0 d3 1\n")),
        CorpusValidationError,
        ("qrels.txt:1:", "field 'score'", "got '1.5'"),
    ),
    Case(
        "qrels-conflicting-judgements",
        "qrels (BEIR)",
        "`q1 d1` judged 1 on line 2 and 0 on line 3",
        lambda d: read_qrels(write(d, "test.tsv", QRELS + "q1\td1\t0\n")),
        CorpusValidationError,
        ("test.tsv:3:", "field 'score'", "judged 1 on line 2 and 0 here"),
    ),
    Case(
        "qrels-repeated-judgement",
        "qrels (BEIR)",
        "`q1 d1 1` on lines 2 and 3 (merged files)",
        lambda d: read_qrels(write(d, "test.tsv", QRELS + "q1\td1\t1\nq1\td2\t0\n")),
        None,
        accepted=lambda t, d: ids_read("doc_id", ["d1", "d2"])(t, d) + " (the repeat is kept once)",
    ),
    Case(
        "beir-missing-qrels",
        "BEIR folder",
        "no `qrels/test.tsv`",
        lambda d: read_beir(_beir_without_qrels(d)),
        CorpusValidationError,
        ("qrels/test.tsv:", "missing from the BEIR folder"),
    ),
    # --- SQuAD JSON and questions with answers over a corpus (docs/datasets.md) ----------------
    Case(
        "squad-no-answers",
        "dataset (SQuAD JSON)",
        'a question with `"answers": []`, not `is_impossible`',
        lambda d: squad(d, answers=[]),
        CorpusValidationError,
        ("dev.json:", "field 'data[0].paragraphs[0].qas[0].answers'", "no gold answer"),
    ),
    Case(
        "squad-duplicate-question-id",
        "dataset (SQuAD JSON)",
        "question id `q1` in two paragraphs",
        lambda d: squad(d, repeat=True),
        CorpusValidationError,
        ("dev.json:", "field 'data[0].paragraphs[1].qas[0].id'", "duplicate id 'q1'"),
    ),
    Case(
        "squad-malformed-json",
        "dataset (SQuAD JSON)",
        '`{"data": [` cut off on line 2',
        lambda d: load_dataset(
            DatasetConfig(
                name="s", format="squad", path=str(write(d, "dev.json", '{"data": [\n{"title": '))
            )
        ),
        CorpusValidationError,
        ("dev.json:2:", "invalid JSON"),
    ),
    Case(
        "qa-no-answer-field",
        "dataset (questions + corpus)",
        'line 2 is `{"question": "Who?"}`',
        lambda d: questions(
            d, [{"question": "Where was Ada born?", "answer": ["Paris"]}, {"question": "Who?"}]
        ),
        CorpusValidationError,
        ("nq.jsonl:2:", "field 'answers'", "one of answers, answer"),
    ),
    Case(
        "qa-empty-answer-list",
        "dataset (questions + corpus)",
        '`"answer": []`',
        lambda d: questions(d, [{"question": "Who?", "answer": []}]),
        CorpusValidationError,
        ("nq.jsonl:1:", "field 'answer'", "non-empty list"),
    ),
    Case(
        "qa-qrels-unknown-passage",
        "dataset (questions + corpus)",
        "qrels judge passage `d9` of no corpus",
        lambda d: questions(
            d, [{"id": "q1", "question": "Who?", "answer": ["Ada"]}], qrels="q1\td9\t1\n"
        ),
        CorpusValidationError,
        ("qrels.tsv:1:", "field 'doc_id'", "absent from", "'d9'"),
    ),
    # --- gold answers and ground truth --------------------------------------------------------
    Case(
        "answers-empty-gold",
        "gold answers",
        '`"answers": [""]`',
        lambda d: dataset(d, {"queries.jsonl": [{**QUERIES[0], "answers": [""]}]}),
        CorpusValidationError,
        ("queries.jsonl:1:", "field 'answers[0]'", "empty or not a string"),
    ),
    Case(
        "answers-missing",
        "gold answers",
        "a question with no `answers`",
        lambda d: dataset(d, {"queries.jsonl": [without(QUERIES[0], "answers")]}),
        CorpusValidationError,
        ("queries.jsonl:1:", "field 'answers'", "non-empty list"),
    ),
    Case(
        "answers-wrong-type-field",
        "gold answers",
        '`"known": "yes"` in questions.jsonl',
        lambda d: dataset(d, {"questions.jsonl": [{**QUERIES[0], "known": "yes"}]}),
        CorpusValidationError,
        ("questions.jsonl:1:", "field 'known'", "expected true or false"),
    ),
    Case(
        "utility-nan",
        "ground-truth utility",
        '`"utility": NaN` in utility.jsonl',
        lambda d: dataset(
            d, {"utility.jsonl": ['{"query-id": "q1", "corpus-id": "d1", "utility": NaN}']}
        ),
        CorpusValidationError,
        ("utility.jsonl:1:", "field 'utility'", "NaN is not a JSON number"),
    ),
    # --- ragutil score records ----------------------------------------------------------------
    Case(
        "score-missing-contexts",
        "ragutil score records",
        "a record without `contexts`",
        lambda d: records(d, RECORD, {**without(RECORD, "contexts"), "id": "r2"}),
        CorpusValidationError,
        ("records.jsonl:2:", "field 'contexts'", "non-empty list"),
    ),
    Case(
        "score-missing-question",
        "ragutil score records",
        "a record without `question`",
        lambda d: records(d, without(RECORD, "question")),
        CorpusValidationError,
        ("records.jsonl:1:", "field 'question'", "missing"),
    ),
    Case(
        "score-missing-answers",
        "ragutil score records",
        "a record without `answers`",
        lambda d: records(d, without(RECORD, "answers")),
        CorpusValidationError,
        ("records.jsonl:1:", "field 'answers'", "non-empty list of gold answers"),
    ),
    Case(
        "score-empty-question",
        "ragutil score records",
        '`"question": " "`',
        lambda d: records(d, {**RECORD, "question": " "}),
        CorpusValidationError,
        ("records.jsonl:1:", "field 'question'", "empty"),
    ),
    Case(
        "score-duplicate-ids",
        "ragutil score records",
        "id `r1` twice",
        lambda d: records(d, RECORD, RECORD),
        CorpusValidationError,
        ("records.jsonl:2:", "field 'id'", "duplicate id 'r1'"),
    ),
    Case(
        "score-context-id-reused",
        "ragutil score records",
        "context id `d1` with another text on line 2",
        lambda d: records(
            d,
            {**RECORD, "contexts": [{"id": "d1", "text": "A"}]},
            {**RECORD, "id": "r2", "contexts": [{"id": "d1", "text": "B"}]},
        ),
        CorpusValidationError,
        ("records.jsonl:2:", "field 'contexts[0].text'", "different text on line 1"),
    ),
    Case(
        "score-not-an-object",
        "ragutil score records",
        'line 1 is `"just a string"`',
        lambda d: records(d, json.dumps("just a string")),
        CorpusValidationError,
        ("records.jsonl:1:", "expected a JSON object, got str"),
    ),
    # --- run files (kind: run) ----------------------------------------------------------------
    Case(
        "run-unknown-query-id",
        "run file (TREC)",
        "line 2 ranks for query `q9`, not a question of the dataset",
        lambda d: external_run(d, "run.trec", "q1 Q0 d1 1 2.5 mine\nq9 Q0 d2 1 1.0 mine\n"),
        CorpusValidationError,
        ("run.trec:2:", "'query_id'", "'q9' is not a query of dataset 'small'"),
    ),
    Case(
        "run-unknown-doc-id",
        "run file (TREC)",
        "line 2 ranks passage `d7` of no corpus",
        lambda d: external_run(d, "run.trec", "q1 Q0 d1 1 2.5 mine\nq1 Q0 d7 2 1.0 mine\n"),
        CorpusValidationError,
        ("run.trec:2:", "'doc_id'", "'d7' is not a passage of dataset 'small'"),
    ),
    Case(
        "run-wrong-column-count",
        "run file (TREC)",
        "`q1 d1 1 2.5` (no Q0, no tag) on line 1",
        lambda d: external_run(d, "run.trec", "q1 d1 1 2.5\n"),
        CorpusValidationError,
        ("run.trec:1:", "expected 6 fields 'qid Q0 docid rank score tag', got 4"),
    ),
    Case(
        "run-non-integer-rank",
        "run file (JSONL)",
        '`"rank": "first"` on line 1',
        lambda d: external_run(
            d, "run.jsonl", [{"query_id": "q1", "doc_id": "d1", "rank": "first", "score": 1}]
        ),
        CorpusValidationError,
        ("run.jsonl:1:", "'rank'", "expected an integer, got 'first'"),
    ),
    Case(
        "run-non-numeric-score",
        "run file (Parquet)",
        "row 2's `score` is `high`",
        lambda d: parquet_run(
            d, query_id=["q1", "q1"], doc_id=["d1", "d2"], rank=[1, 2], score=["2.5", "high"]
        ),
        CorpusValidationError,
        ("run.parquet:2:", "'score'", "expected a number, got 'high'"),
    ),
    Case(
        "run-passage-twice",
        "run file (TREC)",
        "`d1` ranked for `q1` on lines 1 and 2",
        lambda d: external_run(d, "run.trec", "q1 Q0 d1 1 2.5 mine\nq1 Q0 d1 2 1.0 mine\n"),
        CorpusValidationError,
        ("run.trec:2:", "'doc_id'", "passage 'd1' is ranked twice for query 'q1'"),
    ),
    Case(
        "run-missing-query",
        "run file (TREC)",
        "no row for question `q2` of the dataset",
        lambda d: external_run(d, "run.trec", "q1 Q0 d1 1 2.5 mine\n", ("q1", "q2")),
        CorpusValidationError,
        (
            "run.trec:",
            "'query_id'",
            "1 of the 2 queries of dataset 'small' have no row, e.g. 'q2'",
            "set 'missing_queries: empty'",
        ),
    ),
    Case(
        "config-run-file-missing",
        "experiment config",
        "`{kind: run, path: runs/mine.trec}`, no such file",
        lambda d: config(d, retrievers=[{"name": "mine", "kind": "run", "path": "runs/mine.trec"}]),
        ConfigError,
        ("exp.yaml:", "retrievers.0", "run file 'runs/mine.trec' does not exist"),
    ),
    # --- experiment config --------------------------------------------------------------------
    Case(
        "config-typo",
        "experiment config",
        "`sampling: {temprature: 0.7}`",
        lambda d: config(d, sampling={"temprature": 0.7}),
        ConfigError,
        ("exp.yaml:", "sampling.temprature", "did you mean 'temperature'?"),
    ),
    Case(
        "config-yaml-syntax",
        "experiment config",
        "`k: [1, 5` (unclosed)",
        lambda d: config(d, "name: exp\nk: [1, 5\nnli: {model: x}\n"),
        ConfigError,
        ("exp.yaml:3:", "not valid YAML"),
    ),
    Case(
        "config-duplicate-key",
        "experiment config",
        "`k:` given twice",
        lambda d: config(d, yaml.safe_dump(CONFIG, sort_keys=False) + "k: [3]\n"),
        ConfigError,
        ("exp.yaml:", "key 'k' is given twice"),
    ),
    Case(
        "config-empty-file",
        "experiment config",
        "a 0-byte exp.yaml",
        lambda d: config(d, ""),
        ConfigError,
        ("exp.yaml:", "empty experiment config"),
    ),
    Case(
        "config-zero-n",
        "experiment config",
        "`sampling: {n: 0}`",
        lambda d: config(d, sampling={"n": 0}),
        ConfigError,
        ("exp.yaml:", "sampling.n", "must be at least 1 (got 0)"),
    ),
    Case(
        "config-negative-temperature",
        "experiment config",
        "`sampling: {temperature: -0.5}`",
        lambda d: config(d, sampling={"temperature": -0.5}),
        ConfigError,
        ("exp.yaml:", "sampling.temperature", "(got -0.5)"),
    ),
    Case(
        "config-zero-temperature",
        "experiment config",
        "`sampling: {temperature: 0}` with the default n = 10",
        lambda d: config(d, sampling={"temperature": 0}),
        ConfigError,
        ("exp.yaml:", "sampling", "temperature 0 is greedy decoding"),
    ),
    Case(
        "config-greedy-single-sample",
        "experiment config",
        "`sampling: {temperature: 0, n: 1}`",
        lambda d: config(d, sampling={"temperature": 0, "n": 1}),
        None,
        accepted=lambda c, d: _greedy(c),
    ),
    Case(
        "config-nan-temperature",
        "experiment config",
        "`sampling: {temperature: .nan}`",
        lambda d: config(
            d, "\n".join([yaml.safe_dump(CONFIG, sort_keys=False), "sampling: {temperature: .nan}"])
        ),
        ConfigError,
        ("exp.yaml:", "sampling.temperature", "(got nan)"),
    ),
    Case(
        "config-zero-k",
        "experiment config",
        "`k: [0, 5]`",
        lambda d: config(d, k=[0, 5]),
        ConfigError,
        ("exp.yaml:", "k:", "distinct positive integers"),
    ),
    Case(
        "config-unknown-retriever",
        "experiment config",
        "`kind: splade`",
        lambda d: config(d, retrievers=[{"name": "s", "kind": "splade"}]),
        ConfigError,
        ("exp.yaml:", "retrievers.0.kind", "(got 'splade')"),
    ),
    Case(
        "config-unknown-prompt",
        "experiment config",
        "`prompts: {closed_book: nope}`",
        lambda d: config(d, prompts={"closed_book": "nope"}),
        ConfigError,
        ("exp.yaml:", "prompts.closed_book", "unknown prompt 'nope'"),
    ),
    Case(
        "config-template-unknown-placeholder",
        "experiment config",
        '`generators[0].prompts: {with_context: "{context}\\nQ: {question}\\nA:"}`',
        lambda d: config(
            d,
            generators=[
                {
                    "name": "reader",
                    "model": "embedded:reader",
                    "prompts": {"with_context": "{context}\nQ: {question}\nA:"},
                }
            ],
        ),
        ConfigError,
        (
            "exp.yaml:",
            "generators.0.prompts.with_context",
            "uses {context}, which role with_context does not fill",
            "its placeholders: {question}, {reference}",
        ),
    ),
    Case(
        "config-template-missing-file",
        "experiment config",
        "`prompts: {closed_book: file:fewshot.txt}` (no such file)",
        lambda d: config(d, prompts={"closed_book": "file:fewshot.txt"}),
        ConfigError,
        ("exp.yaml:", "prompts.closed_book", "file:fewshot.txt: no such file"),
    ),
    Case(
        "config-empty-model-name",
        "experiment config",
        '`nli: {model: ""}`',
        lambda d: config(d, nli={"model": ""}),
        ConfigError,
        ("exp.yaml:", "nli.model", "empty model name"),
    ),
    Case(
        "k-larger-than-corpus",
        "experiment config × corpus",
        "`k: [1, 50]` on a 2-passage corpus",
        k_beyond_corpus,
        ConfigError,
        ("k: 50 exceeds the 2 passages of dataset 'ds'",),
    ),
    # --- model ids ----------------------------------------------------------------------------
    Case(
        "model-unknown-hub-id",
        "model id",
        "`ragutil-test/no-such-model`, hub offline",
        lambda d: resolve_model("ragutil-test/no-such-model"),
        ModelUnavailableError,
        ("ragutil-test/no-such-model is unavailable", "not in the local Hugging Face cache"),
    ),
    Case(
        "model-missing-directory",
        "model id",
        "`./models/reader` that does not exist",
        lambda d: resolve_model(str(d / "models" / "reader")),
        ModelUnavailableError,
        ("models/reader", "no such directory"),
    ),
    Case(
        "model-unknown-embedded",
        "model id",
        "`embedded:nope`",
        lambda d: resolve("embedded:nope"),
        ModelUnavailableError,
        ("embedded/nope", "no such directory"),
    ),
    Case(
        "model-bad-registry-uri",
        "model id",
        "`models:/reader` (no version or alias)",
        lambda d: model_location("models:/reader"),
        ModelUnavailableError,
        ("models:/reader", "expected models:/<name>/<version>"),
    ),
    Case(
        "model-missing-package",
        "model id",
        "`package:no_such_module`",
        lambda d: model_location("package:no_such_module"),
        ModelUnavailableError,
        ("package:no_such_module", "not installed"),
    ),
    Case(
        "model-without-tokenizer",
        "model id",
        "an NLI model directory without its tokenizer files",
        nli_without_tokenizer,
        ModelUnavailableError,
        ("nli-model", "has no tokenizer", "save_pretrained"),
    ),
]


def _greedy(experiment: object) -> str:
    assert (experiment.sampling.temperature, experiment.sampling.n) == (0, 1)
    return "greedy decoding, one sample per prompt"


def _parquet(folder: Path, columns: dict) -> Path:
    path = folder / "corpus.parquet"
    pl.DataFrame(columns).write_parquet(path)
    return path


def squad(folder: Path, answers: list | None = None, repeat: bool = False) -> QADataset:
    """A one-article SQuAD file with question ``q1`` (its answers replaced by ``answers``; asked
    again about the second paragraph when ``repeat``), loaded."""
    qa = {
        "id": "q1",
        "question": "Where was Ada born?",
        "answers": [{"text": "Paris"}] if answers is None else answers,
    }
    paragraphs = [
        {"context": "Ada was born in Paris.", "qas": [qa]},
        {"context": "Rome.", "qas": [qa] if repeat else []},
    ]
    path = write(
        folder, "dev.json", json.dumps({"data": [{"title": "Ada", "paragraphs": paragraphs}]})
    )
    return load_dataset(DatasetConfig(name="s", format="squad", path=str(path)))


def questions(folder: Path, records: list[dict], qrels: str | None = None) -> QADataset:
    """NQ-open style ``records`` over the valid corpus (as JSONL with ``id``), judged by ``qrels``
    when given, loaded."""
    corpus = write(folder, "corpus.jsonl", [{"id": r["_id"], "text": r["text"]} for r in CORPUS])
    return load_dataset(
        DatasetConfig(
            name="nq",
            format="qa",
            path=str(write(folder, "nq.jsonl", records)),
            corpus=str(corpus),
            qrels=str(write(folder, "qrels.tsv", qrels)) if qrels else None,
        )
    )


def _beir_without_qrels(folder: Path) -> Path:
    write(folder / "ds", "corpus.jsonl", CORPUS)
    write(folder / "ds", "queries.jsonl", QUERIES)
    return folder / "ds"


def outcome(case: Case, folder: Path) -> str:
    """Run ``case`` under ``folder``, check it, and return what the user sees."""
    if case.error is None:
        return case.accepted(case.run(folder), folder)
    with pytest.raises(case.error) as caught:
        case.run(folder)
    message = str(caught.value)
    for fragment in case.fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "Traceback" not in message
    return message


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input(case: Case, tmp_path: Path) -> None:
    outcome(case, tmp_path)


def test_case_ids_are_distinct() -> None:
    assert len({case.id for case in CASES}) == len(CASES) >= 28


# --- through the CLI: exit status 2, one line on stderr, nothing written ----------------------

CLI_CASES = [
    ("bad-record", ["{records}", "--config", "{config}"], "records.jsonl:2: invalid JSON"),
    ("config-typo", ["{records}", "--config", "{typo}"], "did you mean 'temperature'?"),
    (
        "unknown-generator",
        ["{records}", "--config", "{config}", "--generator", "nope"],
        "--generator 'nope'",
    ),
    (
        "missing-records",
        ["{folder}/none.jsonl", "--config", "{config}"],
        "none.jsonl: no such file",
    ),
]


def run_cli(name: str, argv: list[str], folder: Path) -> tuple[int, str, Path]:
    """``ragutil score`` on the case's files: (exit status, stderr, the --out path)."""
    from ragutil_dagster.cli import main

    paths = {
        "folder": folder,
        "records": write(
            folder, "records.jsonl", [RECORD, "{oops"] if name == "bad-record" else [RECORD]
        ),
        "config": write(folder, "exp.yaml", yaml.safe_dump(CONFIG)),
        "typo": write(
            folder, "typo.yaml", yaml.safe_dump({**CONFIG, "sampling": {"temprature": 1.0}})
        ),
    }
    out = folder / "scores.jsonl"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(
            ["score", *(arg.format(**paths) for arg in argv), "--out", str(out), "--quiet"]
        )
    return status, err.getvalue(), out


@pytest.mark.parametrize(("name", "argv", "fragment"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_reports_one_line_and_exit_2(name, argv, fragment, tmp_path) -> None:
    status, err, out = run_cli(name, argv, tmp_path)
    assert status == 2
    assert err.startswith("ragutil score: error: ") and fragment in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob(".scores.jsonl.*"))


# --- docs/bad_inputs.md -----------------------------------------------------------------------


def markdown_table() -> str:
    """Run every case in a scratch folder and render the table of docs/bad_inputs.md."""
    lines = [
        "# Bad inputs and what the user sees",
        "",
        (
            f"Produced on {datetime.date.today().isoformat()} by running every case of "
            "`tests/reliability/test_bad_inputs.py` (`python3 tests/reliability/test_bad_inputs.py > "
            "docs/bad_inputs.md`); the messages are the real exception texts, with the scratch folder "
            "prefix removed from paths. Every row is a case of `test_bad_input`, which asserts the "
            "exception type and the file / line / field in the message."
        ),
        "",
        (
            "Decisions: blank JSONL lines are skipped (line numbers stay physical); a UTF-8 "
            "byte-order mark at the start of a file is dropped; a 10 MiB passage is accepted at ingest "
            "(chunking cuts it; prompts are truncated at generation time); k larger than the corpus is "
            "an error, not a clamp; `NaN` / `Infinity` are rejected wherever JSON is read; a qrels "
            "line repeating an earlier judgement exactly is kept once, a conflicting one is an error; "
            "temperature 0 is allowed only with n = 1; a run file (`kind: run`) must rank every "
            "question of its dataset unless its retriever sets `missing_queries: empty` (then a question "
            "without a row is scored as a retriever that returned nothing, and counted in the step's "
            "metadata), and its rows for questions that `max_queries` cut are left out (counted in the "
            "step's metadata), not errors."
        ),
        "",
        (
            "Through `ragutil run` these errors are raised inside a Dagster step: the run stops at "
            "that step, which is marked failed in Dagster (with the full traceback in its log), and "
            "the user sees one line naming the step and the error, with exit status 2 "
            "(`test_ragutil_run_reports_a_bad_corpus_in_one_line` in tests/reliability/test_guards.py); "
            "a failure during scoring also leaves the partition's MLflow run FAILED. "
            "`ragutil score` reports them as one line with exit status 2 (below)."
        ),
        "",
        "| case | entry point | example input | what the user sees | where tested |",
        "|---|---|---|---|---|",
    ]
    for case in CASES:
        seen = _in_scratch(lambda folder, case=case: outcome(case, folder))
        kind = "accepted" if case.error is None else f"`{case.error.__name__}`"
        test_id = f"`test_bad_input[{case.id}]`"
        lines.append(f"| {case.id} | {case.entry} | {case.example} | {kind}: {seen} | {test_id} |")
    lines += [
        "",
        (
            "Through the CLI, `ragutil score … --out scores.jsonl`: exit status 2, this one line on "
            "stderr, and no `scores.jsonl` (nor a temporary file) left behind:"
        ),
        "",
        "| case | stderr | where tested |",
        "|---|---|---|",
    ]
    for name, argv, _ in CLI_CASES:
        seen = _in_scratch(
            lambda folder, name=name, argv=argv: run_cli(name, argv, folder)[1].strip()
        )
        lines.append(f"| {name} | `{seen}` | `test_cli_reports_one_line_and_exit_2[{name}]` |")
    return "\n".join(lines) + "\n"


def _in_scratch(run: Callable[[Path], str]) -> str:
    """``run(folder)`` in a fresh scratch folder, its text without the folder's paths, ready for a
    Markdown table cell."""
    folder = Path(tempfile.mkdtemp(prefix="bad-input-"))
    try:
        text = run(folder).replace(f"{folder}/", "").replace(str(folder), ".")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    home = os.environ.get("RAGUTIL_HOME")
    if home:
        text = text.replace(home, "$RAGUTIL_HOME")
    return text.replace("|", "\\|").replace("\n", "<br>")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["RAGUTIL_HOME"] = tempfile.mkdtemp(prefix="ragutil-home-")
    sys.stdout.write(markdown_table())
