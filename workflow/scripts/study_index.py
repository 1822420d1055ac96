"""Snakemake entry point of rule study_index: the study's index page (pairbench.study.index)."""
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # this checkout's pairbench, never an installed copy
from pairbench.stages import script  # noqa: E402
from pairbench.study import index  # noqa: E402

script.run(snakemake, index.write_index)
