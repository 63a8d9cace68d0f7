"""OpenAI-compatible completion servers (``vllm serve`` and compatible ones) as a generator backend.

SePer needs every sample's log-probability under the model's own distribution, so this backend
speaks the legacy ``/v1/completions`` endpoint (chat endpoints give no prompt log-probs) and asks
for the sampled tokens' log-probs (``logprobs: 0``). vLLM reports them from the raw logits by
default (``--logprobs-mode raw_logprobs``), the same distribution as the ``hf`` and ``vllm``
backends; a server started with processed log-probs gives other numbers.

Decisions, and why:

* **Token ids come from the server**, through vLLM's ``return_tokens_as_token_ids`` extension:
  each log-prob entry then names its token as ``token_id:<id>``, so ids and log-probs are aligned
  one to one. Re-tokenising the returned text locally would not reproduce the sampled tokens
  (a decoded string re-encodes to other merges) and could give a different count than the
  log-probs. A server without the extension is refused at start, naming what is missing.
* **Prompts are sent as token ids** when a local ``tokenizer`` is given: they are formatted
  (chat template, system prompt) and tokenised exactly as the other backends do, and prompt
  token counts are exact. Without one, prompts go as text and the server's ``/tokenize``
  (a vLLM endpoint) counts their tokens; a chat template then cannot be applied.
* **Identity** is what the cache and MLflow key samples on; a server only names its model, so
  give ``identity`` (e.g. the ``sha256:`` identity ragutil computes for the served directory).
  Without it the identity is ``openai:<served id>@<root>`` from ``/v1/models`` — as stable as the
  server's naming of its weights, no more.
* **Settings** (the generation cache's namespace) hold the identity, the prompt formatting and
  the server's ``system_fingerprint`` (vLLM: its version and a hash of its engine configuration —
  dtype, quantisation, model…), never the URLs (replicas of one model share entries; a moved
  server keeps them) nor the API key. An answer with another fingerprint than the probe's (a
  server restarted differently mid-run, a replica configured otherwise) is refused; at start
  every replica is probed and must report the same fingerprint.
* **Several base URLs** form a fleet (:class:`CompletionsClient`): a request goes to the healthy
  replica with the fewest requests in flight, a failed attempt (HTTP 429 and 5xx, timeouts,
  connection errors) is retried at once on another replica, a replica that failed is left out
  and re-probed later, and after a bounded number of attempts one error names every replica.
  A request's seed is a property of the request (a hash of the run's seed and the prompt), so
  where it is served, or re-served after a replica died, does not change its samples.
  Anything else (4xx, malformed JSON, missing log-probs) fails at once, naming the replica:
  retrying cannot fix it.
"""

from __future__ import annotations

import http.client
import itertools
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from tqdm.auto import tqdm

from ragutil_dagster.errors import (
    CapabilityMissingError,
    MissingAPIKeyError,
    MissingLogprobsError,
    ServerResponseError,
    ServerUnavailableError,
    UserError,
)
from ragutil_dagster.models.causal_lm import encode_prompts
from ragutil_dagster.models.generation import Sample, row_seed
from ragutil_dagster.models.inputs import check_texts
from ragutil_dagster.models.resolver import resolve
from ragutil_dagster.models.scoring import EngineTokenScorer, same_length
from ragutil_dagster.redaction import MASK, redact, redact_uri
from ragutil_dagster.sampling import SamplingParams

