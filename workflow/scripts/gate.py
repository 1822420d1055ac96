"""Snakemake entry point of rule gate: the run ends in the CI gate's decision (pairbench.stages.integrity)."""
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # this checkout's pairbench, never an installed copy
from pairbench.stages import integrity, script  # noqa: E402

script.run(snakemake, integrity.gate_stage)
