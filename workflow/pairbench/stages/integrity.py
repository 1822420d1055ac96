"""The run's provenance (what produced it, every file's sha256) and its audit."""

from __future__ import annotations

import logging
from pathlib import Path

from pairbench.integrity.audit import run_audit
from pairbench.integrity.provenance import write_provenance

log = logging.getLogger("pairbench")


def provenance_stage(*, provenance: str, run_dir: str, config_sha256: str, plan: str, root: str) -> None:
    sha = write_provenance(Path(run_dir), Path(provenance), config_sha256, Path(plan), Path(root))
    log.info("provenance.json sha256 %s", sha)


def audit_stage(*, audit: str, run_dir: str, record_log: str) -> None:
    """Audit the run; the record (ok or not) also goes to *record_log*, which survives a failed job.
    A finding raises :class:`pairbench.integrity.audit.AuditFailed` naming the first one."""
    result = run_audit(run_dir=Path(run_dir), audit=audit, record=record_log)
    log.info("audit OK: %s", result.counts)
