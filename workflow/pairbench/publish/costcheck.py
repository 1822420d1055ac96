"""``verify`` over a run folder's cost channel: ``stats/cost.json`` recomputed from its artifacts.

The cost channel's verdicts (``stats/cost.json``, ``pairbench.cost_summary/v1``) are made by rule
``cost_compare`` from ``cost/<arm>.json`` (the counts), ``build/<arm>.json`` and ``plan.json`` (is a
candidate the baseline's tree with its launch flags: an A/A pair) and ``stats/summary.json`` (the
wall-clock verdict beside each row), through :func:`pairbench.analysis.cost.summarize`. They are not
in the bundle as a file (their reasons are free text: docs/contracts.md), so they are recomputed
where their inputs are, in the run folder, by the same function, and :func:`cost_problems` says
where the published file and its inputs differ:

- an input whose sha256 is not the one ``stats/cost.json`` records (``inputs``): the file named;
- every field of ``stats/cost.json`` that the inputs do not give: ``arms.<arm>.<field>``,
  ``rows[i] (candidate condition metric).<field>`` (numbers to a relative 1e-9), ``agreement_counts``;
- a cost artifact without the verdicts made from it, or verdicts whose inputs are gone.

A run without the cost channel (neither ``cost/`` nor ``stats/cost.json``) has nothing to recompute.
:func:`pairbench.publish.verify.verify_bundle` asks only when its bundle publishes cost verdicts
(:func:`published_by`): a ``stats/cost.json`` left from an earlier config is no published figure.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from pairbench.analysis import cost as pb_cost
from pairbench.core.artifacts import ArtifactError, read_artifact, sha256_file
from pairbench.core.layout import Layout

REL_TOL = 1e-9
FILE = "stats/cost.json"
ROW_KEY = ("candidate", "condition", "metric")
COST_HEADING = "## Cost channel"  # pairbench.publish.report.cost_section


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or not all(isinstance(x, (int, float)) for x in (a, b)):
        return a == b
    return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=1e-12)


def _where(row: dict) -> str:
    return " ".join(str(row.get(k)) for k in ROW_KEY)


def body_problems(published: dict, want: dict) -> list[str]:
    """Every field of the published ``stats/cost.json`` body that differs from *want* (the body its
    inputs give), each naming the file and the field."""
    problems = []
    for key in ("baseline", "noise", "agreement_counts"):
        if not _same(published.get(key), want[key]):
            problems.append(f"{FILE}: {key} is {published.get(key)!r}, the artifacts give {want[key]!r}")
    arms = published.get("arms") or {}
    if sorted(arms) != sorted(want["arms"]):
        problems.append(f"{FILE}: arms are {sorted(arms)}, the artifacts give {sorted(want['arms'])}")
    for arm, fields in want["arms"].items():
        for field, value in fields.items():
            got = (arms.get(arm) or {}).get(field)
            if arm in arms and not _same(got, value):
                problems.append(f"{FILE}: arms.{arm}.{field} is {got!r}, cost/{arm}.json gives {value!r}")
    rows = published.get("rows") or []
    if [_where(r) for r in rows] != [_where(r) for r in want["rows"]]:
        return problems + [f"{FILE}: rows are ({'; '.join(_where(r) for r in rows) or 'none'}), the artifacts give "
                           f"({'; '.join(_where(r) for r in want['rows']) or 'none'})"]
    for i, (got, exp) in enumerate(zip(rows, want["rows"])):
        for field, value in exp.items():
            if not _same(got.get(field), value):
                problems.append(f"{FILE}: rows[{i}] ({_where(exp)}).{field} is {got.get(field)!r}, the artifacts give "
                                f"{value!r}")
    return problems


def _read(path: str, kind: str, problems: list[str]) -> dict | None:
    try:
        return read_artifact(path, kind)
    except (OSError, ArtifactError) as exc:
        problems.append(f"{path}: cannot be read to recompute {FILE}: {exc}")
        return None


def input_problems(L: Layout, published: dict) -> list[str]:
    """Inputs ``stats/cost.json`` records (role -> sha256) that are gone or hold other bytes now."""
    paths = {"plan": L.plan, "summary": L.summary}
    problems = []
    for role, digest in sorted((published.get("inputs") or {}).items()):
        kind, _, arm = role.partition(".")
        path = paths.get(role) or {"cost": L.cost, "build": L.build}.get(kind, lambda _: None)(arm)
        if path is None:
            problems.append(f"{FILE}: inputs.{role} is not an input of the cost channel")
        elif not Path(path).is_file():
            problems.append(f"{Path(path).relative_to(L.res)}: missing, but {FILE} was computed from it (inputs.{role})")
        elif sha256_file(path) != digest:
            problems.append(f"{Path(path).relative_to(L.res)}: its sha256 is not the one {FILE} was computed from "
                            f"(inputs.{role}): the file changed after the cost verdicts were made")
    return problems


def recompute(L: Layout, problems: list[str]) -> dict | None:
    """The ``stats/cost.json`` body (without ``inputs``) that the run folder's artifacts give, through
    :func:`pairbench.analysis.cost.summarize`; None, with *problems* added, when one cannot be read."""
    plan = _read(L.plan, "plan", problems)
    summary = _read(L.summary, "summary", problems)
    if plan is None or summary is None:
        return None
    costs, builds = {}, {}
    for arm in plan["arms"]:
        if Path(L.cost(arm)).is_file():
            costs[arm] = _read(L.cost(arm), "cost", problems)
        builds[arm] = _read(L.build(arm), "build", problems)
    if any(b is None for b in (*costs.values(), *builds.values())):
        return None
    return pb_cost.summarize(plan, summary, costs, builds)


def cost_problems(run_dir: str | Path, *, published_by: str | None = None) -> list[str]:
    """Problems with the run folder's cost verdicts (empty: ``stats/cost.json`` recomputes from its
    inputs, or the run has no cost channel). *published_by*: what publishes them (a bundle's file),
    when something does: then ``stats/cost.json`` must be there. See the module doc."""
    L = Layout.of(run_dir)
    published_path = Path(L.cost_summary)
    counted = sorted(Path(L.res, "cost").glob("*.json"))
    if not published_path.is_file():
        gone = [f"{FILE}: missing, but {published_by} publishes the cost channel's verdicts"] if published_by else []
        return gone + [f"{p.relative_to(L.res)}: a cost artifact without {FILE}, the verdicts made from it" for p in counted]
    problems: list[str] = []
    published = _read(L.cost_summary, "cost_summary", problems)
    if published is None:
        return problems
    problems += input_problems(L, published)
    want = recompute(L, problems)
    if want is not None:
        problems += body_problems(published, want)
    return problems


def published_by(bundle_dir: str | Path) -> str | None:
    """The bundle file that publishes the cost channel's verdicts (``gate.json`` made from
    ``stats/cost.json``, or the report's "Cost channel" section), or None."""
    root = Path(bundle_dir)
    gate, readme = root / "gate.json", root / "README.md"
    try:
        if gate.is_file() and "cost_summary" in (json.loads(gate.read_text()).get("inputs") or {}):
            return "gate.json"
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        pass
    if readme.is_file() and COST_HEADING in readme.read_text(errors="replace"):
        return "README.md"
    return None
