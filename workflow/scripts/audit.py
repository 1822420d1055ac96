"""Snakemake entry point of rule audit: every artifact re-validated, the hash chain walked (pairbench.stages.integrity)."""
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # this checkout's pairbench, never an installed copy
from pairbench.stages import integrity, script  # noqa: E402

script.run(snakemake, integrity.audit_stage)
