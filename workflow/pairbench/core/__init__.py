"""Core: what every stage stands on.

- ``artifacts``: versioned, schema-checked JSON artifacts, written atomically, with sha256 helpers.
- ``config``: the checks a JSON Schema cannot express, and resolved views of the config.
- ``plan``: the run plan (arms, lengths, the counterbalanced visit order, salts, the config hash).
- ``cache``: the user's pairbench cache folder (made-once things shared across runs).
"""
