"""Snakemake entry point of rule provenance: what produced the run, every file's sha256 (pairbench.stages.integrity)."""
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # this checkout's pairbench, never an installed copy
from pairbench.stages import integrity, script  # noqa: E402

script.run(snakemake, integrity.provenance_stage)
