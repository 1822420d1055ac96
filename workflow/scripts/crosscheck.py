"""Snakemake entry point of rule crosscheck: the engine's own benchmark for one arm (pairbench.stages.measure)."""
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # this checkout's pairbench, never an installed copy
from pairbench.stages import measure, script  # noqa: E402

script.run(snakemake, measure.crosscheck_stage)
