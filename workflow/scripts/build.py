"""Snakemake entry point for the `build` rule: byte-compile, convert the model (cached), read the native version (the logic lives in pairbench.stages.run)."""
import sys

sys.stderr = open(snakemake.log[0], "w")

import logging  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(snakemake.scriptdir).parent))  # this checkout's pairbench, never an installed copy
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
logging.getLogger("httpx").setLevel(logging.WARNING)

from pairbench.stages import run as stages  # noqa: E402

stages.build_stage(
    snakemake.output.build, snakemake.input.source, snakemake.wildcards.arm, snakemake.params.arm_dir,
    snakemake.params.model, snakemake.params.cache_dir, snakemake.log.steps, snakemake.params.root,
)
