"""pairbench.analysis."""
