"""Guards of issue 9: prompts fitted to the generator's context by the documented rule, empty and
non-finite generations reported per query, storage failures named clearly, secrets masked, and a
failed step of ``ragutil run`` reported in one line."""

from __future__ import annotations

import errno
import math
from pathlib import Path

import polars as pl
import pytest

from ragutil_dagster import prompts as templates
from ragutil_dagster.config import PromptConfig
from ragutil_dagster.errors import ArtifactWriteError, PromptTooLongError, StepFailedError
from ragutil_dagster.evaluation.conditions import (
    PromptBudget,
    closed_book_prompts,
    context_prompts,
    fit_context_prompt,
)
from ragutil_dagster.evaluation.prompt_sampling import generation_issues
from ragutil_dagster.evaluation.signals import passage_spans
from ragutil_dagster.infra.redaction import redact, redact_uri
from ragutil_dagster.models.hf_backend import HFGenerator
from ragutil_dagster.resources.storage import ArtifactStore
from ragutil_dagster.sampling import SamplingParams

TEMPLATE = PromptConfig().with_context


def words(prompts: list[str]) -> list[int]:
    """A stand-in tokenizer: one token per whitespace-separated word."""
    return [len(p.split()) for p in prompts]


def docs(*texts: str) -> list[tuple[str, str, str]]:
    return [(f"d{i}", "", text) for i, text in enumerate(texts)]


def test_a_prompt_that_fits_is_left_alone() -> None:
    fitted = fit_context_prompt(
        "q", "Who?", docs("a b c", "d e"), TEMPLATE, PromptBudget(100, words)
    )
    assert fitted.prompt == templates.with_context("Who?", [("", "a b c"), ("", "d e")], TEMPLATE)
    assert (fitted.doc_ids, fitted.passages_dropped, fitted.last_passage_chars) == (
        ["d0", "d1"],
        0,
        None,
    )


def test_passages_are_dropped_from_the_end_first() -> None:
    three = docs("one two three", "four five six", "seven eight nine")
    full = words([templates.with_context("Who?", [("", t) for _, _, t in three], TEMPLATE)])[0]
    fitted = fit_context_prompt("q", "Who?", three, TEMPLATE, PromptBudget(full - 3, words))
    assert fitted.doc_ids == ["d0", "d1"] and fitted.passages_dropped == 1
    assert fitted.last_passage_chars is None and "seven" not in fitted.prompt


def test_the_last_passage_is_cut_after_the_most_whole_words_that_fit() -> None:
    text = " ".join(f"w{i}" for i in range(1000))
    empty = words([templates.with_context("Who?", [("", "")], TEMPLATE)])[0]
    budget = PromptBudget(empty + 37, words)
    fitted = fit_context_prompt("q", "Who?", docs(text, "second passage"), TEMPLATE, budget)
    assert fitted.doc_ids == ["d0"] and fitted.passages_dropped == 1
    assert fitted.last_passage_chars == len(" ".join(f"w{i}" for i in range(37)))
    assert words([fitted.prompt])[0] == budget.max_tokens
    kept = text[: fitted.last_passage_chars]
    assert passage_spans(fitted.prompt, [kept])  # the signals find the cut passage in the prompt


def test_a_question_longer_than_the_budget_is_an_error_naming_the_query() -> None:
    question = "why " * 50
    with pytest.raises(
        PromptTooLongError, match=r"query 'q7'.*no room for any passage.*budget of 20"
    ):
        fit_context_prompt("q7", question, docs("a"), TEMPLATE, PromptBudget(20, words))
    queries = pl.DataFrame({"query_id": ["q7"], "question": [question]})
    with pytest.raises(PromptTooLongError, match="'q7'"):
        closed_book_prompts(queries, PromptConfig(), PromptBudget(20, words))


def test_a_10_mb_passage_is_cut_to_the_real_generators_context(tiny_world) -> None:
    _, _, models = tiny_world
    generator = HFGenerator(str(models.causal_lm), device="cpu", show_progress=False)
    budget = PromptBudget.of(generator, max_new_tokens=8)
    assert budget is not None and budget.max_tokens == generator.context_length - 8
    huge = "lorem ipsum dolor sit amet " * 400_000  # 10.8 MB
    queries = pl.DataFrame({"query_id": ["q1"], "question": ["What is lorem?"]})
    corpus = pl.DataFrame({"id": ["big", "small"], "title": ["", ""], "text": [huge, "small text"]})
    run = pl.DataFrame({"query_id": ["q1", "q1"], "doc_id": ["big", "small"], "rank": [1, 2]})
    qrels = pl.DataFrame(schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32})
    table = context_prompts(queries, corpus, run, qrels, PromptConfig(), budget)
    rag = table.filter(pl.col("condition") == "rag").row(0, named=True)
    assert (
        rag["doc_ids"] == ["big"] and rag["passages_dropped"] == 1 and rag["last_passage_chars"] > 0
    )
    lengths = generator.count_prompt_tokens(table["prompt"].to_list())
    assert max(lengths) <= budget.max_tokens
    samples = generator.sample(table["prompt"].to_list(), SamplingParams(n=1, max_new_tokens=8))
    assert all(len(s[0].token_ids) <= 8 for s in samples)


