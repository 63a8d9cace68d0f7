"""The ``openai`` backend against a real vLLM server of SmolLM2 (``vllm_server``), a fleet of two
(a second server started here and killed mid-sampling) and, for bad input and the fleet's routing,
against tiny fake servers on 127.0.0.1 (down, failing then recovering, answering without log-probs
or with malformed JSON, dropping the connection mid-run, busy, slow, configured otherwise).

The real-server tests compare the server's log-probs with a teacher-forced HF float32 pass over
the same token ids. Measured on a 2-core AVX-512 CPU (float32 both sides): sampled tokens, 286
over seeds 7-9, largest |server - HF| 3.6e-5 (mean 5.5e-6); prompt log-probs, 12 answer tokens,
largest 2.1e-5; against the in-process vLLM engine, same tokens and largest 2.4e-5. On a 2-core
AMD EPYC with AVX512-BF16 (CI, 2026-11-29) the sampled tokens' largest was 1.06e-4, past the 1e-4
this file had: the server's bound is now the in-process engine's (test_generation_contract).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from ragutil_dagster.errors import (
    CapabilityMissingError,
    MissingAPIKeyError,
    MissingLogprobsError,
    ServerResponseError,
    ServerUnavailableError,
    UserError,
)
from ragutil_dagster.infra.processes import free_port
from ragutil_dagster.models.cache import CachedGenerator, GenerationCache
from ragutil_dagster.models.generation import Generator, Sample
from ragutil_dagster.models.openai_backend import OpenAIGenerator, OpenAITokenScorer
from ragutil_dagster.models.openai_backend_config import ServerConfig
from ragutil_dagster.models.token_scoring import TokenScorer
from ragutil_dagster.sampling import SamplingParams

from .test_generation_contract import LOGPROB_TOLERANCE as BACKEND_LOGPROB_TOLERANCE

LOGPROB_TOLERANCE = BACKEND_LOGPROB_TOLERANCE["openai"]
PROMPTS = [
    "What is the capital of France?",
    "Name a primary colour.",
    "Who wrote Romeo and Juliet?",
    "How many legs does a spider have?",
]
PARAMS = SamplingParams(n=3, temperature=1.0, max_new_tokens=8, stop=("\n",), seed=7)
FAST_RETRIES = {"max_retries": 2, "retry_backoff": 0.01, "timeout": 30.0}


# ---------------------------------------------------------------- against the real vLLM server


@pytest.fixture(scope="module")
def served(vllm_server) -> OpenAIGenerator:
    """SmolLM2 on the session's vLLM server, prompts tokenised locally with its chat template."""
    return OpenAIGenerator(
        vllm_server.base_url,
        vllm_server.model,
        tokenizer=str(vllm_server.model_dir),
        use_chat_template=True,
        prompt_logprob_metrics=("consens",),
        show_progress=False,
    )


@pytest.fixture(scope="module")
def hf_reference(vllm_server) -> TokenScorer:
    """The same weights in HF float32 on CPU, same prompt formatting: the teacher-forced pass."""
    return TokenScorer(
        str(vllm_server.model_dir),
        device="cpu",
        dtype="float32",
        use_chat_template=True,
        show_progress=False,
    )


def test_contract(served: OpenAIGenerator, vllm_server) -> None:
    out = served.sample(PROMPTS[:3], PARAMS)
    assert isinstance(served, Generator)
    assert served.context_length == vllm_server.max_model_len
    assert [len(per) for per in out] == [PARAMS.n] * 3
    for per, tokens in zip(out, served.count_prompt_tokens(PROMPTS[:3]), strict=True):
        for s in per:
            assert 1 <= len(s.token_ids) == len(s.token_logprobs) <= PARAMS.max_new_tokens
            assert all(lp <= 0 for lp in s.token_logprobs)
            assert s.finish_reason == "stop" or len(s.token_ids) == PARAMS.max_new_tokens
            assert "\n" not in s.text and s.prompt_tokens == tokens
    assert_same_samples(served.sample(PROMPTS[:3], PARAMS), out)  # same seed
    assert_same_samples(served.sample(PROMPTS[1:2], PARAMS), out[1:2])  # batch-mates don't matter
    other_seed = served.sample(PROMPTS[:3], dataclasses.replace(PARAMS, seed=PARAMS.seed + 1))
    assert [s.token_ids for per in other_seed for s in per] != [
        s.token_ids for per in out for s in per
    ]


