"""The embedded default: the synthetic knowledge world (ground-truth utility), the trainer of its
reader LM and answer-equivalence NLI."""
