"""Snakemake entry point for the `stats` rule: measurements table, summary, flat tables (the logic lives in pairbench.stages.run)."""
import sys

sys.stderr = open(snakemake.log[0], "w")

import logging  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(snakemake.scriptdir).parent))  # this checkout's pairbench, never an installed copy
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
logging.getLogger("httpx").setLevel(logging.WARNING)

from pairbench.stages import run as stages  # noqa: E402

stages.stats_stage(
    snakemake.output.summary, snakemake.output.measurements, snakemake.output.summary_csv, snakemake.output.paired_csv,
    snakemake.output.ratios_csv, snakemake.output.timing_csv, snakemake.input.plan, list(snakemake.input.measures),
    list(snakemake.input.validations), snakemake.params.stats,
)
