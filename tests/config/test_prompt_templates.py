"""Prompt templates the user writes: inline, in a file, in MLflow's prompt registry; per generator;
checked against each role's placeholders; part of the run's identity."""

from __future__ import annotations

import copy
from pathlib import Path

import polars as pl
import pytest
import yaml

from ragutil_dagster import prompts
from ragutil_dagster.config import PromptConfig, load_config, parse_config
from ragutil_dagster.errors import ConfigError, ModelRegistryError
from ragutil_dagster.evaluation.conditions import closed_book_prompts, context_prompts
from ragutil_dagster.infra.prompt_registry import format_syntax, registered_template
from ragutil_dagster.tables import QRELS_SCHEMA
from ragutil_dagster.tracking.keys import prompt_params

BASE = {
    "name": "exp",
    "datasets": [{"name": "world", "format": "synthetic"}],
    "retrievers": [{"name": "bm25", "kind": "bm25"}],
    "k": [1],
    "generators": [
        {"name": "base", "model": "embedded:reader"},
        {"name": "instruct", "model": "embedded:reader", "use_chat_template": True},
    ],
    "nli": {"model": "embedded:nli"},
}
FEW_SHOT = "Question: Who wrote Ode to Rain?\nAnswer: Ila Marsh\n\nQuestion: {question}\nAnswer:"


def config(**changes) -> dict:
    data = copy.deepcopy(BASE)
    data.update(changes)
    return data


def write_config(folder: Path, data: dict) -> Path:
    path = folder / "experiment.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_built_in_names_keep_the_sections_dump_so_todays_keys_stay() -> None:
    # The fingerprint hashes this dump: configs naming built-ins must dump exactly as before.
    assert PromptConfig().model_dump(mode="json", exclude_none=True) == {
        "closed_book": "closed_book",
        "with_context": "with_context",
        "consens": "consens_evaluator",
        "oracle": "mirage",
    }
    named = PromptConfig(closed_book="seper_closed_book", with_context="seper_with_context")
    assert named.model_dump(mode="json", exclude_none=True)["with_context"] == "seper_with_context"
    assert parse_config(config()).generators[0].model_dump(exclude_none=True).get("prompts") is None


def test_a_generator_overrides_only_the_roles_it_names() -> None:
    experiment = parse_config(
        config(
            prompts={"with_context": "seper_with_context"},
            generators=[
                {**BASE["generators"][0], "prompts": {"closed_book": FEW_SHOT}},
                BASE["generators"][1],
            ],
        )
    )
    base, instruct = experiment.prompts_for("base"), experiment.prompts_for("instruct")
    assert base.closed_book == prompts.Template("inline", FEW_SHOT)
    assert base.with_context.source == instruct.with_context.source == "seper_with_context"
    assert instruct.closed_book.source == "closed_book"
    queries = pl.DataFrame({"query_id": ["q1"], "question": ["Where is Vell?"]})
    prompt = closed_book_prompts(queries, base)["prompt"][0]
    assert prompt == FEW_SHOT.format(question="Where is Vell?")
    assert (
        closed_book_prompts(queries, instruct)["prompt"][0] == "Question: Where is Vell?\nAnswer:"
    )
    # Only the overriding generator's partitions read a new slice of the config.
    plain = parse_config(config(prompts={"with_context": "seper_with_context"}))
    assert experiment.partition_fingerprint(["base"]) != plain.partition_fingerprint(["base"])
    assert experiment.partition_fingerprint(["instruct"]) == plain.partition_fingerprint(
        ["instruct"]
    )


def test_a_file_template_is_read_beside_the_config_and_its_text_is_the_identity(
    tmp_path, monkeypatch
) -> None:
    (tmp_path / "prompts").mkdir()
    template = tmp_path / "prompts" / "rag.txt"
    template.write_text(
        "Passages:\n{reference}\n\nQ: {question}\nA:\n", encoding="utf-8"
    )  # an editor's newline
    path = write_config(tmp_path, config(prompts={"with_context": "file:prompts/rag.txt"}))
    monkeypatch.chdir(Path("/"))  # relative to the config's folder, not the working directory
    first = load_config(path)
    assert first.prompts.with_context == prompts.Template(
        "file:prompts/rag.txt", template.read_text()[:-1]
    )
    corpus = pl.DataFrame({"id": ["d1"], "title": [""], "text": ["Vell lies north."]})
    run = pl.DataFrame({"query_id": ["q1"], "doc_id": ["d1"], "rank": [1], "score": [1.0]})
    queries = pl.DataFrame({"query_id": ["q1"], "question": ["Where is Vell?"]})
    table = context_prompts(queries, corpus, run, pl.DataFrame(schema=QRELS_SCHEMA), first.prompts)
    assert (
        table.filter(pl.col("condition") == "rag")["prompt"][0]
        == "Passages:\nDoc 1: Vell lies north.\n\nQ: Where is Vell?\nA:"
    )
    template.write_text("Passages:\n{reference}\nQuestion: {question}\nAnswer:", encoding="utf-8")
    second = load_config(path)
    assert second.fingerprint() != first.fingerprint()
    assert second.partition_fingerprint(["base"]) != first.partition_fingerprint(["base"])
    params = prompt_params(second.prompts_for("base"))
    assert params["prompt_with_context"] == "file:prompts/rag.txt"
    assert (
        params["prompt_template_hash"]
        != prompt_params(first.prompts_for("base"))["prompt_template_hash"]
    )


