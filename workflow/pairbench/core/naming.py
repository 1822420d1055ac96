"""The names of visits and of their validation retries, as they appear in paths and records.

A *visit* is one arm in one round: ``r03-candidate``. Its validation retry N (a partial visit of the
conditions whose validation earned one, :mod:`pairbench.validate.retries`) is ``r03-candidate.retry1``.
Every layer names them through here: the plan, the rules, the statistics and the report.
"""

from __future__ import annotations


def visit_id(round_: int, arm: str) -> str:
    return f"r{round_:02d}-{arm}"


def label(visit_id_: str, retry: int) -> str:
    """``r01-candidate`` for the visit itself, ``r01-candidate.retry1`` for its retry 1 (as in file names)."""
    return visit_id_ if not retry else f"{visit_id_}.retry{retry}"


def retry_number(body: dict) -> int:
    """0 for a visit's own measure/validate artifact, N for its retry N."""
    return int(body.get("retry", 0))


def measure_key(measure: dict) -> tuple[str, int]:
    """(visit id, retry) of a measure artifact."""
    return measure["visit"]["id"], retry_number(measure)


def validation_key(validation: dict) -> tuple[str, int]:
    """(visit id, retry) of a validate artifact: the same key as its measure artifact's."""
    return visit_id(validation["round"], validation["arm"]), retry_number(validation)
