"""What goes into the bundle: the files of a finished run, its patches and the report, handed to
:func:`pairbench.publish.bundle.build_bundle` (which allowlists, scrubs and leak-gates them).

Reads the run through its layout (:class:`pairbench.core.layout.Layout`): the plan, every arm's
source, build and warmup, every condition's fixture and prompts, the statistics, tables and plots.
Writes four private artifacts the bundle copies (``environment.json``, ``fixtures.json``,
``stats_params.json``, and ``gate.json``: the CI gate's decision under the config's ``gate:`` policy,
:mod:`pairbench.publish.gate`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from pairbench.analysis import tables as pb_tables
from pairbench.analysis.loadlevel import judged
from pairbench.core import naming
from pairbench.core.artifacts import read_artifact, sha256_file, write_artifact
from pairbench.core.layout import LOAD_PLOTS, LOAD_TABLES, PLOTS, TABLES, Layout
from pairbench.publish import bundle as pb_bundle
from pairbench.publish import envfacts, report
from pairbench.publish import gate as pb_gate
from pairbench.publish.verify import TableError, read_table

log = logging.getLogger("pairbench")

#: The measurements table's columns the report reads whatever the run measured.
MEASUREMENT_KEYS = ("round", "arm", "condition", "selected")


@dataclass(frozen=True)
class Run:
    """The artifacts of a finished run that the bundle and its report are made from."""

    layout: Layout
    plan: dict
    sources: dict  # arm -> source body
    builds: dict
    warmups: dict
    fixtures: dict  # condition -> fixture body
    prompts: dict  # condition -> prompts body
    measures: list
    validations: dict  # (visit, retry) -> validate body
    summary: dict
    crosscheck: dict | None
    cost: dict | None = None  # the cost channel's verdicts (stats/cost.json), when it ran

    @classmethod
    def read(cls, layout: Layout, measures: list[str], validations: list[str], crosscheck: str | None,
             cost: str | None = None) -> "Run":
        plan = read_artifact(layout.plan, "plan")
        arms, conds = list(plan["arms"]), [c["id"] for c in plan["conditions"]]
        return cls(
            layout=layout, plan=plan,
            sources={a: read_artifact(layout.source(a), "source") for a in arms},
            builds={a: read_artifact(layout.build(a), "build") for a in arms},
            warmups={a: read_artifact(layout.warmup(a), "warmup") for a in arms},
            fixtures={c: read_artifact(layout.fixture(c), "fixture") for c in conds},
            prompts={c: read_artifact(layout.prompts(c), "prompts") for c in conds},
            measures=[judged(read_artifact(p, "measure"), plan) for p in measures],  # load levels: metrics
            validations={naming.validation_key(v): v for v in (read_artifact(p, "validate") for p in validations)},
            summary=read_artifact(layout.summary, "summary"),
            crosscheck=read_artifact(crosscheck, "crosscheck_summary") if crosscheck else None,
            cost=read_artifact(cost, "cost_summary") if cost else None)


def stats_params(summary: dict) -> dict:
    """The ``stats_params.json`` body: what ``verify`` needs to recompute every verdict from
    ``tables/measurements.csv`` (the summarize keywords, and the run facts the report states)."""
    prm = summary["params"]
    return {"baseline": summary["baseline"], "candidates": summary["candidates"], "metrics": prm["primary"],
            "secondary": prm["secondary"], "memory": prm["memory"], "multiplicity": prm["multiplicity"],
            "trim": prm["trim"], "alpha": prm["alpha"], "noise": prm["noise"], "seed": prm["seed"],
            "run": summary["run"], **({"load": prm["load"]} if prm.get("load") else {})}


def _private_artifacts(run: Run, root: str, hosts: list[str]) -> tuple[dict, dict]:
    """Write environment.json, fixtures.json and stats_params.json under private/; return
    ({bundle name: path}, the identifiers the leak gate looks for).

    environment.json describes the node of the first visit (*hosts*: the measuring jobs' node facts
    in plan order; every visit of a comparison runs on one node, the audit checks it) with this
    job's software facts; the identifiers of every measuring node, and of this one, are scrubbed."""
    L, plan = run.layout, run.plan
    here = envfacts.collect(engine_version=run.builds[plan["baseline"]]["native_version"])
    nodes = [json.loads(Path(h).read_text()) for h in hosts]
    identifiers = envfacts.merged_identifiers(here, *nodes)
    # Absolute paths of this checkout are private too (they name users and machines).
    identifiers["path"] = sorted({*identifiers.get("path", []), str(Path(root).resolve())})
    env_path = Path(L.private) / "environment.json"
    write_artifact(env_path, "environment", envfacts.public(envfacts.on_node(here, nodes[0]), inputs={
        "plan": sha256_file(L.plan), "host": sha256_file(hosts[0])}))
    conds = [c["id"] for c in plan["conditions"]]
    fx_manifest = pb_bundle.fixture_manifest(
        [{"condition": c, "messages": next(r for r in run.prompts[c]["rounds"] if r["round"] == 1)["messages"],
          "prompt_tokens": run.fixtures[c]["input_tokens"]} for c in conds],
        inputs={f"fixture.{c}": sha256_file(L.fixture(c)) for c in conds})
    fx_path = Path(L.private) / "fixtures.json"
    write_artifact(fx_path, "fixture_manifest", fx_manifest)
    sp_path = Path(L.private) / "stats_params.json"
    write_artifact(sp_path, "stats_params", {**stats_params(run.summary), "inputs": {"summary": sha256_file(L.summary)}})
    return {"environment.json": str(env_path), "fixtures.json": str(fx_path),
            "stats_params.json": str(sp_path)}, identifiers