@pytest.mark.parametrize(
    ("prompt_section", "message"),
    [
        (
            {"closed_book": "Q: {query}\nA:"},
            "prompts.closed_book: the template uses {query}, which role closed_book does not fill; its placeholders: {question}",
        ),
        (
            {"with_context": "Q: {question}\nA:"},
            r"prompts.with_context: the template lacks {reference}, which role with_context needs; its placeholders: "
            r"{question}, {reference}",
        ),
        (
            {"utility_listwise": "{passages} {question} {answer}"},
            "prompts.utility_listwise: the template uses {answer}, which role utility_listwise does not fill; its "
            "placeholders: {num}, {passages}, {question}",
        ),
        ({"closed_book": "Q: {question!r}"}, r"placeholder \{question!r\} is not a plain name"),
        ({"closed_book": "Q: {question"}, "not a valid template"),
        (
            {"closed_book": "sepr_closed_book"},
            "unknown prompt 'sepr_closed_book': name a built-in template",
        ),
        ({"closed_book": "file:missing.txt"}, r"file:missing.txt: no such file"),
        ({"with_context": "seper_closed_book"}, "the template lacks {reference}"),
    ],
)
def test_a_bad_template_is_one_line_naming_the_key_and_the_placeholders(
    tmp_path, prompt_section, message
) -> None:
    path = write_config(tmp_path, config(prompts=prompt_section))
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(path)
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"{path}: invalid experiment config: prompts.")


def test_a_generators_bad_template_names_its_entry_and_multistep_is_the_experiments(
    tmp_path,
) -> None:
    generators = [
        {**BASE["generators"][0], "prompts": {"consens": "{question}"}},
        BASE["generators"][1],
    ]
    with pytest.raises(
        ConfigError, match=r"generators\.0\.prompts\.consens: the template lacks \{reference\}"
    ):
        parse_config(config(generators=generators))
    generators[0]["prompts"] = {"multistep": "{question} {reference}"}
    with pytest.raises(ConfigError, match=r"generators\.0\.prompts\.multistep: unknown key"):
        parse_config(config(generators=generators))


def test_user_templates_fill_every_role() -> None:
    section = {
        "compression": "Shorten for {question}:\n{reference}\nShort:",
        "multistep": "{reference}\nStill missing for {question}:",
        "utility_pointwise": "Is this useful for {question}? {passage}\nYes or No:",
        "utility_ranking_answer": "{num} passages\n{passages}\nRank them for {question} (answer {answer}):",
    }
    experiment = parse_config(config(prompts=section))
    chosen = experiment.prompts_for("instruct")
    assert chosen.labels() == dict.fromkeys(section, "inline")
    passages = [("t", "Vell lies north."), ("t", "Oma lies south.")]
    assert prompts.utility_judgment(
        "ranking_answer", "Where?", passages, "north", chosen.template("utility_ranking_answer")
    ) == (
        "2 passages\n[1] Vell lies north.\n[2] Oma lies south.\nRank them for Where? (answer north):"
    )
    assert prompt_params(chosen)["prompt_other_roles"] == (
        "compression=inline, multistep=inline, utility_pointwise=inline, utility_ranking_answer=inline"
    )
    assert PromptConfig().template("compression") == prompts.builtin("compress_abstractive")


def test_mlflows_double_braces_become_format_fields_and_other_braces_stay_text() -> None:
    assert format_syntax("{{ question }} in {json} {{reference}}", {"question", "reference"}) == (
        "{question} in {{json}} {reference}"
    )
    assert format_syntax("no {fields}", set()) == "no {{fields}}"


@pytest.fixture
def registry(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return MlflowClient(tracking_uri=uri)


def test_registry_versions_and_aliases_are_templates(registry, tmp_path) -> None:
    registry.register_prompt(
        "fewshot", "Q: Who wrote Ode to Rain?\nA: Ila Marsh\nQ: {{ question }}\nA:"
    )
    registry.register_prompt("fewshot", "Q: Where is Vell?\nA: north\nQ: {{question}}\nA:")
    registry.set_prompt_alias("fewshot", "production", 1)
    pinned = parse_config(config(prompts={"closed_book": "prompts:/fewshot/2"}))
    assert pinned.prompts.closed_book.text == "Q: Where is Vell?\nA: north\nQ: {question}\nA:"
    aliased = parse_config(config(prompts={"closed_book": "prompts:/fewshot@production"}))
    assert aliased.prompts.closed_book.version == 1
    assert aliased.prompts.closed_book.label == "prompts:/fewshot@production (version 1)"
    registry.set_prompt_alias("fewshot", "production", 2)
    moved = parse_config(config(prompts={"closed_book": "prompts:/fewshot@production"}))
    assert moved.prompts.closed_book.text == pinned.prompts.closed_book.text
    assert moved.fingerprint() != aliased.fingerprint()
    with pytest.raises(
        ConfigError,
        match=r"prompts.closed_book: prompt 'prompts:/fewshot/9' is not in the MLflow prompt registry",
    ):
        parse_config(config(prompts={"closed_book": "prompts:/fewshot/9"}))
    with pytest.raises(ModelRegistryError, match="expected prompts:/<name>/<version>"):
        registered_template("prompts:/fewshot")
    registry.register_prompt("chat", [{"role": "user", "content": "{{question}}"}])
    with pytest.raises(ConfigError, match="is a chat prompt"):
        parse_config(config(prompts={"closed_book": "prompts:/chat/1"}))
    registry.register_prompt("wrong", "Tell me about {{ topic }}")
    with pytest.raises(ConfigError, match=r"uses \{topic\}, which role closed_book does not fill"):
        parse_config(config(prompts={"closed_book": "prompts:/wrong/1"}))
