"""Snakemake entry point of checkpoints validate and validate_retry: the functional cases on one visit's records (pairbench.stages.validate)."""
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # this checkout's pairbench, never an installed copy
from pairbench.stages import validate, script  # noqa: E402

script.run(snakemake, validate.validate_stage)
