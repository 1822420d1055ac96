"""Publishing: what may leave the machine, and how it is checked.

- ``report``: the plain-language ``publish/README.md`` (the statistics section included).
- ``landing``: the first page of ``snakemake --report``.
- ``envfacts``: the registry of machine facts and which of them are public.
- ``sanitize``: scrubbers and detectors for text; ``leakgate``: the fail-closed scan of a bundle.
- ``bundle``: the allowlisted, scrubbed, leak-gated bundle with its MANIFEST; ``verify``: its
  offline re-check (``python -m pairbench verify``).
"""
