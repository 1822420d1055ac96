"""Snakemake entry point of rule retire: retries no longer in the run moved to private/superseded/ (pairbench.stages.validate)."""
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # this checkout's pairbench, never an installed copy
from pairbench.stages import validate, script  # noqa: E402

script.run(snakemake, validate.retire_stage)