__all__ = [
    "ATTENTION_UNAVAILABLE",
    "CompletionsClient",
    "OpenAIGenerator",
    "OpenAITokenScorer",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

ATTENTION_UNAVAILABLE = (
    "attention utility needs the model's attention weights, which an OpenAI-compatible server "
    "does not return; score it with the hf backend"
)
_TOKEN_ID_PREFIX = "token_id:"
# vLLM seeds sample j of a request with seed + j, as a signed 32-bit integer on some paths: the
# in-process backend's range, so a server and the in-process engine draw the same samples.
_SEED_RANGE = 2**31 - 2**16
_FINISH_REASONS = ("stop", "length")
# A re-probe asks for the model list, which a live server answers at once; one that cannot within
# this time is not ready for sampling requests either.
_PROBE_TIMEOUT = 10.0


class _RetryableError(Exception):
    """One failed attempt worth retrying on another replica. ``replica_down``: the replica itself
    failed (connection error, timeout, 5xx), not merely busy (429)."""

    def __init__(self, message: str, *, replica_down: bool = True) -> None:
        super().__init__(message)
        self.replica_down = replica_down


@dataclass(frozen=True)
class Answer:
    """A parsed JSON answer, the replica that gave it (its index in ``base_urls``) and that
    replica's URL with credentials masked, by which errors about the answer name it."""

    body: dict
    replica: int
    server: str


@dataclass(frozen=True)
class ReplicaStatus:
    """One replica as the client sees it: ``healthy`` False while it is left out after a failure;
    ``answered`` and ``failed`` count requests answered and attempts failed on it."""

    url: str
    healthy: bool
    outstanding: int
    answered: int
    failed: int
    last_failure: str | None


@dataclass
class _Replica:
    """A replica's mutable state, guarded by the client's lock (``status`` gives snapshots)."""

    url: str
    shown: str
    outstanding: int = 0
    answered: int = 0
    failed: int = 0
    down_until: float | None = None  # monotonic time of its next re-probe; None while healthy
    probing: bool = False
    last_failure: str | None = None


class CompletionsClient:
    """JSON over HTTP to one model served by one or more OpenAI-compatible replicas (or by one
    router in front of them).

    * **Routing**: a request goes to the healthy replica with the fewest requests in flight
      (ties taken in turn), so a slower replica gets less work.
    * **Failover**: a failed attempt (connection error, timeout, 5xx, 429) is retried at once on
      a healthy replica this request has not tried; when none is left, after ``retry_backoff`` ×
      2^k seconds on the best remaining one (a replica left out included). At most
      ``max_retries`` retries, then one :class:`ServerUnavailableError` naming every replica with
      its last failure.
    * **Health**: a replica failing with a connection error, a timeout or a 5xx is left out of
      the rotation; ``reprobe_seconds`` later the next request re-probes it (``GET /v1/models``,
      at most 10 s) and it rejoins when it answers.

    Answers that are not JSON objects, and 4xx refusals, fail at once (:class:`ServerResponseError`
    naming the replica): retrying cannot fix them, and a fleet answering otherwise on one replica
    is misconfigured. The API key is read once from the environment variable named
    ``api_key_env`` and masked in every message.
    """

    def __init__(
        self,
        base_urls: Sequence[str],
        *,
        api_key_env: str | None = None,
        timeout: float = 600.0,
        max_retries: int = 4,
        retry_backoff: float = 1.0,
        reprobe_seconds: float = 30.0,
    ) -> None:
        if not base_urls:
            raise ValueError("give at least one base_url")
        if max_retries < 0:
            raise ValueError(f"max_retries must be at least 0, got {max_retries}")
        self.api_key_env = api_key_env
        self._api_key = _read_api_key(api_key_env)
        self.timeout = timeout
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.reprobe_seconds = reprobe_seconds
        urls = [url.rstrip("/") for url in base_urls]
        self._replicas = [_Replica(url, redact_uri(url)) for url in urls]
        self._lock = threading.Lock()
        self._turns = itertools.count()

    def __repr__(self) -> str:
        return f"CompletionsClient(base_urls={self.shown_urls!r}, api_key_env={self.api_key_env!r})"

    @property
    def shown_urls(self) -> list[str]:
        """The base URLs with any credentials in them masked."""
        return [replica.shown for replica in self._replicas]

    def status(self) -> list[ReplicaStatus]:
        """Every replica's health and counters, in ``base_urls`` order."""
        with self._lock:
            return [
                ReplicaStatus(
                    r.shown, r.down_until is None, r.outstanding, r.answered, r.failed,
                    r.last_failure,
                )
                for r in self._replicas
            ]

    def mask(self, text: str) -> str:
        """``text`` with the API key and URI credentials masked."""
        if self._api_key:
            text = text.replace(self._api_key, MASK)
        return redact(text)

    def get(self, path: str) -> Answer:
        """GET ``path`` from any replica (routed and retried like :meth:`post`)."""
        return self._routed(path, None, f"GET {path}", None, None)

    def post(
        self,
        path: str,
        body: dict,
        what: str,
        cancelled: threading.Event | None = None,
        replica: int | None = None,
    ) -> Answer:
        """POST ``body`` to ``path``; ``what`` names the request in errors (e.g. ``"prompt 3"``).
        Once ``cancelled`` is set (another request of the same call gave up) no further retry is
        made. ``replica`` pins the request to that replica for one attempt (start-up probes)."""
        return self._routed(path, body, what, cancelled, replica)

    def _routed(
        self,
        path: str,
        body: dict | None,
        what: str,
        cancelled: threading.Event | None,
        pinned: int | None,
    ) -> Answer:
        failures: dict[int, str] = {}
        tried: set[int] = set()
        waits = attempts = 0
        while attempts <= (0 if pinned is not None else self.max_retries):
            if attempts and cancelled is not None and cancelled.is_set():
                break
            index, fresh = self._acquire(tried) if pinned is None else self._claim(pinned)
            replica = self._replicas[index]
            try:
                if not fresh:
                    delay = self.retry_backoff * 2**waits
                    waits += 1
                    log.warning(
                        "%s: no healthy replica left to try; attempt %d of %d on %s in %.1f s",
                        what, attempts + 1, self.max_retries + 1, replica.shown, delay,
                    )
                    time.sleep(delay)
                tried.add(index)
                attempts += 1
                answer = self._request(replica.url + path, body, what, self.timeout)
            except _RetryableError as err:
                failures[index] = str(err)
                self._failed(replica, str(err), err.replica_down)
                continue
            except BaseException:
                self._release(replica)
                raise
            self._answered(replica)
            return Answer(answer, index, replica.shown)
        raise self._unavailable(what, attempts, failures)

    def _acquire(self, tried: set[int]) -> tuple[int, bool]:
        """The replica for the next attempt (its request counted in flight), and whether it is a
        healthy one this request has not tried. Re-probes a replica first when one is due."""
        while True:
            with self._lock:
                now = time.monotonic()
                due = next(
                    (
                        r for r in self._replicas
                        if r.down_until is not None and r.down_until <= now and not r.probing
                    ),
                    None,
                )
                if due is None:
                    healthy = [i for i, r in enumerate(self._replicas) if r.down_until is None]
                    fresh = [i for i in healthy if i not in tried]
                    pool = fresh or healthy or [
                        min(range(len(self._replicas)), key=lambda i: self._replicas[i].down_until)
                    ]
                    turn, count = next(self._turns), len(self._replicas)
                    index = min(
                        pool, key=lambda i: (self._replicas[i].outstanding, (i - turn) % count)
                    )
                    self._replicas[index].outstanding += 1
                    return index, bool(fresh)
                due.probing = True
            self._reprobe(due)

    def _claim(self, index: int) -> tuple[int, bool]:
        with self._lock:
            self._replicas[index].outstanding += 1
        return index, True

    def _reprobe(self, replica: _Replica) -> None:
        """Ask a replica left out whether it answers again; it rejoins when it does."""
        what = f"re-probe of {replica.shown}"
        try:
            self._request(replica.url + "/v1/models", None, what, min(self.timeout, _PROBE_TIMEOUT))
        except (_RetryableError, ServerResponseError) as err:
            with self._lock:
                replica.probing = False
                replica.down_until = time.monotonic() + self.reprobe_seconds
                replica.last_failure = str(err)
            log.info("%s: still failing (%s)", what, self.mask(str(err)))
            return
        with self._lock:
            replica.probing = False
            replica.down_until = None
        log.warning("replica %s answers again: back in the rotation", replica.shown)

    def _release(self, replica: _Replica) -> None:
        with self._lock:
            replica.outstanding -= 1

    def _answered(self, replica: _Replica) -> None:
        with self._lock:
            replica.outstanding -= 1
            replica.answered += 1
            replica.down_until = None

    def _failed(self, replica: _Replica, failure: str, down: bool) -> None:
        with self._lock:
            replica.outstanding -= 1
            replica.failed += 1
            replica.last_failure = failure
            newly_down = down and replica.down_until is None
            if down:
                replica.down_until = time.monotonic() + self.reprobe_seconds
        if newly_down:
            log.warning(
                "replica %s failed (%s): left out of the rotation, re-probed in %.0f s",
                replica.shown, self.mask(failure), self.reprobe_seconds,
            )

    def _unavailable(
        self, what: str, attempts: int, failures: dict[int, str]
    ) -> ServerUnavailableError:
        """One error naming every replica with its last failure."""
        with self._lock:
            replicas = "; ".join(
                f"{r.shown}: {failures.get(i) or r.last_failure or 'not tried'}"
                for i, r in enumerate(self._replicas)
            )
        whom = "the server" if len(self._replicas) == 1 else f"any of {len(self._replicas)} replicas"
        return ServerUnavailableError(
            self.mask(
                f"{what}: no answer from {whom} after {attempts} "
                f"attempt{'' if attempts == 1 else 's'} ({replicas}); check that the servers are "
                "running, then re-run: stored samples are kept"
            )
        )

    def _request(self, url: str, body: dict | None, what: str, timeout: float) -> dict:
        """One HTTP exchange; transient failures raise :class:`_RetryableError`."""
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            detail = _error_detail(err)
            if err.code == 429 or err.code >= 500:
                raise _RetryableError(
                    f"HTTP {err.code} {detail}", replica_down=err.code != 429
                ) from None
            raise ServerResponseError(
                self.mask(
                    f"{what}: {redact_uri(url)} refused the request with HTTP {err.code}: {detail}"
                )
            ) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
            reason = getattr(err, "reason", err)
            raise _RetryableError(f"{type(reason).__name__}: {reason}") from None
        try:
            answer = json.loads(raw)
        except ValueError:
            raise ServerResponseError(
                self.mask(f"{what}: {redact_uri(url)} answered with malformed JSON: {raw[:200]!r}")
            ) from None
        if not isinstance(answer, dict):
            raise ServerResponseError(
                self.mask(
                    f"{what}: {redact_uri(url)} answered {type(answer).__name__}, not a JSON object"
                )
            )
        return answer


def _read_api_key(variable: str | None) -> str | None:
    """The key in environment variable ``variable``; a named but unset variable is an error."""
    if variable is None:
        return None
    key = os.environ.get(variable)
    if not key:
        raise MissingAPIKeyError(
            f"the API key variable {variable} (api_key_env) is not set in this environment; "
            f"export {variable}=<key>, or drop api_key_env for a server without authentication"
        )
    return key


def _error_detail(err: urllib.error.HTTPError) -> str:
    """The server's own error message, shortened."""
    try:
        body = err.read()[:300].decode(errors="replace")
    except OSError:
        body = ""
    return body.strip() or str(err.reason)


def map_concurrently(
    fn: Callable[[int, T, threading.Event], R],
    items: Sequence[T],
    max_concurrency: int,
    progress: tqdm | None = None,
) -> list[R]:
    """``[fn(i, item, cancelled) ...]`` in order, at most ``max_concurrency`` at a time.

    The first error is raised once the calls already running end; calls not yet started are
    cancelled and running ones see ``cancelled`` set and stop retrying, so a dead server fails
    the whole call promptly.
    """
    results: list[Any] = [None] * len(items)
    cancelled = threading.Event()
    with ThreadPoolExecutor(max_workers=max(1, min(max_concurrency, len(items)))) as pool:
        futures = {pool.submit(fn, i, item, cancelled): i for i, item in enumerate(items)}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for future in done:
                if future.exception() is not None:
                    cancelled.set()
                    for other in pending:
                        other.cancel()
                    raise future.exception()
                results[futures[future]] = future.result()
                if progress is not None:
                    progress.update(1)
    return results


@dataclass(frozen=True)
class ServedModel:
    """What ``/v1/models`` says about the served model."""

    id: str
    root: str | None
    max_model_len: int | None


def find_served_model(client: CompletionsClient, model: str) -> ServedModel:
    """The entry of ``model`` in the server's ``/v1/models`` (an error lists what it serves)."""
    listing = client.get("/v1/models")
    entries = listing.body.get("data")
    if not isinstance(entries, list):
        raise ServerResponseError(
            f"{listing.server}/v1/models has no `data` list: not an OpenAI-compatible server"
        )
    for entry in entries:
        if isinstance(entry, dict) and entry.get("id") == model:
            length = entry.get("max_model_len")
            return ServedModel(
                model, entry.get("root"), length if isinstance(length, int) else None
            )
    served = ", ".join(str(e.get("id")) for e in entries if isinstance(e, dict)) or "nothing"
    raise ServerResponseError(
        f"{listing.server} does not serve model {model!r} (it serves: {served}); "
        "set `model` to the served name (vLLM: --served-model-name)"
    )


class OpenAIGenerator:
    """Samples from a model behind OpenAI-compatible ``/v1/completions`` endpoints.

    Implements the :class:`~ragutil_dagster.models.generation.Generator` protocol: one request
    per prompt asks for its ``n`` samples, seeded from (seed, prompt) so a prompt's samples do not
    depend on its batch-mates; up to ``max_concurrency`` requests run at once. The constructor
    probes the server and refuses, naming what is missing, when it cannot serve sampling (or
    the metrics in ``prompt_logprob_metrics``).

    Args:
        base_url: one server's base URL (``http://host:port``, without ``/v1``) or a list of
            replicas of the same model.
        model: the model name as served (``/v1/models`` id).
        identity: the served weights' identity for caches and MLflow (see module doc).
        tokenizer: hub id or directory of the served model's tokenizer: prompts are then
            formatted and tokenised locally and sent as token ids.
        use_chat_template, system_prompt: prompt formatting, as the other backends (needs
            ``tokenizer``).
        api_key_env: NAME of the environment variable holding the API key (sent as a bearer
            token; never stored in settings, messages or logs).
        prompt_logprob_metrics: configured metrics that need token scoring: when non-empty a
            ``tokenizer`` must be given and the server must return prompt log-probs, or the
            constructor refuses, naming these metrics.
        max_concurrency: requests in flight at once.
        timeout, max_retries, retry_backoff: per-request timeout (s) and retry policy.
    """

    backend = "openai"

    def __init__(
        self,
        base_url: str | Sequence[str],
        model: str,
        *,
        identity: str | None = None,
        tokenizer: str | None = None,
        use_chat_template: bool = False,
        system_prompt: str | None = None,
        api_key_env: str | None = None,
        prompt_logprob_metrics: Sequence[str] = (),
        max_concurrency: int = 8,
        timeout: float = 600.0,
        max_retries: int = 4,
        retry_backoff: float = 1.0,
        reprobe_seconds: float = 30.0,
        show_progress: bool = True,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        if use_chat_template and tokenizer is None:
            raise UserError(
                "use_chat_template needs the served model's `tokenizer` (hub id or directory): "
                "the chat template is applied locally"
            )
        if prompt_logprob_metrics and tokenizer is None:
            raise CapabilityMissingError(
                f"metric(s) {', '.join(prompt_logprob_metrics)} score answers token by token "
                "through the server, which needs the served model's `tokenizer` here (a local "
                "copy of the model, or its hub id); give one, or drop these metrics"
            )
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self.client = CompletionsClient(
            urls,
            api_key_env=api_key_env,
            timeout=timeout,
            max_retries=max_retries,
            retry_backoff=retry_backoff,
            reprobe_seconds=reprobe_seconds,
        )
        self.model = model
        self.tokenizer = _load_tokenizer(tokenizer) if tokenizer is not None else None
        self.use_chat_template = use_chat_template
        self.system_prompt = system_prompt
        self.max_concurrency = max_concurrency
        self.show_progress = show_progress
        self.served = find_served_model(self.client, model)
        self._identity = identity or f"openai:{self.served.id}@{self.served.root or self.served.id}"
        # The first probe's answer sets them; every later answer is checked against them.
        self.server_fingerprint: str | None = None
        self._fingerprint_server = ""
        self.probe_replicas()
        if prompt_logprob_metrics and not self.probe_prompt_logprobs():
            raise CapabilityMissingError(
                f"metric(s) {', '.join(prompt_logprob_metrics)} need prompt log-probs (token "
                f"scoring), but {', '.join(self.client.shown_urls)} return none for `echo` with "
                "`logprobs`; serve the model with vLLM, or drop these metrics"
            )

    def __repr__(self) -> str:
        return (
            f"OpenAIGenerator(base_url={self.client.shown_urls!r}, model={self.model!r}, "
            f"identity={self._identity!r})"
        )

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def settings(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "identity": self._identity,
            "prompt_format": "token_ids" if self.tokenizer is not None else "text",
            "chat_template": self.use_chat_template,
            "system_prompt": self.system_prompt,
            "server": self.server_fingerprint,
        }

    @property
    def context_length(self) -> int | None:
        return self.served.max_model_len

    def encode_prompts(self, prompts: Sequence[str]) -> list[list[int]] | list[str]:
        """What is sent as each request's ``prompt``: token ids with a local tokenizer, else the
        text itself."""
        if self.tokenizer is None:
            return check_texts(prompts, "prompts")
        return encode_prompts(self.tokenizer, prompts, self.use_chat_template, self.system_prompt)

    def count_prompt_tokens(self, prompts: Sequence[str]) -> list[int]:
        encoded = self.encode_prompts(prompts)
        if self.tokenizer is not None:
            return [len(ids) for ids in encoded]
        return map_concurrently(self._count_on_server, encoded, self.max_concurrency)

    def _count_on_server(self, index: int, text: str, cancelled: threading.Event) -> int:
        answer = self.client.post(
            "/tokenize",
            {"model": self.model, "prompt": text},
            f"counting the tokens of prompt {index}",
            cancelled,
        )
        count = answer.body.get("count")
        if not isinstance(count, int):
            raise ServerResponseError(
                f"{answer.server}/tokenize gave no token `count`; give the generator "
                "a local `tokenizer` to count prompt tokens"
            )
        return count

    def complete(
        self,
        prompt: list[int] | str,
        what: str,
        *,
        max_tokens: int,
        params: SamplingParams | None = None,
        seed: int = 0,
        echo: bool = False,
        cancelled: threading.Event | None = None,
        replica: int | None = None,
    ) -> Answer:
        """One ``/v1/completions`` request asking for sampled-token log-probs named by token id
        (greedy when no sampling ``params`` are given), on any replica (or pinned to
        ``replica``); refused when it comes from a server configured otherwise than the first
        one probed."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "n": 1,
            "temperature": 0.0,
            "seed": seed,
            "logprobs": 0,
            "echo": echo,
            "return_tokens_as_token_ids": True,
        }
        if self.tokenizer is not None:
            body["add_special_tokens"] = False  # the ids already hold them (BOS, chat markers)
        if params is not None:
            body.update(n=params.n, temperature=params.temperature, top_p=params.top_p)
            if params.top_k > 0:
                body["top_k"] = params.top_k
            if params.stop:
                body["stop"] = list(params.stop)
        answer = self.client.post("/v1/completions", body, what, cancelled, replica)
        fingerprint = answer.body.get("system_fingerprint")
        if self.server_fingerprint is not None and fingerprint != self.server_fingerprint:
            raise ServerResponseError(
                f"{what}: {answer.server} reports system_fingerprint {fingerprint!r}, not "
                f"{self.server_fingerprint!r} as {self._fingerprint_server} did at start "
                "(restarted with another version or configuration, or replicas configured "
                "otherwise); serve every replica alike and re-run"
            )
        return answer

    def probe_replicas(self) -> None:
        """One greedy token from each replica, checking it returns the token's log-prob and id
        (SePer weighs every sample by p(r | q): a server without them is refused before any
        sampling) and that every replica reports the first one's ``system_fingerprint``.
        A replica that does not answer is left out (re-probed later); when none answers the
        error names them all. Sets ``server_fingerprint`` (None when the servers give none)."""
        prompt = self.encode_prompts(["Hello"])[0]
        first = self.complete(prompt, "probe", max_tokens=1)
        self._samples(first, 1, "probe")
        fingerprint = first.body.get("system_fingerprint")
        self.server_fingerprint = fingerprint if isinstance(fingerprint, str) else None
        self._fingerprint_server = first.server
        for index, replica in enumerate(self.client.status()):
            if replica.healthy and index != first.replica:
                try:
                    answer = self.complete(prompt, "probe", max_tokens=1, replica=index)
                except ServerUnavailableError as err:
                    log.warning("%s", err)
                    continue
                self._samples(answer, 1, "probe")

    def probe_prompt_logprobs(self) -> bool:
        """Whether the server returns prompt tokens' log-probs (``echo`` with ``logprobs``),
        which token scoring needs. A refused ``echo`` request counts as no."""
        prompt = self.encode_prompts(["Hello, world"])[0]
        try:
            answer = self.complete(prompt, "probe of prompt log-probs", max_tokens=1, echo=True)
        except ServerResponseError as err:
            log.warning("prompt log-probs unavailable: %s", err)
            return False
        choice = _choices(answer, 1, "probe of prompt log-probs")[0]
        logprobs = choice.get("logprobs")
        values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
        # echoed: the prompt's tokens (the first without a log-prob) and the generated one
        return (
            isinstance(values, list)
            and len(values) >= 3
            and all(isinstance(v, int | float) for v in values[1:])
        )

    def sample(self, prompts: Sequence[str], params: SamplingParams) -> list[list[Sample]]:
        """``n`` samples per prompt (see :class:`Generator`), one request per prompt."""
        prompts = check_texts(prompts, "prompts")
        encoded = self.encode_prompts(prompts)

        def one(index: int, prompt: list[int] | str, cancelled: threading.Event) -> list[Sample]:
            what = f"prompt {index} ({_excerpt(prompts[index])})"
            answer = self.complete(
                prompt,
                what,
                max_tokens=params.max_new_tokens,
                params=params,
                seed=row_seed(params.seed, prompts[index], 0) % _SEED_RANGE,
                cancelled=cancelled,
            )
            return self._samples(answer, params.n, what, prompt)

        with tqdm(
            total=len(prompts),
            desc="sampling",
            unit="prompt",
            disable=not self.show_progress or not prompts,
        ) as bar:
            return map_concurrently(one, encoded, self.max_concurrency, bar)

    def _samples(
        self, answer: Answer, n: int, what: str, prompt: list[int] | str = ""
    ) -> list[Sample]:
        """The ``n`` samples of a completions answer; ``prompt_tokens`` are the sent ids, or
        the server's count (``usage``) for a text prompt."""
        prompt_tokens = (
            len(prompt) if isinstance(prompt, list) else _usage_prompt_tokens(answer.body)
        )
        samples = []
        for choice in _choices(answer, n, what):
            ids, logprobs = _ids_and_logprobs(choice, what, answer.server)
            if any(not isinstance(lp, int | float) for lp in logprobs):
                raise MissingLogprobsError(
                    f"{what}: {answer.server} left sampled tokens without a log-prob"
                )
            finish = choice.get("finish_reason")
            if finish not in _FINISH_REASONS or not isinstance(choice.get("text"), str):
                raise ServerResponseError(
                    f"{what}: {answer.server} ended a completion with finish_reason "
                    f"{finish!r} (expected 'stop' or 'length') or without its text"
                )
            samples.append(
                Sample(
                    text=choice["text"],
                    token_ids=tuple(ids),
                    token_logprobs=tuple(float(lp) for lp in logprobs),
                    finish_reason=finish,
                    prompt_tokens=prompt_tokens,
                )
            )
        return samples


def _load_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve(name).path)


def _excerpt(text: str, width: int = 40) -> str:
    """The head of a prompt, quoted: names it in errors independently of batch order."""
    return repr(text if len(text) <= width else text[:width] + "…")


def _usage_prompt_tokens(answer: dict) -> int:
    """The prompt's token count from an answer's ``usage`` (0 when the server gives none)."""
    usage = answer.get("usage")
    count = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return count if isinstance(count, int) else 0


def _choices(answer: Answer, n: int, what: str) -> list[dict]:
    """The ``n`` choices of a completions answer, in index order."""
    choices = answer.body.get("choices")
    if (
        not isinstance(choices, list)
        or len(choices) != n
        or not all(isinstance(c, dict) for c in choices)
    ):
        got = len(choices) if isinstance(choices, list) else "no"
        raise ServerResponseError(
            f"{what}: {answer.server} answered with {got} choices, expected {n}"
        )
    return sorted(choices, key=lambda c: c.get("index", 0))


def _ids_and_logprobs(choice: dict, what: str, server: str) -> tuple[list[int], list[object]]:
    """Token ids (from ``token_id:<id>`` token names) and log-prob entries of a choice's tokens,
    from an answer of ``server``."""
    logprobs = choice.get("logprobs")
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(values, list):
        raise MissingLogprobsError(
            f"{what}: {server} returned no token log-probs (`logprobs` in the "
            "completions answer); SePer needs each sample's log-probability — serve the model "
            "with vLLM, or use the hf / vllm backend"
        )
    tokens = logprobs.get("tokens")
    if (
        not isinstance(tokens, list)
        or len(tokens) != len(values)
        or not all(isinstance(t, str) and t.startswith(_TOKEN_ID_PREFIX) for t in tokens)
    ):
        raise ServerResponseError(
            f"{what}: {server} does not name tokens by id "
            "(vLLM's `return_tokens_as_token_ids`); this backend needs a vLLM-compatible server"
        )
    try:
        ids = [int(t.removeprefix(_TOKEN_ID_PREFIX)) for t in tokens]
    except ValueError:
        raise ServerResponseError(
            f"{what}: {server} sent a malformed token id"
        ) from None
    return ids, values


class OpenAITokenScorer(EngineTokenScorer):
    """Teacher-forced log-probs of continuations through a server's prompt log-probs.

    The interface of :class:`~ragutil_dagster.models.scoring.TokenScorer`'s ``score`` and
    ``score_ids`` (ConSens, likelihood utility), for a generator served by an OpenAI-compatible
    server: each (prompt, continuation) pair is sent as one token-id prompt with ``echo`` and
    ``logprobs: 0``, and the continuation's entries of the echoed log-probs are its scores —
    no local copy of the model. The echoed token ids are checked against the sent ones.
    Attention utility is unavailable (``supports_attention`` is False, ``attention_unavailable``
    says why: the capability flag the pipeline reads for every scorer).
    """

    attention_unavailable = ATTENTION_UNAVAILABLE

    def __init__(self, generator: OpenAIGenerator) -> None:
        if generator.tokenizer is None:
            raise CapabilityMissingError(
                "token scoring through a server needs the served model's `tokenizer` "
                "(continuations are scored token by token, with their token strings for ConSens)"
            )
        if not generator.probe_prompt_logprobs():
            raise CapabilityMissingError(
                "token scoring needs prompt log-probs, which "
                f"{', '.join(generator.client.shown_urls)} do not return"
            )
        super().__init__(generator)

    def score_ids(
        self, prompt_ids: Sequence[Sequence[int]], continuation_ids: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        """Log-probs (float32 arrays) of token-id continuations after token-id prompts."""
        same_length(prompt_ids, continuation_ids, "continuation_ids")
        pairs = list(zip(prompt_ids, continuation_ids, strict=True))
        for i, (prompt, continuation) in enumerate(pairs):
            if continuation and not prompt:
                raise ValueError(
                    f"prompt {i} has no tokens: the first continuation token needs context"
                )
        with tqdm(
            total=len(pairs),
            desc="scoring",
            unit="pair",
            disable=not self.show_progress or len(pairs) < 2,
        ) as bar:
            return map_concurrently(self._score_pair, pairs, self.generator.max_concurrency, bar)

    def _score_pair(
        self, index: int, pair: tuple[Sequence[int], Sequence[int]], cancelled: threading.Event
    ) -> np.ndarray:
        """The echoed log-probs of one continuation's tokens (one greedy token is generated
        too: some servers refuse ``max_tokens: 0``)."""
        prompt, continuation = list(pair[0]), list(pair[1])
        if not continuation:
            return np.zeros(0, dtype=np.float32)
        generator, what = self.generator, f"scoring pair {index}"
        sequence = prompt + continuation
        answer = generator.complete(sequence, what, max_tokens=1, echo=True, cancelled=cancelled)
        choice = _choices(answer, 1, what)[0]
        ids, values = _ids_and_logprobs(choice, what, answer.server)
        if ids[: len(sequence)] != sequence:
            raise ServerResponseError(
                f"{what}: {answer.server} echoed other prompt tokens than it was sent"
            )
        span = values[len(prompt) : len(sequence)]
        if any(not isinstance(v, int | float) for v in span):
            raise MissingLogprobsError(
                f"{what}: {answer.server} returned no log-prob for some prompt tokens"
            )
        return np.asarray(span, dtype=np.float32)

    def passage_attention(self, *_args: object, **_kwargs: object) -> list[np.ndarray]:
        """Attention utility is not available through a server (see ``attention_unavailable``)."""
        raise CapabilityMissingError(f"metric attention_utility: {ATTENTION_UNAVAILABLE}")