def assert_same_samples(got: list[list[Sample]], expected: list[list[Sample]]) -> None:
    """Same tokens, text and finish; log-probs equal up to LOGPROB_TOLERANCE. A server batches
    concurrent requests as they arrive, and batch shapes move float results in the last bits."""
    assert [
        [(s.text, s.token_ids, s.finish_reason, s.prompt_tokens) for s in per] for per in got
    ] == [
        [(s.text, s.token_ids, s.finish_reason, s.prompt_tokens) for s in per] for per in expected
    ]
    gaps = [
        abs(a - b)
        for g, e in zip(got, expected, strict=True)
        for x, y in zip(g, e, strict=True)
        for a, b in zip(x.token_logprobs, y.token_logprobs, strict=True)
    ]
    assert max(gaps) <= LOGPROB_TOLERANCE


def test_server_agrees_with_the_in_process_engine(vllm_server, vllm_engine) -> None:
    """Same weights, prompts as token ids and seeds: the server and the in-process vLLM engine
    (eager, float32) draw the same tokens, with log-probs equal up to LOGPROB_TOLERANCE."""
    plain = OpenAIGenerator(
        vllm_server.base_url,
        vllm_server.model,
        tokenizer=str(vllm_server.model_dir),
        show_progress=False,
    )
    assert_same_samples(plain.sample(PROMPTS, PARAMS), vllm_engine.sample(PROMPTS, PARAMS))


def test_settings_are_stable_and_secret_free(served: OpenAIGenerator, vllm_server) -> None:
    assert served.settings == {
        "backend": "openai",
        "identity": served.identity,
        "prompt_format": "token_ids",
        "chat_template": True,
        "system_prompt": None,
        "server": served.server_fingerprint,
    }
    assert served.server_fingerprint.startswith("vllm-")  # vLLM's version and config hash
    assert vllm_server.model in served.identity and str(vllm_server.model_dir) in served.identity
    pinned = OpenAIGenerator(
        vllm_server.base_url, vllm_server.model, identity="sha256:pinned", show_progress=False
    )
    assert pinned.identity == pinned.settings["identity"] == "sha256:pinned"


def test_sampled_logprobs_agree_with_hf(served: OpenAIGenerator, hf_reference: TokenScorer) -> None:
    out = served.sample(PROMPTS, PARAMS)
    prompt_ids = served.encode_prompts(PROMPTS)
    pairs = [(prompt_ids[i], s) for i, per in enumerate(out) for s in per]
    reference = hf_reference.score_ids([p for p, _ in pairs], [s.token_ids for _, s in pairs])
    gaps = [
        np.abs(np.asarray(s.token_logprobs) - ref).max()
        for (_, s), ref in zip(pairs, reference, strict=True)
    ]
    assert max(gaps) <= LOGPROB_TOLERANCE, f"largest |server - HF| = {max(gaps):.2e}"


def test_prompt_logprobs_agree_with_hf(served: OpenAIGenerator, hf_reference: TokenScorer) -> None:
    answers = [" Paris.", " Red.", " William Shakespeare wrote it.", " Eight legs."]
    scorer = OpenAITokenScorer(served)
    got = scorer.score(PROMPTS, answers)
    expected = hf_reference.score(PROMPTS, answers)
    for g, e in zip(got, expected, strict=True):
        assert (g.token_ids, g.tokens, g.word_ids, g.prompt_tokens) == (
            e.token_ids,
            e.tokens,
            e.word_ids,
            e.prompt_tokens,
        )
        assert np.abs(np.asarray(g.token_logprobs) - e.token_logprobs).max() <= LOGPROB_TOLERANCE
    assert scorer.score_ids([[1]], [[]])[0].size == 0


