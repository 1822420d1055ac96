"""pairbench.engines.profiles."""
