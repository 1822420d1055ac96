"""Validation retries: which records of a visit are measured again, and which record then counts.

A visit ``r<NN>-<arm>`` is measured once (``measure/<visit>.json``) and validated once
(``validate/<visit>.json``). When a record's exclusion is of a kind listed in ``validate.retry_on``
and the visit has retries left (``validate.retries``), retry 1 re-measures just those lengths (a
partial visit, its own job: ``measure/<visit>.retry1.json``, outputs under
``private/outputs/<visit>.retry1/``) and validates them (``validate/<visit>.retry1.json``); retry 2
follows retry 1 the same way, and so on. Nothing is overwritten: the original record stays in its
artifact and in ``tables/measurements.csv``, marked *superseded*, and the report lists every retry
with the reason it was made.

The kinds (``RETRY_ON``):

- ``timeout``: a case's verdict was ``timeout`` (the validator ran out of time; a fault of the
  validator or a loaded machine, not evidence about the output);
- ``fail``: a case's verdict was ``fail``;
- ``gate``: the record failed a measurement gate (``ok`` false: token counts, cold cache).

A record is retried only when every reason for its exclusion is of a listed kind.

A retry's records replace the earlier records of the same (round, arm, length): the latest retry
that measured a record is the one the statistics may use (if it, too, is selected).
"""

from __future__ import annotations

RETRY_ON: tuple[str, ...] = ("timeout", "fail", "gate")


def retry_number(body: dict) -> int:
    """0 for a visit's own measure/validate artifact, N for its retry N."""
    return int(body.get("retry", 0))


def exclusion_kinds(entry: dict) -> dict[str, list[str]]:
    """Why one record was excluded, by kind: ``{"gate"|"fail"|"timeout": [reason, ...]}``.

    *entry* is the record's entry in the validate artifact, which carries the measure record's
    gate result (``ok``, ``flags``) beside the case verdicts. Empty for a selected record.
    """
    kinds: dict[str, list[str]] = {}
    if not entry.get("ok", True):
        kinds["gate"] = [f"gate {flag}" for flag in entry.get("flags", [])] or ["gate failed"]
    for case, v in entry["verdicts"].items():
        if v["verdict"] in ("fail", "timeout"):
            kinds.setdefault(v["verdict"], []).append(f"case {case} {v['verdict']}: {v['reason']}")
    return kinds


def retry_reasons(validation: dict, retry_on: list[str] | tuple[str, ...]) -> dict[int, dict]:
    """``{length: {"reason": why, "kinds": [...]}}`` for each record of a validate artifact that
    earns a retry under *retry_on*.

    A record earns one when it was excluded and *every* reason of its exclusion is of a kind in
    *retry_on*: with the default ``[timeout]``, an output that timed out its tests is measured
    again, but not one that also failed a case or a gate (a deterministic engine would only repeat
    it). Decided from the validate artifact alone (it carries the gates too), so the pipeline can
    decide before it reads anything else.
    """
    unknown = sorted(set(retry_on) - set(RETRY_ON))
    if unknown:
        raise ValueError(f"validate.retry_on: unknown kind(s) {unknown}; known: {list(RETRY_ON)}")
    out: dict[int, dict] = {}
    per_length: dict[int, int] = {}
    for entry in validation["records"]:
        per_length[entry["length"]] = per_length.get(entry["length"], 0) + 1
    for entry in validation["records"]:
        kinds = exclusion_kinds(entry)
        if kinds and set(kinds) <= set(retry_on):
            # with repeats, one length has several records: the retry re-measures the whole length,
            # and the reason names the repeat (with one request per length there is nothing to name)
            why = "; ".join(why for k in sorted(kinds) for why in kinds[k])
            if "repeat" in entry and per_length[entry["length"]] > 1:
                why = f"repeat {entry['repeat']}: {why}"
            prev = out.get(entry["length"])
            out[entry["length"]] = {"reason": f"{prev['reason']}; {why}" if prev else why,
                                    "kinds": sorted(set(kinds) | set(prev["kinds"] if prev else []))}
    return out


KIND_LABELS = {"timeout": "validator timeout", "fail": "case failure", "gate": "gate failure"}


def kind_of(kinds: list[str]) -> str:
    """A short label of a retry's kinds, e.g. ``validator timeout`` or ``gate failure + validator timeout``."""
    return " + ".join(sorted(KIND_LABELS[k] for k in kinds)) or "other"


def label(visit_id: str, retry: int) -> str:
    """``r01-candidate`` for the visit itself, ``r01-candidate.retry1`` for its retry 1 (as in file names)."""
    return visit_id if not retry else f"{visit_id}.retry{retry}"


def measure_key(measure: dict) -> tuple[str, int]:
    """(visit id, retry) of a measure artifact."""
    return measure["visit"]["id"], retry_number(measure)


def validation_key(validation: dict) -> tuple[str, int]:
    """(visit id, retry) of a validate artifact: the same key as its measure artifact's."""
    return f"r{validation['round']:02d}-{validation['arm']}", retry_number(validation)


def later_retries(res_dir, visit_id: str, n: int) -> list:
    """Existing files of a visit's retries after retry *n* (n = 0: all of them): the measure and
    validate artifacts (``<stage>/<visit>.retry<N>.json``) and the outputs folders
    (``private/outputs/<visit>.retry<N>``). One folder level deep, so never what
    ``private/superseded/`` already holds.

    They derive from a validation that was redone, or the config asks for fewer retries, so they no
    longer belong to the run; the retire stage moves them under ``private/superseded/`` (kept,
    never deleted) and records each move in ``private/retired.json``.
    """
    from pathlib import Path

    res = Path(res_dir)
    found = []
    for path in sorted(res.glob(f"*/{visit_id}.retry*.json")) + sorted(res.glob(f"private/*/{visit_id}.retry*")):
        tail = path.name.removeprefix(f"{visit_id}.retry").removesuffix(".json")
        if tail.isdigit() and int(tail) > n:
            found.append(path)
    return found

