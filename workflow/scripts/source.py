"""Snakemake entry point of rule source: one arm's pristine export, patches checked then applied (pairbench.stages.prepare)."""
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # this checkout's pairbench, never an installed copy
from pairbench.stages import prepare, script  # noqa: E402

script.run(snakemake, prepare.source_stage)
