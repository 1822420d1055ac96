"""Snakemake entry point of rule fixtures: every length's frozen fixture, checked by every arm's tokenizer (pairbench.stages.measure)."""
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # this checkout's pairbench, never an installed copy
from pairbench.stages import measure, script  # noqa: E402

script.run(snakemake, measure.fixtures_stage)
