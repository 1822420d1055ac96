"""Stages 7-8: the report and the allowlisted, scrubbed, leak-gated bundle; the HTML report's landing
page."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import yaml

from pairbench.analysis import tables as pb_tables
from pairbench.core.artifacts import read_artifact, sha256_file, write_artifact
from pairbench.publish import bundle as pb_bundle
from pairbench.publish import envfacts, report
from pairbench.publish.landing import write_landing
from pairbench.stages.analysis import read_validations

log = logging.getLogger("pairbench")


def _without_build_dir(tree: Path, build_dir: str, dest: Path) -> Path:
    """A copy of *tree* without its top-level *build_dir* (hard links where the filesystem allows:
    nothing is modified in place, and 100 MB of objects are not copied to re-apply a patch)."""
    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(tree, dest, symlinks=True, copy_function=link,
                    ignore=lambda d, names: [build_dir] if Path(d) == tree and build_dir in names else [])
    return dest


def stats_params(summary: dict) -> dict:
    """The ``stats_params.json`` body: what ``verify`` needs to recompute every verdict from
    ``tables/measurements.csv`` (the summarize keywords, and the run facts the report states)."""
    prm = summary["params"]
    return {"baseline": summary["baseline"], "candidates": summary["candidates"], "metrics": prm["primary"],
            "secondary": prm["secondary"], "memory": prm["memory"], "multiplicity": prm["multiplicity"],
            "trim": prm["trim"], "alpha": prm["alpha"], "noise": prm["noise"], "seed": prm["seed"],
            "run": summary["run"]}


def _patched_files(res_dir: str, cand: str, base_src: dict, cand_src: dict) -> dict:
    """Source-relative path -> sha256 of each file the candidate's patches changed, as measured."""
    tree = Path(res_dir) / "src" / cand
    # the embedded engine's tree is src/<arm>/engine/ (patches name engine/...); a git tag's is
    # src/<arm>/ itself (patches name the repository's own paths)
    prefix = "engine/" if isinstance(base_src["source"], str) else ""
    return {f"{prefix}{rel}": sha256_file(tree / prefix / rel)
            for rel in cand_src["patched"]["changed"] if (tree / prefix / rel).is_file()}


def _by(paths: list[str], kind: str, key: str) -> dict:
    return {b[key]: b for b in (read_artifact(p, kind) for p in paths)}


