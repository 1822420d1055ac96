"""Snakemake entry point for the `source` rule: export the arm's source pristine and apply its patches (the logic lives in pairbench.stages.run)."""
import sys

sys.stderr = open(snakemake.log[0], "w")

import logging  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(snakemake.scriptdir).parent))  # this checkout's pairbench, never an installed copy
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
logging.getLogger("httpx").setLevel(logging.WARNING)

from pairbench.stages import run as stages  # noqa: E402

stages.source_stage(
    snakemake.output.source, snakemake.output.tree, snakemake.wildcards.arm, snakemake.input.plan,
    snakemake.params.root,
)
