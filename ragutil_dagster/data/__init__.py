"""Dataset loaders and the synthetic knowledge world."""
