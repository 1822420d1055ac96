"""Snakemake entry point of checkpoint adapt: another block of rounds, or stop (pairbench.stages.analysis)."""
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # this checkout's pairbench, never an installed copy
from pairbench.stages import analysis, script  # noqa: E402

script.run(snakemake, analysis.adapt_stage)
