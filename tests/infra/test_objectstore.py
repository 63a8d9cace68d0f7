"""The artifact store's commit protocol, on local disk and on an S3-compatible server (moto on
127.0.0.1): readers see only published manifests, a failed or killed writer leaves nothing
visible, a newer version replaces the older whole, and files that must be on disk are fetched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import polars as pl
import pyarrow.parquet as pq
import pytest

from ragutil_dagster.errors import ArtifactStoreError, ArtifactWriteError
from ragutil_dagster.infra.failpoints import ENV
from ragutil_dagster.infra.objectstore import ARTIFACTS_URL_VARIABLE, MANIFEST_SUFFIX, ObjectStore
from ragutil_dagster.resources import ArtifactStore
from ragutil_dagster.resources.storage import _parquet_rows


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path) -> ArtifactStore:
    """An empty artifact store: ``$RAGUTIL_HOME/artifacts`` or a fresh prefix of the moto bucket."""
    if request.param == "local":
        return ArtifactStore(home=str(tmp_path / "home"))
    server = request.getfixturevalue("s3_environment")
    return ArtifactStore(
        home=str(tmp_path / "home"), url=f"s3://{server.bucket}/{uuid.uuid4().hex}"
    )


def objects(store: ArtifactStore, folder: str) -> set[str]:
    """Every key under ``folder`` of the store, relative to it (what a reader could ever list)."""
    objects = store._objects
    root = objects._path(folder)
    return {path.removeprefix(root + "/") for path in objects.fs.find(root)}


def kill_a_writer(store: ArtifactStore, point: str = "publish") -> None:
    """A process writing table ``scores[p]``, SIGKILLed at failpoint ``point``: ``publish``, between
    its uploaded object and its manifest; ``parquet_write``, once the table is written (on an
    object store: staged, not uploaded)."""
    code = (
        "import sys, polars as pl; from ragutil_dagster.resources import ArtifactStore; "
        "ArtifactStore(home=sys.argv[1], url=sys.argv[2]).write_table('scores', 'p', pl.DataFrame({'x': [2]}))"
    )
    env = {**os.environ, ENV: point}
    killed = subprocess.run(
        [sys.executable, "-c", code, store.home, store.url], env=env, check=False, timeout=120
    )
    assert killed.returncode == -signal.SIGKILL


def test_tables_and_records_round_trip_and_a_new_version_replaces_the_old(
    store: ArtifactStore,
) -> None:
    first, second = pl.DataFrame({"x": [1, 2]}), pl.DataFrame({"x": [3], "y": ["a"]})
    old = store.write_table("scores", "lm|world__bm25__k1", first)
    assert store.read_table("scores", "lm|world__bm25__k1").equals(first)
    new = store.write_table("scores", "lm|world__bm25__k1", second)
    assert new != old and store.read_table("scores", "lm|world__bm25__k1").equals(second)
    store.write_json("scores", "lm|world__bm25__k1", "summary", {"a": 1.5})
    assert store.read_json("scores", "lm|world__bm25__k1", "summary") == {"a": 1.5}
    # The old object is gone: one manifest and one object per artifact.
    version = new.rsplit("/", 2)[-2]
    assert objects(store, "scores/lm__gen__world__bm25__k1") == {
        f"table.parquet{MANIFEST_SUFFIX}",
        f"{version}/table.parquet",
        f"summary.json{MANIFEST_SUFFIX}",
        f"{store.location('scores', 'lm|world__bm25__k1', 'summary.json').rsplit('/', 1)[-1]}/summary.json",
    }
    store.delete_table("scores", "lm|world__bm25__k1")
    assert not store.has_table("scores", "lm|world__bm25__k1")
    with pytest.raises(FileNotFoundError, match="materialise scores first"):
        store.read_table("scores", "lm|world__bm25__k1")


def test_a_row_range_of_a_table_is_read_from_the_row_groups_holding_it(
    store: ArtifactStore, tmp_path, monkeypatch
) -> None:
    table = pl.DataFrame({"row": list(range(1000)), "text": [f"passage {i}" for i in range(1000)]})
    store.write_table("corpus", "world", table)
    for rows in (range(1000), range(250, 500), range(999, 1000), range(990, 1010), range(5, 5)):
        assert store.read_table("corpus", "world", rows=rows).equals(table[rows.start : rows.stop])
    # Of a file in row groups of 100 rows, rows 250–499 need groups 2, 3 and 4 only.
    path = tmp_path / "grouped.parquet"
    table.write_parquet(path, row_group_size=100)
    fetched: list[list[int]] = []
    read_row_groups = pq.ParquetFile.read_row_groups
    monkeypatch.setattr(
        pq.ParquetFile,
        "read_row_groups",
        lambda self, groups, *args, **kwargs: (
            fetched.append(list(groups)) or read_row_groups(self, groups, *args, **kwargs)
        ),
    )
    with path.open("rb") as handle:
        assert _parquet_rows(handle, range(250, 500)).equals(table[250:500])
    assert fetched == [[2, 3, 4]]
    with path.open("rb") as handle, pytest.raises(ValueError, match="contiguous"):
        _parquet_rows(handle, range(0, 10, 2))


def test_a_failed_writer_publishes_nothing_and_keeps_the_previous_version(
    store: ArtifactStore,
) -> None:
    store.write_table("scores", "p", pl.DataFrame({"x": [1]}))
    before = objects(store, "scores/p")
    with pytest.raises(RuntimeError, match="died"):
        with store.write_files("scores", "p", "table.parquet") as staging:
            pl.DataFrame({"x": [2]}).write_parquet(staging / "table.parquet")
            raise RuntimeError("writer died")
    assert store.read_table("scores", "p")["x"].to_list() == [1]
    assert objects(store, "scores/p") == before


@pytest.mark.slow
def test_a_killed_writer_leaves_no_visible_output(store: ArtifactStore) -> None:
    """SIGKILL after the table's object is written, before its manifest (the ``parquet_write``
    failpoint): readers still see the previous version."""
    store.write_table("scores", "p", pl.DataFrame({"x": [1]}))
    for point in ("parquet_write", "publish"):
        kill_a_writer(store, point)
        assert store.read_table("scores", "p")["x"].to_list() == [1]


def test_multi_file_artifacts_are_fetched_to_local_disk(store: ArtifactStore) -> None:
    with store.write_files("index", "world__dense", "index") as staging:
        (staging / "manifest.json").write_text("{}")
        (staging / "vectors").mkdir()
        (staging / "vectors" / "part-0.npy").write_bytes(b"\x93NUMPY" + bytes(100))
    local = store.local_files("index", "world__dense", "index")
    assert sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()) == [
        "manifest.json",
        "vectors/part-0.npy",
    ]
    assert (local / "vectors" / "part-0.npy").stat().st_size == 106
    assert (
        store.local_files("index", "world__dense", "index") == local
    )  # one copy per published object


@pytest.mark.slow
def test_clean_finds_only_what_nothing_needs_and_deletes_it(store: ArtifactStore) -> None:
    store.write_table("scores", "p", pl.DataFrame({"x": [1]}))
    kill_a_writer(store)  # leaves its unpublished object
    kill_a_writer(store, "parquet_write")  # on an object store, leaves its staged files
    with store.write_files("index", "world__dense", "index") as staging:
        (staging / "vectors.npy").write_bytes(bytes(100))
    old_copy = store.local_files("index", "world__dense", "index")
    with store.write_files("index", "world__dense", "index") as staging:
        (staging / "vectors.npy").write_bytes(bytes(50))
    current_copy = store.local_files("index", "world__dense", "index")
    # MLflow's run artifacts under the same URL are never taken for ragutil's objects.
    mlflow_file = store._objects._path("mlruns", "1", f"model.{'a' * 32}", "MLmodel")
    store._objects.fs.makedirs(os.path.dirname(mlflow_file), exist_ok=True)
    store._objects.fs.pipe_file(mlflow_file, b"x")
    scratch = store.scratch_directory("passage_embeddings", "world__dense")
    for version, age in (("0ld", 7200), ("new", 3600)):
        (scratch / version).mkdir(parents=True)
        (scratch / version / "embeddings.npy").write_bytes(bytes(10))
        moment = time.time() - age
        for path in (scratch / version / "embeddings.npy", scratch / version):
            os.utime(path, (moment, moment))

    assert [
        (g.reason, g.size)
        for g in store.garbage(older_than=1800)
        if "scratch" in g.location or "unpublished" in g.reason
    ] == [
        ("superseded working files (a newer version is beside them)", 10)
    ]  # the dead writer's object is fresh: spared
    found = store.garbage(older_than=0, now=time.time() + 1)
    reasons = sorted(g.reason.split(" (")[0] for g in found)
    remote = not store._objects.local
    # Locally both writers leave an object; remotely, both their staged files, and one its upload.
    assert reasons == sorted(
        ["unpublished object", "superseded working files"]
        + (
            ["local copy of a replaced or removed object"]
            + ["staged files of a writer that died before uploading"] * 2
            if remote
            else ["unpublished object"]
        )
    )
    assert all("mlruns" not in g.location for g in found)
    assert all(
        "/scores/p/table.parquet." in g.location and g.size > 0
        for g in found
        if g.reason.startswith("unpublished")
    )
    if remote:
        assert (
            next(g.path for g in found if g.reason.startswith("local copy"))
            == str(old_copy)
            != str(current_copy)
        )
    for item in found:
        store.delete(item)
    assert store.garbage(older_than=0, now=time.time() + 1) == []
    assert store.read_table("scores", "p")["x"].to_list() == [1]
    assert (
        store.local_files("index", "world__dense", "index") / "vectors.npy"
    ).stat().st_size == 50
    assert sorted(p.name for p in scratch.iterdir()) == ["new"]
    assert store._objects.fs.exists(mlflow_file)


def test_folders_are_listed_with_their_size_and_last_publication(store: ArtifactStore) -> None:
    assert store.folders("reports") == []
    start = int(time.time()) - 1  # an object store's times are in whole seconds
    with store.write_files("reports", "a", "summary") as staging:
        (staging / "summary.csv").write_bytes(bytes(10))
    with store.write_files("reports", "a", "world/comparison") as staging:
        (staging / "runs.csv").write_bytes(bytes(5))
    dead_writer = store._objects._path("reports", "b", f"summary.{'0' * 32}", "summary.csv")
    store._objects.fs.makedirs(os.path.dirname(dead_writer), exist_ok=True)
    store._objects.fs.pipe_file(dead_writer, bytes(7))
    store._objects.fs.pipe_file(
        store._objects._path("reports", f"old{MANIFEST_SUFFIX}"), b"{}"
    )  # beside the folders

    published, unpublished = store.folders("reports")
    assert (published.name, unpublished.name) == ("a", "b")
    assert published.path == store._objects._path("reports", "a") and published.location.endswith(
        "/reports/a"
    )
    manifests = sum(
        len(
            store._objects.fs.cat_file(store._objects._path("reports", "a", name + MANIFEST_SUFFIX))
        )
        for name in ("summary", "world/comparison")
    )
    assert published.size == 15 + manifests
    assert start <= published.published <= published.modified <= time.time() + 1
    assert (unpublished.size, unpublished.published) == (7, None) and unpublished.modified >= start


def test_a_reader_racing_a_writer_reads_the_newer_version(
    store: ArtifactStore, monkeypatch
) -> None:
    """The object a reader's manifest named is deleted by a newer writer before the reader opens
    it: the reader follows the newer manifest instead of failing or mixing versions."""
    store.write_table("scores", "p", pl.DataFrame({"x": [1]}))
    objects = store._objects
    fs = objects.fs
    opened = fs.open

    def open_after_a_newer_write(path, *args, **kwargs):
        monkeypatch.setattr(fs, "open", opened)
        store.write_table("scores", "p", pl.DataFrame({"x": [2]}))
        return opened(path, *args, **kwargs)

    monkeypatch.setattr(fs, "open", open_after_a_newer_write)
    assert objects.read("scores/p/table.parquet", pl.read_parquet)["x"].to_list() == [2]


def test_a_missing_bucket_is_one_clear_error(s3_environment, tmp_path) -> None:
    store = ArtifactStore(home=str(tmp_path), url="s3://no-such-bucket/ragutil")
    with pytest.raises(
        ArtifactWriteError,
        match=r"cannot write s3://no-such-bucket/ragutil/scores/p/table.parquet.*create the bucket",
    ):
        store.write_table("scores", "p", pl.DataFrame({"x": [1]}))


def test_an_unknown_scheme_is_one_clear_error(tmp_path) -> None:
    with pytest.raises(ArtifactStoreError, match=rf"nosuch://bucket/x.*{ARTIFACTS_URL_VARIABLE}"):
        ObjectStore("nosuch://bucket/x", tmp_path)
