"""HTTP to OpenAI-compatible servers (``vllm serve`` and compatible ones): the client the
``openai`` generator backend (:mod:`ragutil_dagster.models.openai_backend`) sends its requests
through, the server's model listing, and concurrent calls.

**Several base URLs** form a fleet (:class:`CompletionsClient`): a request goes to the healthy
replica with the fewest requests in flight, a failed attempt (HTTP 429 and 5xx, timeouts,
connection errors) is retried at once on another replica, a replica that failed is left out
and re-probed later, and after a bounded number of attempts one error names every replica.
Anything else (4xx, malformed JSON) fails at once, naming the replica: retrying cannot fix it.
The API key is read from an environment variable and masked in every message.
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
from http import HTTPStatus
from typing import Any, TypeVar

from tqdm.auto import tqdm

from ragutil_dagster.errors import MissingAPIKeyError, ServerResponseError, ServerUnavailableError
from ragutil_dagster.infra.redaction import MASK, redact, redact_uri

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

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
    * **Failover**: a failed attempt (connection error, timeout, 5xx but 501, 429) is retried at
      once on a healthy replica this request has not tried; when none is left, after
      ``retry_backoff`` × 2^k seconds on the best remaining one (a replica left out included). At
      most ``max_retries`` retries, then one :class:`ServerUnavailableError` naming every replica
      with its last failure.
    * **Health**: a replica failing with a connection error, a timeout or a retried 5xx is left
      out of the rotation; ``reprobe_seconds`` later the next request re-probes it (``GET
      /v1/models``, at most 10 s) and it rejoins when it answers.

    Answers that are not JSON objects, and 4xx and 501 (Not Implemented) refusals, fail at once
    (:class:`ServerResponseError` naming the replica, with the refusal's HTTP ``status``):
    retrying cannot fix them, and a fleet answering otherwise on one replica is misconfigured. The
    API key is read once from the environment variable named ``api_key_env`` and masked in every
    message.
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
                    r.shown,
                    r.down_until is None,
                    r.outstanding,
                    r.answered,
                    r.failed,
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
                        what,
                        attempts + 1,
                        self.max_retries + 1,
                        replica.shown,
                        delay,
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
                        r
                        for r in self._replicas
                        if r.down_until is not None and r.down_until <= now and not r.probing
                    ),
                    None,
                )
                if due is None:
                    healthy = [i for i, r in enumerate(self._replicas) if r.down_until is None]
                    fresh = [i for i in healthy if i not in tried]
                    pool = (
                        fresh
                        or healthy
                        or [
                            min(
                                range(len(self._replicas)),
                                key=lambda i: self._replicas[i].down_until,
                            )
                        ]
                    )
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
                replica.shown,
                self.mask(failure),
                self.reprobe_seconds,
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
        whom = (
            "the server" if len(self._replicas) == 1 else f"any of {len(self._replicas)} replicas"
        )
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
            # 501 Not Implemented is no transient failure: the server has no such endpoint.
            if err.code == 429 or (err.code >= 500 and err.code != HTTPStatus.NOT_IMPLEMENTED):
                raise _RetryableError(
                    f"HTTP {err.code} {detail}", replica_down=err.code != 429
                ) from None
            raise ServerResponseError(
                self.mask(
                    f"{what}: {redact_uri(url)} refused the request with HTTP {err.code}: {detail}"
                ),
                status=err.code,
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