def test_attention_utility_is_reported_unavailable(served: OpenAIGenerator) -> None:
    scorer = OpenAITokenScorer(served)
    assert not scorer.supports_attention and "attention" in scorer.attention_unavailable
    with pytest.raises(CapabilityMissingError, match="attention_utility"):
        scorer.passage_attention(PROMPTS[:1], [" Paris."], [[(0, 4)]])


def test_resume_after_the_server_died(served: OpenAIGenerator, vllm_server, tmp_path) -> None:
    """The server dies after the first checkpoint: its samples stay stored, nothing of the
    second is stored, and a resumed run samples only the second, giving an uninterrupted run's
    samples."""
    proxy = Forwarding(vllm_server.base_url, completions_budget=3)  # probe + first checkpoint
    cache = GenerationCache(tmp_path / "generations")
    with fake_server(proxy.respond) as url:
        dying = OpenAIGenerator(
            url,
            vllm_server.model,
            tokenizer=str(vllm_server.model_dir),
            use_chat_template=True,
            show_progress=False,
            **FAST_RETRIES,
        )
        with pytest.raises(ServerUnavailableError, match=r"prompt \d"):
            CachedGenerator(dying, cache, checkpoint_prompts=2).sample(PROMPTS, PARAMS)
    assert len(cache) == 2
    resumed = CachedGenerator(served, cache, checkpoint_prompts=2)
    assert resumed.settings == dying.settings, "the server's address is not part of the cache key"
    assert_same_samples(resumed.sample(PROMPTS, PARAMS), served.sample(PROMPTS, PARAMS))
    assert (resumed.stats.hits, resumed.stats.misses) == (2, 2)


@pytest.fixture(scope="module")
def second_replica(vllm_server, smollm2_server_launcher, tmp_path_factory):
    """A second vLLM server of SmolLM2 beside the session's, started like it, for a test to kill."""
    log = tmp_path_factory.mktemp("vllm-replica") / "server.log"
    with smollm2_server_launcher(vllm_server.model_dir, log) as replica:
        yield replica


FLEET_QUESTIONS = [
    f"In one sentence, what is {thing}?"
    for thing in (
        "a river",
        "a volcano",
        "a library",
        "a comet",
        "a violin",
        "a glacier",
        "a lighthouse",
        "a desert",
        "an orchestra",
        "a bridge",
        "a forest",
        "a harbour",
    )
]


def test_a_fleet_survives_a_replica_killed_mid_sampling(vllm_server, second_replica) -> None:
    """Two vLLM servers of SmolLM2; once either has answered a sampling request while the
    second is working on one, the second is killed (SIGKILL to its process group, by PID): its
    request in flight fails and is retried on the first. The run ends on the first, with the
    samples of a one-server run of the same seeded requests."""
    second, process = second_replica
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=24, stop=(), seed=13)
    options = {
        "tokenizer": str(vllm_server.model_dir),
        "use_chat_template": True,
        "show_progress": False,
        "max_retries": 2,
        "retry_backoff": 0.01,
    }
    fleet = OpenAIGenerator(
        [vllm_server.base_url, second.base_url], vllm_server.model, max_concurrency=2, **options
    )
    probes = [replica.answered for replica in fleet.client.status()]
    sampled = threading.Event()
    at_kill: list[int] = []

    def kill_the_second_mid_request() -> None:
        while not sampled.is_set():
            # Whichever replica is slower (CPU contention decides), some answer comes early
            # and the second holds a request from then on until it is killed: waiting for a
            # given replica's answer raced the end of the run in CI, once for each replica.
            status = fleet.client.status()
            answered = sum(r.answered - p for r, p in zip(status, probes, strict=True))
            if answered >= 1 and status[1].outstanding >= 1:
                at_kill.extend(r.answered - p for r, p in zip(status, probes, strict=True))
                os.killpg(process.pid, signal.SIGKILL)
                return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_the_second_mid_request, daemon=True)
    killer.start()
    try:
        out = fleet.sample(FLEET_QUESTIONS, params)
    finally:
        sampled.set()
        killer.join()
    assert at_kill, "the second replica was not killed while sampling ran"
    first, killed = fleet.client.status()
    assert process.wait(timeout=60) == -signal.SIGKILL
    assert not killed.healthy and killed.failed >= 1
    assert first.answered - probes[0] > at_kill[0]  # the first went on after the kill
    assert first.answered - probes[0] + killed.answered - probes[1] == len(FLEET_QUESTIONS)
    single = OpenAIGenerator(vllm_server.base_url, vllm_server.model, **options)
    assert_same_samples(out, single.sample(FLEET_QUESTIONS, params))


