"""Snakemake entry point of rule crosscheck_compare: the tool against pairbench's verdicts (pairbench.stages.analysis)."""
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # this checkout's pairbench, never an installed copy
from pairbench.stages import analysis, script  # noqa: E402

script.run(snakemake, analysis.crosscheck_compare_stage)