def _patched_files(L: Layout, cand: str, base_src: dict, cand_src: dict) -> dict:
    """Source-relative path -> sha256 of each file the candidate's patches changed, as measured."""
    tree = Path(L.tree(cand))
    # the embedded engine's tree is src/<arm>/engine/ (patches name engine/...); a git tag's is
    # src/<arm>/ itself (patches name the repository's own paths)
    prefix = "engine/" if isinstance(base_src["source"], str) else ""
    return {f"{prefix}{rel}": sha256_file(tree / prefix / rel)
            for rel in cand_src["patched"]["changed"] if (tree / prefix / rel).is_file()}


@dataclass(frozen=True)
class PatchSets:
    """The candidates' patches as the bundle ships them, and how verify re-applies them."""

    patches: dict  # file name -> path
    one: dict | None  # the one patched candidate's changed files (two-arm form)
    sets: dict | None  # candidate -> (patch names, changed files), when several are patched
    clean_source: Path | None  # the baseline's pristine tree, when every patched candidate shares it


def patch_sets(run: Run, root: str) -> PatchSets:
    L, plan, sources = run.layout, run.plan, run.sources
    base_src = sources[plan["baseline"]]
    patches, sets = {}, {}
    for cand in plan["candidates"]:
        own = {Path(p["path"]).name: str(Path(root) / p["path"]) for p in sources[cand]["patches"]}
        patches.update(own)
        sets[cand] = (list(own), _patched_files(L, cand, base_src, sources[cand]))
    patched = {cand: files for cand, (names, files) in sets.items() if names}
    clean = None
    if patched and not base_src["patches"] and all(sources[c]["source"] == base_src["source"] for c in patched):
        clean = Path(L.tree(plan["baseline"]))
    # one patched candidate: the manifest's one set, as for two arms; several: one set per candidate
    return PatchSets(patches=patches, one=next(iter(patched.values())) if len(patched) == 1 else None,
                     sets={c: sets[c] for c in patched} if len(patched) > 1 else None, clean_source=clean)


def _without_outputs(tree: Path, outputs: list[str], dest: Path) -> Path:
    """A copy of *tree* without what its build added (*outputs*: relative paths, at any depth; hard
    links where the filesystem allows: nothing is modified in place, and 100 MB of objects or an
    arm's environment are not copied to re-apply a patch)."""
    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    skip = set(outputs)

    def ignore(d, names):
        here = Path(d).relative_to(tree)
        return [n for n in names if (here / n).as_posix() in skip]

    shutil.copytree(tree, dest, symlinks=True, copy_function=link, ignore=ignore)
    return dest


