"""pairbench.publish.bundle."""
