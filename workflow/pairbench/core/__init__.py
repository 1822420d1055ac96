"""pairbench.core."""
