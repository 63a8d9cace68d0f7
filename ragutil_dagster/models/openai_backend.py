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
* **Several base URLs** form a fleet, served by :mod:`ragutil_dagster.models.openai_client`
  (routing, retries on another replica, health, errors); a request's seed is a property of the
  request (a hash of the run's seed and the prompt), so where it is served, or re-served after a
  replica died, does not change its samples.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ragutil_dagster.errors import (
    CapabilityMissingError,
    MissingLogprobsError,
    ServerResponseError,
    ServerUnavailableError,
    UserError,
)
from ragutil_dagster.models.causal_lm import encode_prompts
from ragutil_dagster.models.generation import Sample, row_seed
from ragutil_dagster.models.inputs import check_texts
from ragutil_dagster.models.openai_client import (
    Answer,
    CompletionsClient,
    find_served_model,
    map_concurrently,
)
from ragutil_dagster.models.resolver import resolve
from ragutil_dagster.models.token_scoring import EngineTokenScorer, scorable_pairs
from ragutil_dagster.sampling import SamplingParams

__all__ = [
    "ATTENTION_UNAVAILABLE",
    "OpenAIGenerator",
    "OpenAITokenScorer",
]

log = logging.getLogger(__name__)

ATTENTION_UNAVAILABLE = (
    "attention utility needs the model's attention weights, which an OpenAI-compatible server "
    "does not return; score it with the hf backend"
)
_TOKEN_ID_PREFIX = "token_id:"
# vLLM seeds sample j of a request with seed + j, as a signed 32-bit integer on some paths: the
# in-process backend's range, so a server and the in-process engine draw the same samples.
_SEED_RANGE = 2**31 - 2**16
_FINISH_REASONS = ("stop", "length")


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
        # vLLM's server refuses n > 1 at temperature 0: greedy decoding has one answer, asked
        # once and given n times (the engine backends return n identical answers too).
        greedy_copies = params.n if params.temperature == 0 else 1
        request = dataclasses.replace(params, n=1) if greedy_copies > 1 else params

        def one(index: int, prompt: list[int] | str, cancelled: threading.Event) -> list[Sample]:
            what = f"prompt {index} ({_excerpt(prompts[index])})"
            answer = self.complete(
                prompt,
                what,
                max_tokens=request.max_new_tokens,
                params=request,
                seed=row_seed(request.seed, prompts[index], 0) % _SEED_RANGE + request.first_index,
                cancelled=cancelled,
            )
            return self._samples(answer, request.n, what, prompt) * greedy_copies

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
        raise ServerResponseError(f"{what}: {server} sent a malformed token id") from None
    return ids, values


class OpenAITokenScorer(EngineTokenScorer):
    """Teacher-forced log-probs of continuations through a server's prompt log-probs.

    The interface of :class:`~ragutil_dagster.models.token_scoring.TokenScorer`'s ``score`` and
    ``score_ids`` (ConSens, likelihood utility), for a generator served by an OpenAI-compatible
    server: each (prompt, continuation) pair is sent as one token-id prompt with ``echo`` and
    ``logprobs: 0``, and the continuation's entries of the echoed log-probs are its scores —
    no local copy of the model. The echoed token ids are checked against the sent ones.
    Attention utility is unavailable (``supports_attention`` is False, ``attention_unavailable``
    says why: the capability flag the pipeline reads for every scorer).
    """

    attention_unavailable = ATTENTION_UNAVAILABLE

    def __init__(self, generator: OpenAIGenerator, show_progress: bool = True) -> None:
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
        super().__init__(generator, show_progress)

    def score_ids(
        self, prompt_ids: Sequence[Sequence[int]], continuation_ids: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        """Log-probs (float32 arrays) of token-id continuations after token-id prompts."""
        scorable_pairs(prompt_ids, continuation_ids)
        pairs = list(zip(prompt_ids, continuation_ids, strict=True))
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