def publish_stage(*, bundle: str, private_dir: str, res_dir: str, root: str, plan: str, sources: list[str],
                  builds: list[str], fixtures: list[str], prompts: list[str], warmups: list[str],
                  measures: list[str], validations: list[str], summary: str, measurements: str, summary_csv: str,
                  paired_csv: str, ratios_csv: str, timing_csv: str, ratios_png: str, drift_png: str,
                  crosscheck: list[str], hosts: list[str], memory_csv: str | None = None) -> None:
    """The report and the allowlisted, scrubbed, leak-gated bundle (pairbench.publish.bundle.build_bundle).
    *hosts* are the measuring jobs' node facts, in plan order: environment.json describes the node of
    the first (every visit of a comparison runs on one node; the audit checks it), and the identifiers
    of every node, and of this one, are scrubbed."""
    plan_body = read_artifact(plan, "plan")
    source_bodies = _by(sources, "source", "arm")
    build_bodies = _by(builds, "build", "arm")
    fixture_bodies = _by(fixtures, "fixture", "length")
    prompt_bodies = _by(prompts, "prompts", "length")
    df = pd.read_csv(measurements)
    tables = {"measurements": measurements, "summary": summary_csv, "paired": paired_csv, "ratios": ratios_csv,
              "timing_agreement": timing_csv, **({"memory": memory_csv} if memory_csv else {})}

    here = envfacts.collect(engine_version=build_bodies[plan_body["baseline"]]["native_version"])
    nodes = [json.loads(Path(h).read_text()) for h in hosts]
    identifiers = envfacts.merged_identifiers(here, *nodes)
    # Absolute paths of this checkout are private too (they name users and machines).
    identifiers["path"] = sorted({*identifiers.get("path", []), str(Path(root).resolve())})
    env_path = Path(private_dir) / "environment.json"
    write_artifact(env_path, "environment", envfacts.public(envfacts.on_node(here, nodes[0]), inputs={
        "plan": sha256_file(plan), "host": sha256_file(hosts[0])}))
    first_round = min(int(r) for r in plan_body["salts"])
    fx_manifest = pb_bundle.fixture_manifest(
        [{"length": n, "messages": next(r for r in prompt_bodies[n]["rounds"] if r["round"] == first_round)["messages"],
          "prompt_tokens": fixture_bodies[n]["length"]} for n in sorted(prompt_bodies)],
        inputs={f"fixture.{n}": sha256_file(p) for n, p in zip(sorted(fixture_bodies), fixtures)})
    fx_path = Path(private_dir) / "fixtures.json"
    write_artifact(fx_path, "fixture_manifest", fx_manifest)
    summary_body = read_artifact(summary, "summary")
    sp_path = Path(private_dir) / "stats_params.json"
    write_artifact(sp_path, "stats_params", {**stats_params(summary_body), "inputs": {"summary": sha256_file(summary)}})
    resolved = {k: v for k, v in plan_body.items() if k not in ("visits", "inputs", "schema")}
    files = {
        "environment.json": str(env_path),
        "fixtures.json": str(fx_path),
        "stats_params.json": str(sp_path),
        # quoted: digests read as digests
        "config.resolved.yaml": yaml.safe_dump(resolved, sort_keys=True, default_style="\"").encode(),
        **{f"tables/{name}.csv": path for name, path in tables.items()},
        "plots/ratios.png": ratios_png,
        "plots/drift.png": drift_png,
        # the cross-check comparison (numbers and short labels only): when the engines have a tool
        **({"tables/crosscheck.json": crosscheck[0]} if crosscheck else {}),
    }
    # stats/summary.json itself is not bundled: its free-text fields (reasons, method names) fail
    # publish's field check. Its numbers are in tables/*.csv, its words in README.md, and what
    # recomputes both (the parameters and run facts) in stats_params.json: `pairbench verify` does.
    base_src = source_bodies[plan_body["baseline"]]
    patches, sets = {}, {}
    for cand in plan_body["candidates"]:
        own = {Path(p["path"]).name: str(Path(root) / p["path"]) for p in source_bodies[cand]["patches"]}
        patches.update(own)
        sets[cand] = (list(own), _patched_files(res_dir, cand, base_src, source_bodies[cand]))
    patched = {cand: files for cand, (names, files) in sets.items() if names}
    clean_source = None
    if patched and not base_src["patches"] and all(source_bodies[c]["source"] == base_src["source"] for c in patched):
        clean_source = Path(res_dir) / "src" / plan_body["baseline"]
    # one patched candidate: the manifest's one set, as for two arms; several: one set per candidate
    one = next(iter(patched.values())) if len(patched) == 1 else None
    patch_sets = {c: sets[c] for c in patched} if len(patched) > 1 else None
    bdir = (build_bodies[plan_body["baseline"]].get("toolchain") or {}).get("build_dir")
    listing = [*files, *(f"patches/{n}" for n in patches), "README.md"]
    files["README.md"] = report.render(
        plan=plan_body, sources=source_bodies, builds=build_bodies, fixtures=fixture_bodies,
        warmups=_by(warmups, "warmup", "arm"), measures=[read_artifact(p, "measure") for p in measures],
        validations=read_validations(validations), df=df, agreement=pb_tables.timing_agreement(df),
        summary=summary_body, files=listing,
        crosscheck=read_artifact(crosscheck[0], "crosscheck_summary") if crosscheck else None).encode()
    with tempfile.TemporaryDirectory(dir=private_dir, prefix=".clean-source-") as tmp:
        if clean_source is not None and bdir:  # re-applying the patches needs the source, not the objects
            clean_source = _without_build_dir(clean_source, bdir, Path(tmp) / "src")
        result = pb_bundle.build_bundle(bundle, files, identifiers=identifiers, private_dir=Path(private_dir) / "publish",
                                        patches=patches, clean_source=clean_source, patched_files=one,
                                        patch_roots=[str(Path(root).resolve())], patch_sets=patch_sets)
    log.info("published %s: %s (excluded by the allowlist: %s)", bundle, result["report_line"],
             ", ".join(result["excluded"]) or "nothing")


def landing_stage(*, landing: str, paired: str, measurements: str) -> None:
    write_landing(paired, measurements, landing)
