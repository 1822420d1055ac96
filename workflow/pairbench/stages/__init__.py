"""pairbench.stages.run."""
