"""Validation retries: which records of a visit are measured again, and which record then counts.

A visit ``r<NN>-<arm>`` is measured once (``measure/<visit>.json``) and validated once
(``validate/<visit>.json``). When a record's exclusion is of a kind listed in ``validate.retry_on``
and the visit has retries left (``validate.retries``), retry 1 re-measures them (a
partial visit of just those conditions, its own job: ``measure/<visit>.retry1.json``, outputs under
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

A retry's records replace the earlier records of the same (round, arm, condition): the latest retry
that measured a record is the one the statistics may use (if it, too, is selected).
"""

from __future__ import annotations

RETRY_ON: tuple[str, ...] = ("timeout", "fail", "gate")


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


def retry_reasons(validation: dict, retry_on: list[str] | tuple[str, ...]) -> dict[str, dict]:
    """``{condition id: {"reason": why, "kinds": [...]}}`` for each record of a validate artifact
    that earns a retry under *retry_on*.

    A record earns one when it was excluded and *every* reason of its exclusion is of a kind in
    *retry_on*: with the default ``[timeout]``, an output that timed out its tests is measured
    again, but not one that also failed a case or a gate (a deterministic engine would only repeat
    it). Decided from the validate artifact alone (it carries the gates too), so the pipeline can
    decide before it reads anything else.
    """
    unknown = sorted(set(retry_on) - set(RETRY_ON))
    if unknown:
        raise ValueError(f"validate.retry_on: unknown kind(s) {unknown}; known: {list(RETRY_ON)}")
    out: dict[str, dict] = {}
    per_condition: dict[str, int] = {}
    for entry in validation["records"]:
        per_condition[entry["condition"]] = per_condition.get(entry["condition"], 0) + 1
    for entry in validation["records"]:
        kinds = exclusion_kinds(entry)
        if kinds and set(kinds) <= set(retry_on):
            # with repeats, one condition has several records: the retry re-measures the whole
            # condition, and the reason names the repeat (with one request there is nothing to name)
            why = "; ".join(why for k in sorted(kinds) for why in kinds[k])
            if "repeat" in entry and per_condition[entry["condition"]] > 1:
                why = f"repeat {entry['repeat']}: {why}"
            prev = out.get(entry["condition"])
            out[entry["condition"]] = {"reason": f"{prev['reason']}; {why}" if prev else why,
                                       "kinds": sorted(set(kinds) | set(prev["kinds"] if prev else []))}
    return out


KIND_LABELS = {"timeout": "validator timeout", "fail": "case failure", "gate": "gate failure"}


def kind_of(kinds: list[str]) -> str:
    """A short label of a retry's kinds, e.g. ``validator timeout`` or ``gate failure + validator timeout``."""
    return " + ".join(sorted(KIND_LABELS[k] for k in kinds)) or "other"


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