def write_gate(run: Run, environment: str, gate: dict | None) -> str:
    """``private/gate.json``: the gate's decision over the run under the *gate* policy (the config's
    ``gate:``), the cost channel's verdicts beside it when the run has them, with the arms' shas and
    the host facts of *environment* (``environment.json``)."""
    L, plan = run.layout, run.plan
    body = pb_gate.decide(run.summary, gate, label=plan["label"], arms=pb_gate.arms_facts(plan, run.sources),
                          host=pb_gate.host_facts(read_artifact(environment, "environment")),
                          inputs={"summary": sha256_file(L.summary),
                                  **({"cost_summary": sha256_file(L.cost_summary)} if run.cost is not None else {}),
                                  **{f"source.{a}": sha256_file(L.source(a)) for a in plan["arms"]}},
                          cost=run.cost)
    path = Path(L.private) / "gate.json"
    write_artifact(path, "gate", body)
    return str(path)


def publish(run: Run, root: str, hosts: list[str], gate: dict | None = None) -> dict:
    """Render the report and build the bundle, the gate's decision under the *gate* policy in it;
    returns build_bundle's result."""
    L, plan = run.layout, run.plan
    files, identifiers = _private_artifacts(run, root, hosts)
    files["gate.json"] = write_gate(run, files["environment.json"], gate)
    resolved = {k: v for k, v in plan.items() if k not in ("visits", "inputs", "schema")}
    # quoted: digests read as digests
    files["config.resolved.yaml"] = yaml.safe_dump(resolved, sort_keys=True, default_style="\"").encode()
    files.update({f"tables/{name}.csv": L.table(name) for name in TABLES})
    files.update({f"plots/{name}.png": L.plot(name) for name in PLOTS})
    if plan.get("load"):  # a load run's capacity tables and its load-curve plot
        files.update({f"tables/{name}.csv": L.table(name) for name in LOAD_TABLES})
        files.update({f"plots/{name}.png": L.plot(name) for name in LOAD_PLOTS})
    if run.crosscheck is not None:  # the cross-check comparison (numbers and short labels only)
        files["tables/crosscheck.json"] = L.crosscheck_summary
    # stats/summary.json itself is not bundled: its free-text fields (reasons, method names) fail
    # publish's field check. Its numbers are in tables/*.csv, its words in README.md, and what
    # recomputes both (the parameters and run facts) in stats_params.json: `pairbench verify` does.
    ps = patch_sets(run, root)
    try:  # read back against its schema: the report and the bundle trust what it holds
        df = read_table(L.table("measurements"), pb_bundle.CATEGORICAL_FIELDS, required=MEASUREMENT_KEYS)
    except TableError as exc:
        raise pb_bundle.PublishError(f"tables/measurements.csv is not a valid table: {exc}") from None
    listing = [*files, *(f"patches/{n}" for n in ps.patches), "README.md"]
    files["README.md"] = report.render(
        plan=plan, sources=run.sources, builds=run.builds, fixtures=run.fixtures, warmups=run.warmups,
        measures=run.measures, validations=run.validations, df=df, agreement=pb_tables.timing_agreement(df),
        summary=run.summary, files=listing, crosscheck=run.crosscheck, cost=run.cost).encode()
    # what the baseline's build added, relative to its source tree (src/<arm>/engine/ for the embedded engine)
    prefix = "engine/" if isinstance(run.sources[plan["baseline"]]["source"], str) else ""
    outputs = [prefix + o for o in run.builds[plan["baseline"]].get("tree_outputs") or []]
    with tempfile.TemporaryDirectory(dir=L.private, prefix=".clean-source-") as tmp:
        clean = ps.clean_source
        if clean is not None and outputs:  # re-applying the patches needs the source, not what was built
            clean = _without_outputs(clean, outputs, Path(tmp) / "src")
        result = pb_bundle.build_bundle(L.bundle, files, identifiers=identifiers, private_dir=Path(L.private) / "publish",
                                        patches=ps.patches, clean_source=clean, patched_files=ps.one,
                                        patch_roots=[str(Path(root).resolve())], patch_sets=ps.sets)
    log.info("published %s: %s (excluded by the allowlist: %s)", L.bundle, result["report_line"],
             ", ".join(result["excluded"]) or "nothing")
    return result
