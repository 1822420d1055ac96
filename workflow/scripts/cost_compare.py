"""Snakemake entry point of rule cost_compare: the cost channel's verdicts beside wall time's (pairbench.stages.analysis)."""
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # this checkout's pairbench, never an installed copy
from pairbench.stages import analysis, script  # noqa: E402

script.run(snakemake, analysis.cost_compare_stage)