# ------------------------------------------------------------------ fake servers for bad input


Responder = Callable[[str, str, dict, dict], "tuple[int, bytes] | None"]


@contextmanager
def fake_server(respond: Responder, port: int = 0) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 (``port``, or a free one) answering with ``respond(method,
    path, body, headers) -> (status, body bytes)``; None stops the server, then drops the
    connection (a server dying mid-request: later requests are refused). Yields the base URL."""
    stopped, lock = [], threading.Lock()

    def stop() -> None:
        with lock:
            if not stopped:
                stopped.append(True)
                server.shutdown()
                server.server_close()

    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(respond, stop))
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop()
        thread.join()


def _handler(respond: Responder, stop: Callable[[], None]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else {}
            answer = respond(method, self.path, body, dict(self.headers))
            if answer is None:
                stop()  # from a request thread, not the serving one: shutdown() can return
                self.close_connection = True
                return
            status, payload = answer
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up waiting (its timeout): nobody to answer

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

        def log_message(self, *_args: object) -> None:
            """Quiet: the tests assert on what the client reports."""

    return Handler


@dataclass
class Forwarding:
    """Relays requests to a real server until ``completions_budget`` completions were relayed;
    the next one kills the relay, as a server dying mid-run."""

    upstream: str
    completions_budget: int
    relayed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def respond(
        self, method: str, path: str, body: dict, _headers: dict
    ) -> tuple[int, bytes] | None:
        if path == "/v1/completions":
            with self.lock:
                if self.relayed == self.completions_budget:
                    return None
                self.relayed += 1
        data = json.dumps(body).encode() if method == "POST" else None
        request = urllib.request.Request(
            self.upstream + path, data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()


MODELS_ANSWER = {
    "object": "list",
    "data": [{"id": "fake", "root": "/models/fake", "max_model_len": 64}],
}


def completion(body: dict, with_logprobs: bool = True, token: int = 7) -> dict:
    """A well-formed vLLM-style answer: every sample is ``max_tokens`` copies of ``token`` with
    log-prob -0.5 (the prompt echoed with log-probs first when asked)."""
    tokens, values = [f"token_id:{token}"] * body["max_tokens"], [-0.5] * body["max_tokens"]
    if body.get("echo"):
        prompt = body["prompt"] if isinstance(body["prompt"], list) else [3] * 4
        tokens = [f"token_id:{t}" for t in prompt] + tokens
        values = [None] + [-1.0] * (len(prompt) - 1) + values
    logprobs = {"tokens": tokens, "token_logprobs": values} if with_logprobs else None
    choices = [
        {
            "index": i,
            "text": "x" * body["max_tokens"],
            "logprobs": logprobs,
            "finish_reason": "length",
        }
        for i in range(body["n"])
    ]
    return {"choices": choices, "usage": {"prompt_tokens": 4}, "system_fingerprint": "fake-1"}


@dataclass
class Scripted:
    """A fake OpenAI-compatible server: ``/v1/models`` answers MODELS_ANSWER; completion
    number k (counting from 0, the probe first) is answered by ``script(k, body)``."""

    script: Callable[[int, dict], tuple[int, bytes]]
    seen: list[dict] = field(default_factory=list)
    headers: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def respond(self, method: str, path: str, body: dict, headers: dict) -> tuple[int, bytes]:
        if path == "/v1/models":
            return 200, json.dumps(MODELS_ANSWER).encode()
        with self.lock:
            k = len(self.seen)
            self.seen.append(body)
            self.headers.append(headers)
        return self.script(k, body)


def ok(_k: int, body: dict) -> tuple[int, bytes]:
    return 200, json.dumps(completion(body)).encode()


def fake_generator(url: str | list[str], **options: object) -> OpenAIGenerator:
    return OpenAIGenerator(url, "fake", show_progress=False, **{**FAST_RETRIES, **options})


def test_server_down_is_one_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(
        ServerUnavailableError, match=r"GET /v1/models: no answer .* after 3 attempts"
    ) as err:
        fake_generator(url)
    assert url in str(err.value) and isinstance(err.value, UserError)


def test_server_errors_are_retried_then_recover(tmp_path) -> None:
    def two_failures(k: int, body: dict) -> tuple[int, bytes]:
        return (500, b"engine busy") if k in (1, 2) else ok(k, body)

    server = Scripted(two_failures)
    with fake_server(server.respond) as url:
        gen = CachedGenerator(fake_generator(url, max_concurrency=1), GenerationCache(tmp_path))
        out = gen.sample(["a question"], SamplingParams(n=2, max_new_tokens=3))
    assert len(server.seen) == 4  # probe, two failures, the success
    assert [s.token_ids for s in out[0]] == [(7, 7, 7)] * 2


def test_persistent_failure_names_server_and_prompt_and_caches_nothing(tmp_path) -> None:
    server = Scripted(
        lambda k, body: ok(k, body) if k == 0 or "good" in body["prompt"] else (503, b"down")
    )
    cache = GenerationCache(tmp_path)
    with fake_server(server.respond) as url:
        gen = CachedGenerator(fake_generator(url), cache)
        with pytest.raises(
            ServerUnavailableError,
            match=r"prompt \d \('bad prompt'\): no answer .* after 3 attempts",
        ) as err:
            gen.sample(["good prompt", "bad prompt"], SamplingParams(n=1, max_new_tokens=2))
    assert url in str(err.value) and "HTTP 503" in str(err.value)
    assert len(cache) == 0


def test_answers_without_logprobs_are_refused() -> None:
    server = Scripted(
        lambda _k, body: (200, json.dumps(completion(body, with_logprobs=False)).encode())
    )
    with (
        fake_server(server.respond) as url,
        pytest.raises(MissingLogprobsError, match="probe: .* no token log-probs"),
    ):
        fake_generator(url)


def test_malformed_json_is_one_clear_error_and_caches_nothing(tmp_path) -> None:
    server = Scripted(
        lambda k, body: (200, b'{"choices": [') if "broken" in str(body["prompt"]) else ok(k, body)
    )
    cache = GenerationCache(tmp_path)
    with fake_server(server.respond) as url:
        gen = CachedGenerator(fake_generator(url), cache)
        with pytest.raises(ServerResponseError, match=r"prompt \d \('broken'\): .* malformed JSON"):
            gen.sample(["fine", "broken"], SamplingParams(n=1, max_new_tokens=2))
    assert len(cache) == 0


def test_missing_prompt_logprobs_name_the_metric(tiny_models) -> None:
    def no_echo(k: int, body: dict) -> tuple[int, bytes]:
        return ok(k, {**body, "echo": False})

    server = Scripted(no_echo)
    tokenizer = str(tiny_models.causal_lm)
    with fake_server(server.respond) as url:
        assert fake_generator(url, tokenizer=tokenizer).sample(
            ["q"], SamplingParams(n=1, max_new_tokens=1)
        )
        with pytest.raises(
            CapabilityMissingError, match="consens, likelihood_utility need prompt log-probs"
        ):
            fake_generator(
                url, tokenizer=tokenizer, prompt_logprob_metrics=("consens", "likelihood_utility")
            )


def test_token_scored_metrics_without_a_tokenizer_are_named() -> None:
    with pytest.raises(
        CapabilityMissingError, match="consens .* needs the served model's `tokenizer`"
    ):
        fake_generator(f"http://127.0.0.1:{free_port()}", prompt_logprob_metrics=("consens",))


def test_a_server_reconfigured_mid_run_is_refused(tmp_path) -> None:
    def restarted_after_probe(k: int, body: dict) -> tuple[int, bytes]:
        answer = completion(body)
        return 200, json.dumps(
            {**answer, "system_fingerprint": "fake-1" if k == 0 else "fake-2"}
        ).encode()

    cache = GenerationCache(tmp_path)
    with fake_server(Scripted(restarted_after_probe).respond) as url:
        gen = fake_generator(url)
        assert gen.settings["server"] == "fake-1"
        with pytest.raises(ServerResponseError, match="'fake-2', not 'fake-1'"):
            CachedGenerator(gen, cache).sample(["q"], SamplingParams(n=1, max_new_tokens=1))
    assert len(cache) == 0


def test_missing_api_key_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAGUTIL_TEST_KEY", raising=False)
    with pytest.raises(MissingAPIKeyError, match="RAGUTIL_TEST_KEY"):
        fake_generator(f"http://127.0.0.1:{free_port()}", api_key_env="RAGUTIL_TEST_KEY")


def test_api_key_is_sent_and_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-test-0123456789"
    monkeypatch.setenv("RAGUTIL_TEST_KEY", secret)

    def echo_auth_on_sampling(k: int, body: dict) -> tuple[int, bytes]:
        # A careless server quoting the request's credentials in its error.
        return (
            ok(k, body)
            if k == 0
            else (401, f"bad token {server.headers[k]['Authorization']}".encode())
        )

    server = Scripted(echo_auth_on_sampling)
    with fake_server(server.respond) as url:
        gen = fake_generator(url, api_key_env="RAGUTIL_TEST_KEY")
        with pytest.raises(ServerResponseError, match="HTTP 401") as err:
            gen.sample(["q"], SamplingParams(n=1, max_new_tokens=1))
    assert server.headers[0]["Authorization"] == f"Bearer {secret}"
    for shown in (str(err.value), repr(gen), repr(gen.client), json.dumps(gen.settings)):
        assert secret not in shown
    assert "bad token Bearer ***" in str(err.value)


# ------------------------------------------------------------- a fleet of fake replicas


def seeded(_k: int, body: dict) -> tuple[int, bytes]:
    """A well-formed answer whose tokens follow from the request's seed, as a real server's
    samples do: which replica answers must not change them."""
    return 200, json.dumps(completion(body, token=body["seed"] % 1000)).encode()


FLEET_PROMPTS = [f"question {i}" for i in range(12)]
FLEET_PARAMS = SamplingParams(n=2, max_new_tokens=3, seed=5)


def token_ids(out: list[list[Sample]]) -> list[list[tuple[int, ...]]]:
    return [[s.token_ids for s in per] for per in out]


def test_fleet_config_names_each_replica_once() -> None:
    assert ServerConfig(base_url="http://a:1").base_url == ["http://a:1"]
    with pytest.raises(ValueError, match="lists http://a:1 more than once"):
        ServerConfig(base_url=["http://a:1", "http://b:1", "http://a:1/"])


def test_all_replicas_down_is_one_error_naming_each() -> None:
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    with pytest.raises(
        ServerUnavailableError,
        match=r"GET /v1/models: no answer from any of 2 replicas after 3 attempts",
    ) as err:
        fake_generator(dead)
    for url in dead:
        assert f"{url}: ConnectionRefusedError" in str(err.value)


def test_a_replica_down_at_start_is_left_out_then_rejoins() -> None:
    later = free_port()
    live = Scripted(seeded)
    with fake_server(live.respond) as url:
        fleet = fake_generator([f"http://127.0.0.1:{later}", url], reprobe_seconds=0.2)
        alone = fleet.sample(FLEET_PROMPTS, FLEET_PARAMS)
        down, up = fleet.client.status()
        assert not down.healthy and down.answered == 0 and "ConnectionRefused" in down.last_failure
        assert up.healthy and len(live.seen) == 1 + len(FLEET_PROMPTS)  # the probe, every prompt
        revived = Scripted(seeded)
        with fake_server(revived.respond, port=later):
            time.sleep(0.3)  # past reprobe_seconds: the next request re-probes it
            again = fleet.sample(FLEET_PROMPTS, FLEET_PARAMS)
        assert fleet.client.status()[0].healthy and revived.seen
    assert len(revived.seen) + len(live.seen) == 1 + 2 * len(FLEET_PROMPTS)
    assert token_ids(again) == token_ids(alone)


def test_a_replica_dying_mid_run_changes_no_sample() -> None:
    """One replica answers its probe and three prompts, then drops the next connection and
    refuses all later ones: the run ends on the other replica with a one-replica run's samples."""
    dying, survivor = (
        Scripted(lambda k, body: seeded(k, body) if k <= 3 else None),
        Scripted(seeded),
    )
    with fake_server(survivor.respond) as a:
        reference = fake_generator(a).sample(FLEET_PROMPTS, FLEET_PARAMS)
        before = len(survivor.seen)
        with fake_server(dying.respond) as b:
            fleet = fake_generator([a, b], max_concurrency=2)
            out = fleet.sample(FLEET_PROMPTS, FLEET_PARAMS)
    assert token_ids(out) == token_ids(reference)
    assert len(survivor.seen) - before == 1 + len(FLEET_PROMPTS) - 3  # its probe, the rest
    alive, dead = fleet.client.status()
    assert alive.healthy and not dead.healthy and dead.failed >= 1
    assert dead.outstanding == alive.outstanding == 0


