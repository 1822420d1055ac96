"""Publishing: what may leave the machine, and how it is checked.

- ``report``: the plain-language ``publish/README.md``; ``stats_section``: its statistics section,
  worded from the summary (``verify`` regenerates it).
- ``assemble``: what goes into the bundle (the run's files, patches and report).
- ``recompute``: ``verify``'s recomputation of every verdict from the bundle's measurements.
- ``landing``: the first page of ``snakemake --report``; ``htmlreport``: that page scrubbed and
  leak-gated for sharing (``python -m pairbench html-report``).
- ``envfacts``: the registry of machine facts and which of them are public.
- ``sanitize``: scrubbers and detectors for text; ``leakgate``: the fail-closed scan of a bundle.
- ``bundle``: the allowlisted, scrubbed, leak-gated bundle with its MANIFEST; ``verify``: its
  offline re-check (``python -m pairbench verify``).
"""
