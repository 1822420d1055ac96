"""Snakemake entry point for the `provenance` rule: write results/<label>/provenance.json (logic in pairbench.integrity.provenance)."""
import sys

sys.stderr = open(snakemake.log[0], "w")

from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(snakemake.scriptdir).parent))  # this checkout's pairbench, never an installed copy

from pairbench.integrity.provenance import write_provenance  # noqa: E402

sha = write_provenance(Path(snakemake.params.run_dir), Path(snakemake.output.provenance), snakemake.params.config_sha256,
                       Path(snakemake.input.plan), Path(snakemake.params.root))
print(f"provenance.json sha256 {sha}", file=sys.stderr)
