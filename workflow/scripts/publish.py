"""Snakemake entry point of rule publish: the report and the sanitized, leak-gated bundle (pairbench.stages.publish)."""
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # this checkout's pairbench, never an installed copy
from pairbench.stages import publish, script  # noqa: E402

script.run(snakemake, publish.publish_stage)
