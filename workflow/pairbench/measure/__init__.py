"""pairbench.measure.visit."""
