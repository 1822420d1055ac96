"""Snakemake entry point of rules measure and measure_retry: one visit, or a validation retry's partial visit (pairbench.stages.measure)."""
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # this checkout's pairbench, never an installed copy
from pairbench.stages import measure, script  # noqa: E402

stage = measure.measure_retry_stage if snakemake.rule == "measure_retry" else measure.measure_stage
script.run(snakemake, stage, progress=True)
