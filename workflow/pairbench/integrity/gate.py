"""The gate over a finished run folder: what ``python -m pairbench gate RESULTS_DIR`` decides.

The decision itself is made once, when the run is published (:func:`pairbench.publish.gate.decide`
writes the bundle's ``gate.json``). Before a CI job acts on it, :func:`check_run` makes sure the
folder is a finished, intact run of the config at hand; anything else is the decision ``invalid``
(exit status 3) with a reason naming the culprit:

1. with a config (the one the CI job ran): every git arm's ref resolves now, from a readable
   repository and a clean checkout, and no two arms are one commit (named even when the run never
   started: a ref that does not resolve stops the pipeline before anything is written);
2. the run finished: ``plan.json``, ``stats/summary.json``, the bundle (``publish/MANIFEST.json``,
   ``publish/gate.json``) and a passing ``audit.json`` are there; with the config, the run is of
   it, by its label and the whole config's hash that ``provenance.json`` records (a results folder
   from another config, or from before the config changed), and every git arm's ref still names the
   commit its ``source/<arm>.json`` exported (a moved branch: the run measured older code);
3. the bundle verifies (:func:`pairbench.publish.verify.verify_bundle`: every hash, schema and
   verdict, the gate recomputed from the bundle's own measurements; and with this run folder, the
   cost channel's verdicts ``stats/cost.json`` recomputed from ``cost/<arm>.json`` and the rest);
4. the decision recomputed from ``stats/summary.json`` and ``stats/cost.json`` (when the run has the
   cost channel) under the policy (the config's, else the one recorded) is the published
   ``gate.json``, so what CI acts on is what was published.

Then the result is the published record, whose ``exit_code`` and ``reason`` the command returns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pairbench.arms.source import git_problems
from pairbench.core import plan as pb_plan
from pairbench.core.artifacts import ArtifactError, read_artifact, schema_id
from pairbench.core.layout import Layout
from pairbench.publish import gate as pb_gate
from pairbench.publish.verify import verify_bundle

GATE_FILE = "gate.json"  # in the bundle


@dataclass(frozen=True)
class GateResult:
    """The gate record a CI job acts on (``gate.json``'s body) and where it came from."""

    record: dict
    published: bool  # the bundle's record (False: made here, for a run that could not be judged)

    @property
    def exit_code(self) -> int:
        return self.record["exit_code"]

    @property
    def reason(self) -> str:
        return self.record["reason"]


def invalid_record(label: str, problems: list[str], policy: dict | None = None, summary: dict | None = None) -> dict:
    """A schema-valid ``invalid`` record for a run that cannot be judged (no cells, no arms)."""
    params = (summary or {}).get("params") or {}
    if policy is None:
        policy = {"metrics": list(params.get("primary", [])), "conditions": None,
                  "fail_slower_than": params.get("noise"), "inconclusive": "pass", "cost_metrics": []}
    return {"schema": schema_id("gate"), "label": label, "policy": policy, "decision": "invalid",
            "exit_code": pb_gate.EXIT["invalid"], "problems": problems,
            "reason": f"the run is not valid: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
            "baseline": (summary or {}).get("baseline", "baseline"), "candidates": list((summary or {}).get("candidates", [])),
            "cells": [], "cost": None, "arms": {}, "host": dict.fromkeys(pb_gate.HOST_FACTS), "report": pb_gate.REPORT,
            "stats": {k: params.get(k) for k in ("alpha", "noise", "multiplicity")},
            "rounds": {"planned": None, "run": None, "adaptive": None, "stopped_by": None}, "inputs": {}}


def _read(path: str, kind: str, what: str, problems: list[str]) -> dict | None:
    if not Path(path).is_file():
        problems.append(f"{path}: missing ({what})")
        return None
    try:
        return read_artifact(path, kind)
    except ArtifactError as exc:
        problems.append(str(exc))
        return None


def _finished(L: Layout) -> tuple[dict | None, dict | None, list[str]]:
    """(plan, summary, problems) of a run folder that should be finished and audited."""
    problems: list[str] = []
    if not Path(L.res).is_dir():
        return None, None, [f"{L.res}: no such run folder"]
    plan = _read(L.plan, "plan", "not a pairbench run folder", problems)
    summary = _read(L.summary, "summary", "the run did not reach its statistics", problems)
    for path, what in ((L.manifest, "the run was not published"),
                       (f"{L.bundle}/{GATE_FILE}", "the bundle holds no gate decision")):
        if not Path(path).is_file():
            problems.append(f"{path}: missing ({what})")
    audit = _read(L.audit, "audit", "the run was not audited to the end: run snakemake to the end", problems)
    if audit is not None and not audit.get("ok"):
        problems.append(f"{L.audit}: the audit failed ({len(audit.get('findings', []))} finding(s))")
    return plan, summary, problems


def ref_problems(config: dict, root: Path) -> tuple[dict, list[str]]:
    """``({arm: GitRef}, problems)``: every git arm's ref resolved now, and why one cannot be (a ref
    that does not resolve, a repository that cannot be read, a dirty checkout, two refs of one commit)."""
    refs, found = git_problems(config["arms"], root)
    return refs, [f"{'.'.join(map(str, key))}: {message}" for key, message in found]


def config_problems(L: Layout, plan: dict, config: dict, refs: dict) -> list[str]:
    """Is this run folder of *config* (normalized, as the pipeline reads it), and of the commits its
    refs name now (*refs*: :func:`ref_problems`)? A moved ref first, the config's hash then."""
    if plan["label"] != config["label"]:
        return [f"{L.res} is the run labelled {plan['label']!r}, the config's label is {config['label']!r}"]
    problems = []
    for name, ref in refs.items():
        recorded = _read(L.source(name), "source", "the arm was not exported", problems)
        done = (recorded or {}).get("git") or {}
        if recorded is not None and done.get("commit") != ref.commit:
            problems.append(f"arms.{name}.source: {ref.ref!r} names {ref.commit[:12]} now, but the run measured "
                            f"{str(done.get('commit'))[:12]}: run snakemake again to measure it")
    prov = _read(L.provenance, "provenance", "the run was not recorded", problems)
    if prov is not None and prov["config_sha256"] != pb_plan.full_config_sha256(config):
        problems.append(f"{L.res} was made from another config (provenance.json's config hash differs from this "
                        "config's): run snakemake with this config first")
    return problems


def check_run(res_dir: str | Path, config: dict | None = None, root: str | Path = ".") -> GateResult:
    """The gate record of the run in *res_dir* (see the module doc); *config*, normalized as the
    pipeline reads it, when the caller has the run's config: its policy is then the one applied, and
    its refs are checked first (a ref that does not resolve is named even when the run never started)."""
    L = Layout.of(res_dir)
    policy_cfg = None if config is None else config.get("gate")
    refs, problems = ({}, []) if config is None else ref_problems(config, Path(root))
    plan, summary, unfinished = _finished(L)
    problems += unfinished
    if not problems and config is not None:
        problems += config_problems(L, plan, config, refs)
    if problems:
        return GateResult(_invalid(L, problems, policy_cfg, summary), published=False)
    published = json.loads(Path(L.bundle, GATE_FILE).read_text())
    found = verify_bundle(L.bundle, run_dir=L.res)
    if found:
        return GateResult(_invalid(L, [f"the bundle {L.bundle} does not verify: {found[0]}"
                                       + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")],
                                   policy_cfg, summary), published=False)
    if policy_cfg is None:
        policy_cfg = {k: published["policy"][k] for k in pb_gate.POLICY_KEYS}
    elif _resolved(policy_cfg, summary) != published["policy"]:
        return GateResult(_invalid(L, ["the bundle's gate.json applied another gate policy: run snakemake with "
                                       "this config to publish it again"], policy_cfg, summary), published=False)
    # the cost channel's verdicts, when the published decision was made from them (a stats/cost.json
    # left by an earlier config is not); verify_bundle above recomputed them from their inputs
    cost = read_artifact(L.cost_summary, "cost_summary") if "cost_summary" in published["inputs"] else None
    again = pb_gate.decide(summary, policy_cfg, label=published["label"], arms=published["arms"],
                           host=published["host"], inputs=published["inputs"], cost=cost)
    differ = [k for k in ("decision", "exit_code", "reason", "problems", "cells", "cost") if again[k] != published[k]]
    if differ:
        return GateResult(_invalid(L, [f"{L.summary} does not give the published gate.json ({', '.join(differ)} "
                                       "differ): the run folder changed after it was published"],
                                   policy_cfg, summary), published=False)
    return GateResult(published, published=True)


def _resolved(policy_cfg: dict | None, summary: dict) -> dict | None:
    try:
        return pb_gate.Policy.from_config(policy_cfg).resolved(summary)
    except pb_gate.GateError:
        return None


def _invalid(L: Layout, problems: list[str], policy_cfg: dict | None, summary: dict | None) -> dict:
    policy = None
    if summary is not None:
        try:
            policy = pb_gate.Policy.from_config(policy_cfg).resolved(summary)
        except pb_gate.GateError as exc:
            problems = [*problems, str(exc)]
    return invalid_record(L.label, problems, policy, summary)
