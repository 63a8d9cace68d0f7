"""vLLM backend of the :class:`~ragutil_dagster.models.generation.Generator` protocol.

Needs the ``[vllm]`` extra (vLLM 0.31/0.32, which pin torch 2.13) and a GPU; vLLM is imported
only when a :class:`VLLMGenerator` is built, so the rest of the package works without it.
One request per prompt with ``SamplingParams(n=...)`` lets vLLM prefill each prompt once for its
n samples, and prefix caching shares the common prompt head (instructions, closed-book vs.
retrieved contexts) across requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ragutil_dagster.models.causal_lm import encode_prompts
from ragutil_dagster.models.generation import Sample, row_seed
from ragutil_dagster.models.identity import ModelRef, resolve_model
from ragutil_dagster.models.inputs import check_texts
from ragutil_dagster.sampling import SamplingParams

__all__ = ["VLLMGenerator", "vllm_available"]


def vllm_available() -> bool:
    """Whether vLLM can be imported here."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


class VLLMGenerator:
    """vLLM sampler with the model's own token log-probabilities.

    Log-probabilities are requested for the sampled token only (``logprobs=0``) in vLLM's
    ``raw_logprobs`` mode: log-softmax of the raw logits, before temperature, top-k/top-p or any
    logits processor — the model's own distribution, as for :class:`HFGenerator`. Prompts are
    tokenised exactly as the HF backend tokenises them and passed as token ids, and each
    request is seeded from (seed, prompt) so samples do not depend on batch-mates.

    Args:
        model: hub id, local directory or :class:`ModelRef`.
        dtype: vLLM dtype (``"auto"`` = the checkpoint's, usually bfloat16).
        use_chat_template, system_prompt: prompt formatting, as in :func:`load_causal_lm`.
        gpu_memory_utilization, max_model_len, tensor_parallel_size: vLLM engine settings.
        engine_kwargs: any further ``vllm.LLM`` arguments.
    """

    backend = "vllm"

    def __init__(
        self,
        model: str | ModelRef,
        *,
        revision: str | None = None,
        dtype: str = "auto",
        use_chat_template: bool = False,
        system_prompt: str | None = None,
        trust_remote_code: bool = False,
        gpu_memory_utilization: float = 0.85,
        max_model_len: int | None = None,
        tensor_parallel_size: int = 1,
        show_progress: bool = True,
        **engine_kwargs: Any,
    ) -> None:
        try:
            import vllm
        except ImportError as err:
            raise ImportError(
                "the vLLM backend needs the [vllm] extra: "
                "pip install -c constraints.txt 'ragutil-dagster[vllm]'"
            ) from err
        self.ref = model if isinstance(model, ModelRef) else resolve_model(model, revision)
        self.use_chat_template = use_chat_template
        self.system_prompt = system_prompt
        self.show_progress = show_progress
        self.llm = vllm.LLM(
            model=str(self.ref.path),
            tokenizer=str(self.ref.path),
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel_size,
            enable_prefix_caching=True,
            logprobs_mode="raw_logprobs",
            **engine_kwargs,
        )
        self.tokenizer = self.llm.get_tokenizer()
        if use_chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                f"model {self.ref.name} has no chat template, but the configuration asks to use one"
            )
        self._dtype = str(self.llm.model_config.dtype).removeprefix("torch.")

    @property
    def identity(self) -> str:
        return self.ref.identity

    @property
    def settings(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "identity": self.identity,
            "dtype": self._dtype,
            "chat_template": self.use_chat_template,
            "system_prompt": self.system_prompt,
        }

    @property
    def context_length(self) -> int | None:
        return self.llm.model_config.max_model_len

    def count_prompt_tokens(self, prompts: Sequence[str]) -> list[int]:
        encoded = encode_prompts(self.tokenizer, prompts, self.use_chat_template, self.system_prompt)
        return [len(ids) for ids in encoded]

    def sample(
        self,
        prompts: Sequence[str],
        n: int = 10,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        max_new_tokens: int = 512,
        stop: Sequence[str] = (),
        seed: int = 0,
    ) -> list[list[Sample]]:
        """``n`` samples per prompt; log-probs of the raw model distribution (see class doc)."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(n, temperature, top_p, top_k, max_new_tokens, tuple(stop), seed)
        prompts = check_texts(prompts, "prompts")
        if not prompts:
            return []
        encoded = encode_prompts(
            self.tokenizer, prompts, self.use_chat_template, self.system_prompt
        )
        requests = [TokensPrompt(prompt_token_ids=ids) for ids in encoded]
        per_prompt = [
            VSamplingParams(
                n=params.n,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,  # 0 disables, as in our SamplingParams
                max_tokens=params.max_new_tokens,
                stop=list(params.stop) or None,
                seed=row_seed(params.seed, prompt, 0) % (2**31),
                logprobs=0,
                skip_special_tokens=True,
            )
            for prompt in prompts
        ]
        outputs = self.llm.generate(
            requests, sampling_params=per_prompt, use_tqdm=self.show_progress
        )
        return [self._samples(out, len(ids)) for out, ids in zip(outputs, encoded, strict=True)]

    @staticmethod
    def _samples(request_output: Any, prompt_tokens: int) -> list[Sample]:
        samples = []
        for completion in sorted(request_output.outputs, key=lambda c: c.index):
            token_ids = tuple(int(t) for t in completion.token_ids)
            if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
                raise RuntimeError("vLLM returned no log-probability for some sampled tokens")
            logprobs = tuple(
                float(step[tok].logprob)
                for tok, step in zip(token_ids, completion.logprobs, strict=True)
            )
            if completion.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM request ended with {completion.finish_reason!r}")
            samples.append(
                Sample(
                    text=completion.text,
                    token_ids=token_ids,
                    token_logprobs=logprobs,
                    finish_reason=completion.finish_reason,
                    prompt_tokens=prompt_tokens,
                )
            )
        return samples
