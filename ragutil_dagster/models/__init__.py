"""Model backends behind small protocols: generation, token scoring, NLI entailment, embedding."""
