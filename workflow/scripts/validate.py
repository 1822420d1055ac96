"""Snakemake entry point for the `validate` and `validate_retry` rules: the functional cases on one visit's records (the logic lives in pairbench.stages.run)."""
import sys

sys.stderr = open(snakemake.log[0], "w")

import logging  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(snakemake.scriptdir).parent))  # this checkout's pairbench, never an installed copy
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
logging.getLogger("httpx").setLevel(logging.WARNING)

from pairbench.stages import run as stages  # noqa: E402

outputs = snakemake.input.outputs  # validate_retry: the retry's outputs folder, a single path
stages.validate_stage(
    snakemake.output.validate, snakemake.input.measure, [outputs] if isinstance(outputs, str) else list(outputs),
    list(snakemake.input.fixtures),
    list(snakemake.input.baseline_outputs), snakemake.params.cases, snakemake.params.options,
)
