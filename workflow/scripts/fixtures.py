"""Snakemake entry point for the `fixtures` rule: exact-length synthetic fixtures, checked by every arm's /tokenize (the logic lives in pairbench.stages.run)."""
import sys

sys.stderr = open(snakemake.log[0], "w")

import logging  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(snakemake.scriptdir).parent))  # this checkout's pairbench, never an installed copy
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
logging.getLogger("httpx").setLevel(logging.WARNING)

from pairbench.stages import run as stages  # noqa: E402

stages.fixtures_stage(
    list(snakemake.output.fixtures), list(snakemake.output.prompts), snakemake.input.plan,
    list(snakemake.input.builds), snakemake.params.arms, snakemake.params.arm_dirs, snakemake.params.server,
    snakemake.params.arm_configs, snakemake.log.server, snakemake.params.root,
)