def test_a_busy_replica_is_retried_elsewhere_and_kept() -> None:
    busy = Scripted(lambda k, body: ok(k, body) if k == 0 else (429, b"too many requests"))
    with fake_server(Scripted(ok).respond) as a, fake_server(busy.respond) as b:
        fleet = fake_generator([a, b])
        assert len(fleet.sample(FLEET_PROMPTS, FLEET_PARAMS)) == len(FLEET_PROMPTS)
    _, still_in = fleet.client.status()
    assert still_in.healthy and still_in.failed >= 1 and "HTTP 429" in still_in.last_failure


def test_a_hung_replica_times_out_and_is_left_out() -> None:
    def hangs_after_probe(k: int, body: dict) -> tuple[int, bytes]:
        if k:
            time.sleep(1.0)
        return seeded(k, body)

    hung = Scripted(hangs_after_probe)
    with fake_server(hung.respond) as a, fake_server(Scripted(seeded).respond) as b:
        reference = fake_generator(b).sample(FLEET_PROMPTS, FLEET_PARAMS)
        fleet = fake_generator([a, b], timeout=0.3)
        assert token_ids(fleet.sample(FLEET_PROMPTS, FLEET_PARAMS)) == token_ids(reference)
    left_out, _ = fleet.client.status()
    assert not left_out.healthy and left_out.answered == 2  # /v1/models and its probe
    # each request it held timed out; its probe is the only completion it answered
    assert "timed out" in left_out.last_failure and len(hung.seen) == 1 + left_out.failed


