"""Model backends behind small protocols: generation, token scoring, NLI entailment, embedding.

Modules (imported explicitly; nothing heavy is loaded by importing the package):

* ``identity``: :func:`resolve_model` → :class:`ModelRef` (hub commit hash or directory
  fingerprint), :class:`ModelUnavailableError`.
* ``generation``: the :class:`Generator` protocol, :class:`Sample`, :class:`HFGenerator`;
  ``vllm_backend``: :class:`VLLMGenerator` (``[vllm]`` extra); ``cache``: the content-addressed
  :class:`GenerationCache` and :class:`CachedGenerator`.
* ``scoring``: :class:`TokenScorer` (teacher-forced log-probs, per-passage attention mass).
* ``entailment``: :class:`Entailment`, the ``entail`` callable of ``metrics.seper``.
* ``embedding``: :class:`Embedder`; ``rerank``: :class:`CrossEncoderReranker`.
* ``causal_lm``: loading a causal LM with its prompt formatting; ``device``: device/dtype choice.
* ``tiny``: tiny local models for tests and offline smoke runs; ``training``: the synthetic
  world's reader and NLI models.
"""
