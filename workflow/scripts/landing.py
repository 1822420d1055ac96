"""Snakemake entry point for the `landing` rule: the HTML report's verdict table and retry disclosure (logic in pairbench.publish.landing)."""
import sys

sys.stderr = open(snakemake.log[0], "w")

from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(snakemake.scriptdir).parent))  # this checkout's pairbench, never an installed copy

from pairbench.publish.landing import write_landing  # noqa: E402

write_landing(snakemake.input.paired, snakemake.input.measurements, snakemake.output.landing)
