"""The directories of a world build (``ragutil world build --out DIR``, and
``$RAGUTIL_HOME/embedded``, where ``embedded:<name>`` names resolve): one name per part."""

from __future__ import annotations

EMBEDDED_PREFIX = (
    "embedded:"  # a model name ``embedded:<part>`` names a part of $RAGUTIL_HOME/embedded
)

WORLD = "world"  # the synthetic world's BEIR folder and ground truth
READER = "reader"  # the reader LM trained on the world
WORLD_NLI = "world-nli"  # the small NLI trained on the world's answer values
ANSWER_NLI = "nli"  # the answer-equivalence NLI fine-tuned from all-MiniLM-L6-v2
# The answer NLI's training record, in its directory. Here, not beside the trainer: `ragutil run`
# looks for it before every run, and the trainer's module imports torch and transformers' model
# classes, which nothing else of an unchanged run needs.
ANSWER_NLI_RECORD = "ragutil_nli.json"
BUILD_RECORD = "build.json"

WORLD_ONLY_MODELS = (READER, WORLD_NLI)
"""Models trained on the synthetic world alone: valid on that world, not on other data."""
