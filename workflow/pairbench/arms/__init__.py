"""pairbench.arms."""
