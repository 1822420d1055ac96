"""Snakemake entry point for the `audit` rule: re-validate every artifact, walk the hash chain (logic in pairbench.integrity.audit)."""
import sys

sys.stderr = open(snakemake.log[0], "w")

from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(snakemake.scriptdir).parent))  # this checkout's pairbench, never an installed copy

from pairbench.integrity.audit import audit_run, write_audit  # noqa: E402

result = audit_run(Path(snakemake.params.run_dir))
for warning in result.warnings:
    print(f"warning: {warning}", file=sys.stderr)
for finding in result.findings:
    print(f"FAIL {finding}", file=sys.stderr)
if not result.ok:
    raise SystemExit(f"audit of {snakemake.params.run_dir} FAILED: {len(result.findings)} finding(s), first: "
                     f"{result.findings[0]}")
write_audit(result, snakemake.output.audit)
print(f"audit OK: {result.counts}", file=sys.stderr)