def test_a_slow_replica_gets_less_work() -> None:
    """Least outstanding requests: with two in flight, the fast replica takes the next request
    while the slow one still works on its first."""

    def slow(k: int, body: dict) -> tuple[int, bytes]:
        time.sleep(0.5)
        return ok(k, body)

    slow_replica, fast_replica = Scripted(slow), Scripted(ok)
    with fake_server(slow_replica.respond) as a, fake_server(fast_replica.respond) as b:
        fake_generator([a, b], max_concurrency=2).sample(FLEET_PROMPTS, FLEET_PARAMS)
    # each had its probe; the slow one took at most a few of the twelve prompts
    assert len(slow_replica.seen) - 1 <= 3 and len(fast_replica.seen) - 1 >= 9


@pytest.mark.parametrize(
    ("nonsense", "reported"),
    [
        (b"<html>502 Bad Gateway</html>", "answered with malformed JSON"),
        (b'{"choices": "nonsense", "system_fingerprint": "fake-1"}', "answered with no choices"),
    ],
)
def test_nonsense_from_one_replica_is_refused_naming_it(tmp_path, nonsense, reported) -> None:
    """A replica answering nonsense after a good probe is misconfigured: the run stops, naming
    it (retrying elsewhere would hide that), and stores nothing."""

    def nonsense_after_probe(k: int, body: dict) -> tuple[int, bytes]:
        return seeded(k, body) if k == 0 else (200, nonsense)

    cache = GenerationCache(tmp_path)
    with (
        fake_server(Scripted(seeded).respond) as a,
        fake_server(Scripted(nonsense_after_probe).respond) as b,
    ):
        with pytest.raises(
            ServerResponseError, match=rf"prompt \d+ .*: {re.escape(b)}\S* {reported}"
        ):
            CachedGenerator(fake_generator([a, b]), cache).sample(FLEET_PROMPTS, FLEET_PARAMS)
    assert len(cache) == 0


