"""Integrity: that a run can be trusted and resumed.

- ``audit``: every artifact re-validated and the hash chain walked (``python -m pairbench audit``).
- ``provenance``: what produced the run, down to every file's sha256.
- ``recovery``: crash hygiene for server-launching jobs (pid files, stale servers, dying with Snakemake).
"""
