"""Snakemake entry point of rule provenance: what produced the run, every file's sha256 (pairbench.stages.publish)."""
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # this checkout's pairbench, never an installed copy
from pairbench.stages import publish, script  # noqa: E402

script.run(snakemake, publish.provenance_stage)
