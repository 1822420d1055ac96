"""Snakemake entry point for the `warmup` rule: launch, health, first-request diagnostic and smoke check (the logic lives in pairbench.stages.run)."""
import sys

sys.stderr = open(snakemake.log[0], "w")

import logging  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(snakemake.scriptdir).parent))  # this checkout's pairbench, never an installed copy
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
logging.getLogger("httpx").setLevel(logging.WARNING)

from pairbench.stages import run as stages  # noqa: E402

stages.warmup_stage(
    snakemake.output.warmup, snakemake.input.plan, snakemake.input.build, snakemake.wildcards.arm,
    snakemake.params.arm_dir, snakemake.params.arm_config, snakemake.params.server, snakemake.log.server,
    snakemake.params.root,
)