def test_a_replica_configured_otherwise_is_refused_at_start() -> None:
    def other_fingerprint(_k: int, body: dict) -> tuple[int, bytes]:
        return 200, json.dumps({**completion(body), "system_fingerprint": "fake-2"}).encode()

    with (
        fake_server(Scripted(ok).respond) as a,
        fake_server(Scripted(other_fingerprint).respond) as b,
        pytest.raises(ServerResponseError, match="probe: .* reports system_fingerprint") as err,
    ):
        fake_generator([a, b])
    assert a in str(err.value) and b in str(err.value) and "fake-1" in str(err.value)


def _tokenize_answering(status: int, answer: bytes, calls: list[dict]) -> Responder:
    """A fake server whose ``/tokenize`` answers ``status`` and ``answer`` (each request kept in
    ``calls``); completions are well formed."""

    def respond(_method: str, path: str, body: dict, _headers: dict) -> tuple[int, bytes]:
        if path == "/v1/models":
            return 200, json.dumps(MODELS_ANSWER).encode()
        if path == "/tokenize":
            calls.append(body)
            return status, answer
        return ok(0, body)

    return respond


@pytest.mark.parametrize(
    ("status", "answer", "unit"),
    [
        (200, b'{"count": 4, "max_model_len": 64}', "generator tokens"),
        (
            404,
            b'{"detail": "Not Found"}',
            "whitespace words",
        ),  # no such route (vLLM-style FastAPI, llama.cpp)
        (405, b'{"detail": "Method Not Allowed"}', "whitespace words"),
        (
            501,
            b'{"error": "Unsupported method (POST)"}',
            "whitespace words",
        ),  # answered once, not retried
    ],
)
def test_context_tokens_are_counted_by_tokenize_or_in_words_where_the_server_has_none(
    status: int, answer: bytes, unit: str
) -> None:
    from ragutil_dagster.evaluation.compression import context_token_count

    calls: list[dict] = []
    with fake_server(_tokenize_answering(status, answer, calls)) as url:
        assert context_token_count(fake_generator(url))[1] == unit
    assert calls == [{"model": "fake", "prompt": "Question:"}]


@pytest.mark.parametrize(
    ("status", "raised", "match"),
    [
        (401, ServerResponseError, r"/tokenize refused the request with HTTP 401"),
        (503, ServerUnavailableError, r"no answer from the server after 3 attempts .*HTTP 503"),
    ],
)
def test_a_tokenize_refused_or_down_is_the_error_not_a_switch_to_words(
    status, raised, match
) -> None:
    from ragutil_dagster.evaluation.compression import context_token_count

    with fake_server(_tokenize_answering(status, b'{"error": "no"}', [])) as url:
        with pytest.raises(raised, match=match) as err:
            context_token_count(fake_generator(url))
    assert getattr(err.value, "status", None) == (401 if raised is ServerResponseError else None)
