"""Snakemake entry point for the `audit` rule: re-validate every artifact, walk the hash chain (logic in pairbench.integrity.audit)."""
import sys

sys.stderr = open(snakemake.log[0], "w")

from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(snakemake.scriptdir).parent))  # this checkout's pairbench, never an installed copy

from pairbench.integrity.audit import AuditFailed, run_audit  # noqa: E402

try:
    result = run_audit(run_dir=Path(snakemake.params.run_dir), audit=snakemake.output.audit,
                       record=snakemake.log.record)
except AuditFailed as exc:
    raise SystemExit(str(exc)) from None
print(f"audit OK: {result.counts}", file=sys.stderr)
