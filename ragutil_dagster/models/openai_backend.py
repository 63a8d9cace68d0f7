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
  server restarted differently mid-run, a replica configured otherwise) is refused.
* **Several base URLs** form a fleet: prompt ``i`` goes first to replica ``i mod R``, and each
  retry of a failed request to the next replica.
* **Retries**: HTTP 429 and 5xx, timeouts and connection errors are retried with exponential
  backoff a bounded number of times; then one error names the server and the prompt index.
  Anything else (4xx, malformed JSON, missing log-probs) fails at once: retrying cannot fix it.
"""

from __future__ import annotations

import http.client
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


class _RetryableError(Exception):
    """One failed attempt worth retrying (429, 5xx, timeout, connection error)."""


class CompletionsClient:
    """JSON over HTTP to one model served by one or more OpenAI-compatible replicas.

    ``post`` spreads requests over the replicas, retries transient failures with exponential
    backoff (``retry_backoff`` × 2^attempt seconds, ``max_retries`` times) and raises one
    :class:`ServerUnavailableError` naming the server and the request. The API key is read once
    from the environment variable named ``api_key_env`` and masked in every message.
    """

    def __init__(
        self,
        base_urls: Sequence[str],
        *,
        api_key_env: str | None = None,
        timeout: float = 600.0,
        max_retries: int = 4,
        retry_backoff: float = 1.0,
    ) -> None:
        if not base_urls:
            raise ValueError("give at least one base_url")
        if max_retries < 0:
            raise ValueError(f"max_retries must be at least 0, got {max_retries}")
        self.base_urls = tuple(url.rstrip("/") for url in base_urls)
        self.api_key_env = api_key_env
        self._api_key = _read_api_key(api_key_env)
        self.timeout = timeout
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff

    def __repr__(self) -> str:
        return f"CompletionsClient(base_urls={self.shown_urls!r}, api_key_env={self.api_key_env!r})"

    @property
    def shown_urls(self) -> list[str]:
        """The base URLs with any credentials in them masked."""
        return [redact_uri(url) for url in self.base_urls]

    def mask(self, text: str) -> str:
        """``text`` with the API key and URI credentials masked."""
        if self._api_key:
            text = text.replace(self._api_key, MASK)
        return redact(text)

    def get(self, path: str) -> dict:
        """GET ``path`` from the first replica (retried like :meth:`post`)."""
        return self._with_retries(path, None, 0, f"GET {path}", None)

    def post(
        self,
        path: str,
        body: dict,
        replica: int,
        what: str,
        cancelled: threading.Event | None = None,
    ) -> dict:
        """POST ``body`` to ``path``, first on replica ``replica`` (mod R); ``what`` names the
        request in errors (e.g. ``"prompt 3"``). Once ``cancelled`` is set (another request of
        the same call gave up) no further retry is made."""
        return self._with_retries(path, body, replica, what, cancelled)

    def _with_retries(
        self,
        path: str,
        body: dict | None,
        replica: int,
        what: str,
        cancelled: threading.Event | None,
    ) -> dict:
        failures: list[str] = []
        for attempt in range(self.max_retries + 1):
            url = self.base_urls[(replica + attempt) % len(self.base_urls)]
            try:
                return self._request(url + path, body, what)
            except _RetryableError as err:
                failures.append(f"{redact_uri(url)}: {err}")
                if attempt == self.max_retries or (cancelled is not None and cancelled.is_set()):
                    break
                delay = self.retry_backoff * 2**attempt
                log.warning(
                    "%s failed (%s); retry %d/%d in %.1f s",
                    what,
                    self.mask(failures[-1]),
                    attempt + 1,
                    self.max_retries,
                    delay,
                )
                time.sleep(delay)
        raise ServerUnavailableError(
            self.mask(
                f"{what}: no answer from the OpenAI-compatible server after {len(failures)} "
                f"attempts ({'; '.join(failures[-2:])}); check that it is running, then re-run: "
                "stored samples are kept"
            )
        )

    def _request(self, url: str, body: dict | None, what: str) -> dict:
        """One HTTP exchange; transient failures raise :class:`_RetryableError`."""
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            detail = _error_detail(err)
            if err.code == 429 or err.code >= 500:
                raise _RetryableError(f"HTTP {err.code} {detail}") from None
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
    entries = listing.get("data")
    if not isinstance(entries, list):
        raise ServerResponseError(
            f"{client.shown_urls[0]}/v1/models has no `data` list: not an OpenAI-compatible server"
        )
    for entry in entries:
        if isinstance(entry, dict) and entry.get("id") == model:
            length = entry.get("max_model_len")
            return ServedModel(
                model, entry.get("root"), length if isinstance(length, int) else None
            )
    served = ", ".join(str(e.get("id")) for e in entries if isinstance(e, dict)) or "nothing"
    raise ServerResponseError(
        f"{client.shown_urls[0]} does not serve model {model!r} (it serves: {served}); "
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
        )
        self.model = model
        self.tokenizer = _load_tokenizer(tokenizer) if tokenizer is not None else None
        self.use_chat_template = use_chat_template
        self.system_prompt = system_prompt
        self.max_concurrency = max_concurrency
        self.show_progress = show_progress
        self.served = find_served_model(self.client, model)
        self._identity = identity or f"openai:{self.served.id}@{self.served.root or self.served.id}"
        self.server_fingerprint: str | None = None
        self.server_fingerprint = self.probe_sampling()
        if prompt_logprob_metrics and not self.probe_prompt_logprobs():
            raise CapabilityMissingError(
                f"metric(s) {', '.join(prompt_logprob_metrics)} need prompt log-probs (token "
                f"scoring), but {self.client.shown_urls[0]} returns none for `echo` with "
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
            index,
            f"counting the tokens of prompt {index}",
            cancelled,
        )
        count = answer.get("count")
        if not isinstance(count, int):
            raise ServerResponseError(
                f"{self.client.shown_urls[0]}/tokenize gave no token `count`; give the generator "
                "a local `tokenizer` to count prompt tokens"
            )
        return count

    def complete(
        self,
        prompt: list[int] | str,
        index: int,
        what: str,
        *,
        max_tokens: int,
        params: SamplingParams | None = None,
        seed: int = 0,
        echo: bool = False,
        cancelled: threading.Event | None = None,
    ) -> dict:
        """One ``/v1/completions`` request asking for sampled-token log-probs named by token id
        (greedy when no sampling ``params`` are given); the answer as parsed JSON, refused when
        it comes from a server configured otherwise than the probed one."""
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
        answer = self.client.post("/v1/completions", body, index, what, cancelled)
        fingerprint = answer.get("system_fingerprint")
        if self.server_fingerprint is not None and fingerprint != self.server_fingerprint:
            raise ServerResponseError(
                f"{what}: the server now reports system_fingerprint {fingerprint!r}, not "
                f"{self.server_fingerprint!r} as at start (restarted with another version or "
                "configuration, or a replica configured otherwise); re-run to sample under the "
                "new configuration"
            )
        return answer

    def probe_sampling(self) -> str | None:
        """One greedy token, checking the server returns its log-prob and id: SePer weighs
        every sample by p(r | q), so a server without them is refused before any sampling.
        Returns the server's ``system_fingerprint`` (None when it gives none)."""
        answer = self.complete(self.encode_prompts(["Hello"])[0], 0, "probe", max_tokens=1)
        self._samples(answer, 1, "probe")
        fingerprint = answer.get("system_fingerprint")
        return fingerprint if isinstance(fingerprint, str) else None

    def probe_prompt_logprobs(self) -> bool:
        """Whether the server returns prompt tokens' log-probs (``echo`` with ``logprobs``),
        which token scoring needs. A refused ``echo`` request counts as no."""
        prompt = self.encode_prompts(["Hello, world"])[0]
        try:
            answer = self.complete(prompt, 0, "probe of prompt log-probs", max_tokens=1, echo=True)
        except ServerResponseError as err:
            log.warning("prompt log-probs unavailable: %s", err)
            return False
        choice = _choices(answer, 1, "probe of prompt log-probs", self.client)[0]
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
                index,
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
        self, answer: dict, n: int, what: str, prompt: list[int] | str = ""
    ) -> list[Sample]:
        """The ``n`` samples of a completions answer; ``prompt_tokens`` are the sent ids, or
        the server's count (``usage``) for a text prompt."""
        prompt_tokens = len(prompt) if isinstance(prompt, list) else _usage_prompt_tokens(answer)
        samples = []
        for choice in _choices(answer, n, what, self.client):
            ids, logprobs = _ids_and_logprobs(choice, what, self.client)
            if any(not isinstance(lp, int | float) for lp in logprobs):
                raise MissingLogprobsError(
                    f"{what}: {self.client.shown_urls[0]} left sampled tokens without a log-prob"
                )
            finish = choice.get("finish_reason")
            if finish not in _FINISH_REASONS or not isinstance(choice.get("text"), str):
                raise ServerResponseError(
                    f"{what}: {self.client.shown_urls[0]} ended a completion with finish_reason "
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


def _choices(answer: dict, n: int, what: str, client: CompletionsClient) -> list[dict]:
    """The ``n`` choices of a completions answer, in index order."""
    choices = answer.get("choices")
    if (
        not isinstance(choices, list)
        or len(choices) != n
        or not all(isinstance(c, dict) for c in choices)
    ):
        got = len(choices) if isinstance(choices, list) else "no"
        raise ServerResponseError(
            f"{what}: {client.shown_urls[0]} answered with {got} choices, expected {n}"
        )
    return sorted(choices, key=lambda c: c.get("index", 0))


def _ids_and_logprobs(
    choice: dict, what: str, client: CompletionsClient
) -> tuple[list[int], list[object]]:
    """Token ids (from ``token_id:<id>`` token names) and log-prob entries of a choice's tokens."""
    logprobs = choice.get("logprobs")
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(values, list):
        raise MissingLogprobsError(
            f"{what}: {client.shown_urls[0]} returned no token log-probs (`logprobs` in the "
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
            f"{what}: {client.shown_urls[0]} does not name tokens by id "
            "(vLLM's `return_tokens_as_token_ids`); this backend needs a vLLM-compatible server"
        )
    try:
        ids = [int(t.removeprefix(_TOKEN_ID_PREFIX)) for t in tokens]
    except ValueError:
        raise ServerResponseError(
            f"{what}: {client.shown_urls[0]} sent a malformed token id"
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
                f"token scoring needs prompt log-probs, which {generator.client.shown_urls[0]} "
                "does not return"
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
        answer = generator.complete(
            sequence, index, what, max_tokens=1, echo=True, cancelled=cancelled
        )
        choice = _choices(answer, 1, what, generator.client)[0]
        ids, values = _ids_and_logprobs(choice, what, generator.client)
        if ids[: len(sequence)] != sequence:
            raise ServerResponseError(
                f"{what}: {generator.client.shown_urls[0]} echoed other prompt tokens than it "
                "was sent"
            )
        span = values[len(prompt) : len(sequence)]
        if any(not isinstance(v, int | float) for v in span):
            raise MissingLogprobsError(
                f"{what}: {generator.client.shown_urls[0]} returned no log-prob for some "
                "prompt tokens"
            )
        return np.asarray(span, dtype=np.float32)

    def passage_attention(self, *_args: object, **_kwargs: object) -> list[np.ndarray]:
        """Attention utility is not available through a server (see ``attention_unavailable``)."""
        raise CapabilityMissingError(f"metric attention_utility: {ATTENTION_UNAVAILABLE}")

