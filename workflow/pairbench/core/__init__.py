"""Core: what every stage stands on.

- ``artifacts``: versioned, schema-checked JSON artifacts, written atomically, with sha256 helpers.
- ``config``: the checks a JSON Schema cannot express, and resolved views of the config.
- ``plan``: the run plan (arms, lengths, the counterbalanced visit order, salts, the config hash).
- ``cache``: the user's pairbench cache folder (made-once things shared across runs).
- ``trees``: a folder tree's sha256 manifest and one hash over it (an arm's source; the audit).
- ``steps``: the one step runner (a subprocess as a named step: logged, recorded, its failure named).
"""
