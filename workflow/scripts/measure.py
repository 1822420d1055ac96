"""Snakemake entry point for the `measure` rule: one visit: launch, first request, steady requests, gates, stop (the logic lives in pairbench.stages)."""
import sys

sys.stderr = open(snakemake.log[0], "w")

import logging  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(snakemake.scriptdir).parent))  # this checkout's pairbench, never an installed copy
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
logging.getLogger("httpx").setLevel(logging.WARNING)

from pairbench import stages  # noqa: E402

stages.measure_stage(
    snakemake.output.measure, list(snakemake.output.outputs), snakemake.output.marker, snakemake.input.plan, snakemake.input.build,
    list(snakemake.input.fixtures), list(snakemake.input.prompts), snakemake.params.visit,
    snakemake.params.arm_dir, snakemake.params.arm_config, snakemake.params.server, snakemake.log.server,
    snakemake.params.root,
)
