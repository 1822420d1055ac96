"""pairbench.validate.cases."""
