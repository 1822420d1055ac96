"""Snakemake entry point of rule warmup: one arm launched once, first request, smoke check (pairbench.stages.measure)."""
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # this checkout's pairbench, never an installed copy
from pairbench.stages import measure, script  # noqa: E402

script.run(snakemake, measure.warmup_stage)
