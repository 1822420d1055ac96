"""Stage 5: the functional cases on one visit's records (or one of its validation retries'), and
the retirement of retries that no longer belong to the run."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from pairbench.analysis.loadlevel import judged
from pairbench.core import naming
from pairbench.core.artifacts import read_artifact, sha256_file, write_artifact
from pairbench.core.layout import Layout
from pairbench.validate import cases as pb_cases
from pairbench.validate import retries

log = logging.getLogger("pairbench")


def validate_stage(*, validate: str, measure: str, plan: str, outputs: str | list[str], fixtures: list[str],
                   baseline_outputs: list[str], cases: list[str], options: dict) -> None:
    """Run the configured functional cases on every steady record of one visit, or of one of its
    validation retries (*outputs* is then the retry's outputs folder). A load level's gate result
    includes its validity, judged by the plan (pairbench.analysis.loadlevel.judged)."""
    measure_body = judged(read_artifact(measure, "measure"), read_artifact(plan, "plan"))
    output_paths = [str(f) for p in ([outputs] if isinstance(outputs, str) else outputs)
                    for f in (sorted(Path(p).glob("*.json")) if Path(p).is_dir() else [p])]
    inputs = {"measure": sha256_file(measure), "plan": sha256_file(plan)}

    def load(paths: list[str], kind: str, role: str) -> dict[str, dict]:
        out = {}
        for p in paths:
            body = read_artifact(p, kind)
            out[body["condition"]] = body
            inputs[f"{role}.{body['condition']}"] = sha256_file(p)
        return out

    fixture_bodies = load(fixtures, "fixture", "fixture")
    output_bodies = load(output_paths, "output", "output")
    base_outputs = load(baseline_outputs, "output", "baseline_output")
    records = []
    for rec in measure_body["records"]:
        cond, repeat = rec["condition"], int(rec.get("repeat", 1))
        fx = fixture_bodies[cond]
        out = output_for(output_bodies[cond], repeat)
        base = base_outputs.get(cond)  # the baseline's first repeat of the same round and condition
        verdicts = pb_cases.run_cases(
            cases, record=rec, output=out,
            fixture={"input_tokens": fx["input_tokens"], "output_tokens": fx["output_tokens"], "task": fx["task"]},
            baseline_output={"text": base["text"], "token_ids": base["token_ids"]} if base else None,
            options=options)  # every repeat is sandboxed on its own: the report counts each run
        # A failed request has no output hash in its record; its (empty) private output has one.
        entry = pb_cases.record_entry({**rec, "output_sha256": pb_cases.sha256_text(out["text"])}, fx, verdicts)
        entry.update({"ok": rec["ok"], "flags": list(rec["flags"])})  # retries are decided from this artifact
        if "repeat" in rec:
            entry["repeat"] = repeat
        records.append(entry)
        if not entry["selected"]:
            log.warning("%s %s%s not selected: %s", measure_body["visit"]["id"], cond,
                        f" repeat {repeat}" if "repeat" in rec else "", "; ".join(entry["excluded_because"]))
    retry = naming.retry_number(measure_body)
    write_artifact(validate, "validate", {
        "round": measure_body["visit"]["round"], "arm": measure_body["visit"]["arm"],
        "attempt": measure_body["attempt"], **({"retry": retry} if retry else {}),
        "cases": list(cases), "options": options, "records": records, "inputs": inputs})


def output_for(body: dict, repeat: int) -> dict:
    """The text and token ids of *repeat* (1 = first) from one condition's output artifact."""
    if repeat == 1:
        return {"text": body["text"], "token_ids": body["token_ids"]}
    for r in body.get("repeats", []):
        if r["repeat"] == repeat:
            return {"text": r["text"], "token_ids": r["token_ids"]}
    raise ValueError(f"output of visit {body['visit']} condition {body['condition']} has no repeat {repeat}")


def retire_stage(layout: Layout, *, retired: str, measures: list[str], validations: list[str],
                 chain: dict[str, int]) -> None:
    """Move every retry that is not in its visit's chain to ``private/superseded/<time>/`` and record
    each move in *retired* (``private/retired.json``), which the audit checks.

    A retry leaves the chain when the validation it came from was redone (a re-measured visit that
    now passes) or when the config asks for fewer retries (``validate.retries`` lowered, ``retry_on``
    narrowed). This is the one job that moves files it does not declare, and it moves only those:
    never a file of the chain (*measures*, *validations*), never deleting, and the record names each.
    """
    res = Path(layout.res)
    keep = {Path(p).resolve() for p in [*measures, *validations]}
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    moved = []
    for visit_id, last in sorted(chain.items()):
        for path in retries.later_retries(res, visit_id, last):
            if path.resolve() in keep:
                raise ValueError(f"retire: {path} is in the chain of {visit_id}, yet after its retry {last}")
            target = res / "private" / "superseded" / stamp / path.relative_to(res)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(path), str(target))
            moved.append({"visit": visit_id, "from": path.relative_to(res).as_posix(),
                          "to": target.relative_to(res).as_posix()})
            log.warning("%s: no longer part of the run (its validation was redone, or the config asks for fewer "
                        "retries); moved to %s", path, target)
    previous = read_artifact(retired, "retired")["moved"] if Path(retired).is_file() else []
    write_artifact(retired, "retired", {"moved": previous + moved, "chain": dict(sorted(chain.items())),
                                        "inputs": {f"chain.{Path(p).parent.name}.{Path(p).stem}": sha256_file(p)
                                                   for p in [*measures, *validations]}})
