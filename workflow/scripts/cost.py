"""Snakemake entry point of rule cost: every arm counted under a simulator (pairbench.stages.measure)."""
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # this checkout's pairbench, never an installed copy
from pairbench.stages import measure, script  # noqa: E402

script.run(snakemake, measure.cost_stage)
