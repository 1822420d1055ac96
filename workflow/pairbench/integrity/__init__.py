"""pairbench.integrity."""