def test_empty_and_non_finite_generations_are_reported_per_query() -> None:
    rows = pl.DataFrame(
        {
            "query_id": ["a", "a", "b", "b", "c"],
            "condition": ["rag", "rag", "closed_book", "closed_book", "rag"],
            "text": ["Paris", "  ", "x", "y", "z"],
            "token_logprobs": [[-0.1], [], [math.nan, -1.0], [-0.2], [-math.inf]],
        }
    )
    issues = generation_issues(rows)
    assert issues.rows() == [
        ("a", "rag", 1, 0, 2),
        ("b", "closed_book", 0, 1, 2),
        ("c", "rag", 0, 1, 1),
    ]
    assert generation_issues(rows.filter(pl.col("query_id") == "zzz")).height == 0


@pytest.mark.parametrize(
    ("code", "advice"),
    [
        (errno.ENOSPC, "free disk space"),
        (errno.EACCES, "permissions"),
        (errno.EROFS, "permissions"),
    ],
)
def test_storage_failures_name_the_file_and_leave_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, advice: str
) -> None:
    store = ArtifactStore(home=str(tmp_path))
    store.write_table("scores", "p", pl.DataFrame({"x": [1]}))

    def failing_write(self, path, *args, **kwargs):
        Path(path).write_bytes(b"half a table")
        raise OSError(code, "injected")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", failing_write)
    with pytest.raises(
        ArtifactWriteError, match=rf"cannot write .*scores/p/table.parquet.*{advice}"
    ):
        store.write_table("scores", "p", pl.DataFrame({"x": [2]}))
    monkeypatch.undo()
    assert store.read_table("scores", "p")["x"].to_list() == [1]  # the previous version survives
    published = Path(store.location("scores", "p", "table.parquet"))
    assert sorted(published.parent.iterdir()) == sorted(
        [published, published.parent / "table.parquet.manifest.json"]
    )


def test_credentials_are_masked_in_uris_and_free_text() -> None:
    assert redact_uri("https://bob:s3cret@mlflow.example.com/api?x=1&token=abc") == (
        "https://bob:***@mlflow.example.com/api?x=1&token=***"
    )
    assert redact_uri("https://ghp_abc@host/") == "https://***@host/"
    assert redact_uri("sqlite:////tmp/home/mlflow.db") == "sqlite:////tmp/home/mlflow.db"
    text = redact("stored in postgresql://u:pw@db/mlflow, see s3://b/k?X-Amz-Signature=zz&a=b")
    assert "pw" not in text and "zz" not in text and "postgresql://u:***@db/mlflow" in text


def test_mlflow_params_and_display_uri_carry_no_password(tmp_path: Path) -> None:
    from ragutil_dagster.tracking import MlflowTracking

    tracking = MlflowTracking(
        home=str(tmp_path), tracking_uri="https://alice:hunter2@mlflow.internal"
    )
    assert "hunter2" not in tracking.display_uri and "hunter2" in tracking.uri
    assert "hunter2" not in tracking.run_url("1", "abc")
    local = MlflowTracking(home=str(tmp_path))
    with local.run("exp", "key-1", "run", "partition", {}) as run:
        run.log_params({"store": "postgresql://u:hunter2@db/x", "model": "org/model"})
    params = local.client().get_run(run.run_id).data.params
    assert params == {"store": "postgresql://u:***@db/x", "model": "org/model"}


class _Error:
    """The fields of Dagster's SerializableErrorInfo that StepFailedError reads."""

    def __init__(self, cls_name: str, message: str, cause: _Error | None = None) -> None:
        self.cls_name, self.message, self.cause, self.context = cls_name, message, cause, None


def test_a_failed_step_names_the_user_error_under_dagsters_wrapping() -> None:
    inner = _Error("CorpusValidationError", "corpus.jsonl:3: field 'text': empty text\n")
    wrapped = _Error(
        "DagsterExecutionStepExecutionError", "Error occurred while executing op", inner
    )
    err = StepFailedError("corpus[world]", "run-1", wrapped)
    assert err.user_error and err.cause_type == "CorpusValidationError"
    assert str(err).startswith(
        "corpus[world] failed: CorpusValidationError: corpus.jsonl:3: field 'text'"
    )
    bug = StepFailedError(
        "metric_scores[x]",
        "run-2",
        _Error("Wrapper", "w", _Error("ZeroDivisionError", "division by zero")),
    )
    assert not bug.user_error and "ZeroDivisionError: division by zero" in str(bug)


def test_ragutil_run_reports_a_bad_corpus_in_one_line(
    tiny_world, make_tiny_config, tmp_path, monkeypatch
) -> None:
    import contextlib
    import io
    import shutil

    import yaml

    from ragutil_dagster.cli import main

    _, world, models = tiny_world
    broken = tmp_path / "world"
    shutil.copytree(world, broken)
    lines = (broken / "corpus.jsonl").read_text().splitlines()
    lines[1] = lines[1][:25]  # a record cut off mid-way
    (broken / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(make_tiny_config(models, broken)))
    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(["run", str(config), "--quiet"])
    message = err.getvalue()
    assert status == 2, message
    assert message.startswith(
        "ragutil run: error: queries+corpus[world] failed: CorpusValidationError: "
    )
    assert "corpus.jsonl:2: invalid JSON" in message and message.count("\n") == 1
    assert not (tmp_path / "home" / "artifacts" / "corpus").exists()
