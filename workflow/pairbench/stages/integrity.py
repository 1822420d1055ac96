"""The run's provenance (what produced it, every file's sha256) and its audit."""

from __future__ import annotations

import logging
from pathlib import Path

from pairbench.core.artifacts import write_artifact
from pairbench.core.layout import Layout
from pairbench.integrity.audit import run_audit
from pairbench.integrity.gate import check_run
from pairbench.integrity.provenance import write_provenance
from pairbench.publish.gateviews import junit, markdown

log = logging.getLogger("pairbench")


def provenance_stage(*, provenance: str, run_dir: str, config_sha256: str, plan: str, root: str) -> None:
    sha = write_provenance(Path(run_dir), Path(provenance), config_sha256, Path(plan), Path(root))
    log.info("provenance.json sha256 %s", sha)


def audit_stage(*, audit: str, run_dir: str, record_log: str) -> None:
    """Audit the run; the record (ok or not) also goes to *record_log*, which survives a failed job.
    A finding raises :class:`pairbench.integrity.audit.AuditFailed` naming the first one."""
    result = run_audit(run_dir=Path(run_dir), audit=audit, record=record_log)
    log.info("audit OK: %s", result.counts)


class GateFailed(Exception):
    """The gate did not pass: its exit status and reason (``python -m pairbench gate`` says the same)."""


def gate_stage(layout: Layout, *, gate: str, markdown_log: str, junit_log: str) -> None:
    """End the run *layout* describes in the CI gate (:func:`pairbench.integrity.gate.check_run`): its
    Markdown summary and JUnit XML go to the logs, which survive a failed job; *gate* (the record) is
    written only when the gate passes, and any other decision fails the job with its exit status and reason."""
    result = check_run(layout.res)
    Path(markdown_log).write_text(markdown(result.record))
    Path(junit_log).write_text(junit(result.record))
    if result.exit_code != 0:
        raise GateFailed(f"pairbench gate: {result.record['decision']} (exit {result.exit_code}): {result.reason}")
    write_artifact(gate, "gate", {k: v for k, v in result.record.items() if k != "schema"})
    log.info("gate passed: %s", result.reason)
