"""Audit a run folder: re-validate every artifact and walk the hash chain.

``python -m pairbench.integrity.audit results/<label>`` (and the Snakemake rule ``audit``) checks, read-only:

1. **schema**: every JSON artifact (a JSON file with a ``"schema": "pairbench.<kind>/v<N>"`` field)
   re-validates against ``workflow/schemas/<kind>.schema.json`` through
   :func:`pairbench.core.artifacts.read_artifact`; outside ``private/`` and ``src/`` every JSON file must
   be such an artifact.
2. **inputs** (the hash chain): every artifact's ``inputs`` object (role -> sha256; a list or an
   object of hashes is accepted as a role's value) must resolve each hash to a file of the run folder
   (or an ``extra`` file such as a patch or the model) with exactly that content.
3. **provenance**: every file recorded in ``provenance.json`` still exists with the recorded sha256
   and schema id, and no covered file is missing from it (``unrecorded``).
4. **manifest**: the hashes inside artifacts that pin other files still match: ``source/<arm>.json``
   over the exported tree ``src/<arm>/engine/``, ``publish/MANIFEST.json`` over ``publish/``.
5. **placement**: every visit (``measure/*.json``, validation retries included) ran on one node, by
   the pseudonym it records (``host.node``, pairbench.measure.node): pairs measured on two machines
   compare the machines too (docs/cluster.md). Artifacts from before nodes were recorded are skipped.

Any failed check is a *finding* that names the culprit file; one finding fails the audit (exit 1).
A temporary file left by a killed job is a *warning*: it is never mistaken for an artifact.

The record of a failed audit is kept. :func:`run_audit` (the rule's entry) writes the same
``pairbench.audit/v1`` record, ``ok: false`` and every finding included, to the rule's output
``results/<label>/audit.json`` *and* to its second log ``logs/<label>/audit.json`` before it fails
the job. Snakemake deletes a failed job's outputs (unless run with ``--keep-incomplete``) but keeps
its logs, so after a failed audit the record to read is ``logs/<label>/audit.json``; after a passing
one both hold the same record. The CLI's ``--out`` writes the record whatever the outcome.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from pairbench.core.artifacts import ArtifactError, parse_schema_id, read_artifact, sha256_file, write_artifact
from pairbench.integrity.provenance import covered_files, is_temporary

KIND = "audit"
HEX64 = re.compile(r"^[0-9a-f]{64}$")
# JSON files here need not be pairbench artifacts (raw engine outputs, exported sources).
RAW_JSON_PREFIXES = ("private/", "src/")
# An exported source tree is the arm's source, pinned file by file by source/<arm>.json (check 4), not
# the run's artifacts: a JSON file there with a pairbench schema id (this repository's own test data,
# exported at a git ref) is not audited as one.
EXPORTED_PREFIX = "src/"
# Validation retries retired when the validation they came from was redone (pairbench.stages.validate.
# retire_stage, listed in private/retired.json): kept for the record, no longer part of the run, so not audited.
RETIRED_PREFIX = "private/superseded/"


@dataclass
class Finding:
    path: str
    check: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: [{self.check}] {self.message}"


@dataclass
class AuditResult:
    label: str
    findings: list[Finding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(
        default_factory=lambda: {"artifacts": 0, "files": 0, "input_links": 0, "provenance_entries": 0}
    )
    provenance_sha256: str | None = None
    versions: dict[str, int] = field(default_factory=dict)  # artifact kind -> its schema version

    @property
    def ok(self) -> bool:
        return not self.findings

    def add(self, path: str, check: str, message: str) -> None:
        self.findings.append(Finding(path, check, message))

    def body(self) -> dict:
        """The ``audit.json`` body (without the ``schema`` stamp)."""
        return {
            "label": self.label,
            "ok": self.ok,
            "counts": dict(self.counts),
            "versions": dict(sorted(self.versions.items())),
            "findings": [f.__dict__ for f in self.findings],
            "warnings": list(self.warnings),
            "inputs": {"provenance": self.provenance_sha256} if self.provenance_sha256 else {},
        }


def iter_input_hashes(inputs: Any, role: str = "") -> Iterable[tuple[str, Any]]:
    """Flatten an ``inputs`` value into (role, hash) pairs; nested lists/objects get dotted roles."""
    if isinstance(inputs, dict):
        for key in sorted(inputs):
            yield from iter_input_hashes(inputs[key], f"{role}.{key}" if role else str(key))
    elif isinstance(inputs, list):
        for i, value in enumerate(inputs):
            yield from iter_input_hashes(value, f"{role}[{i}]")
    else:
        yield role, inputs


def _manifest_entries(data: dict) -> Iterable[tuple[str, str]]:
    """(relative path, sha256) pairs of a sha256 manifest held in an artifact, in either shape
    ``{"files": {path: sha}}`` / ``{"manifest": {path: sha}}`` or a list of ``{"path", "sha256"}``."""
    for key in ("manifest", "files"):
        value = data.get(key)
        if isinstance(value, dict):
            for rel, sha in value.items():
                if isinstance(sha, dict):
                    sha = sha.get("sha256")
                if isinstance(sha, str):
                    yield rel, sha
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, dict) and isinstance(item.get("path"), str) and isinstance(item.get("sha256"), str):
                    yield item["path"], item["sha256"]


def _manifest_root(run_dir: Path, rel: str, data: dict) -> Path | None:
    """Which folder an artifact's manifest paths are relative to, or None if it holds none."""
    if rel == "publish/MANIFEST.json":
        return run_dir / "publish"
    return None


def _check_source_tree(result: AuditResult, rel: str, data: dict, run_dir: Path) -> None:
    """``source/<arm>.json`` pins the exported tree after its patches: ``patched.tree_sha256`` over
    every file, ``pristine.manifest`` per file for those no patch changed. The embedded engine (a
    ``source`` folder name) is exported to ``src/<arm>/engine/``; a git-tag or installed engine
    (``source`` an object or null) to ``src/<arm>/`` itself (see pairbench.arms.source.export_source)."""
    from pairbench.core.trees import manifest, tree_sha256

    patched = data.get("patched") or {}
    if "tree_sha256" not in patched:
        return
    tree = run_dir / "src" / Path(rel).stem
    if isinstance(data.get("source", "engine"), str):
        tree = tree / "engine"
    tree_rel = tree.relative_to(run_dir).as_posix()
    if not tree.is_dir():
        result.add(tree_rel, "manifest", f"exported source tree recorded in {rel} is missing")
        return
    pristine = (data.get("pristine") or {}).get("manifest") or {}
    # A build adds to its tree (build/<arm>.json names what: a CMake build folder, an installed arm's
    # environment): that is not the source, unless a file of the exported or patched tree lies there
    # (then it is checked).
    exclude: list[str] = []
    build_path = run_dir / "build" / f"{Path(rel).stem}.json"
    if build_path.is_file():
        try:
            outputs = json.loads(build_path.read_text()).get("tree_outputs") or []
        except (OSError, json.JSONDecodeError):
            outputs = []
        known = set(pristine) | set(patched.get("changed") or [])
        exclude = [o for o in outputs if isinstance(o, str)
                   and not any(p == o or p.startswith(o + "/") for p in known)]
    now = manifest(tree, exclude)
    if tree_sha256(now) == patched["tree_sha256"]:
        return
    changed = set(patched.get("changed") or [])
    culprits = sorted(p for p in set(now) | set(pristine)
                      if p not in changed and now.get(p) != pristine.get(p))
    named = ", ".join(f"{tree_rel}/{p}" for p in culprits) or f"a file the patches touched ({', '.join(sorted(changed))})"
    result.add(culprits and f"{tree_rel}/{culprits[0]}" or tree_rel, "manifest",
               f"exported source differs from {rel} (patched tree_sha256): {named}")


def audit_run(run_dir: str | Path, extra_files: Iterable[str | Path] = ()) -> AuditResult:
    """Audit *run_dir* (``results/<label>``). *extra_files* may hold inputs that live outside it
    (patches, the model file) so that hashes recorded for them resolve."""
    run_dir = Path(run_dir)
    result = AuditResult(label=run_dir.name)
    if not run_dir.is_dir():
        result.add(str(run_dir), "schema", "run folder does not exist")
        return result
    sha_of = _hash_files(result, run_dir)
    by_sha = _index_by_sha(sha_of, extra_files)
    recorded = _read_provenance(result, run_dir, sha_of)
    _check_retired(result, run_dir, sha_of)
    nodes = _check_artifacts(result, run_dir, sha_of, by_sha, recorded)
    check_placement(result, nodes)
    _check_provenance(result, run_dir, sha_of, recorded)
    return result


def _hash_files(result: AuditResult, run_dir: Path) -> dict[str, str]:
    """Hash every file of *run_dir* once (relative path -> sha256): the index that input hashes
    resolve against. A temporary file is a warning, not a file of the run."""
    sha_of: dict[str, str] = {}
    for path in sorted(run_dir.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(run_dir).as_posix()
        if is_temporary(rel):
            result.warnings.append(f"{rel}: temporary file left by an interrupted write (not an artifact; safe to delete)")
            continue
        sha_of[rel] = sha256_file(path)
    result.counts["files"] = len(sha_of)
    return sha_of


def _index_by_sha(sha_of: dict[str, str], extra_files: Iterable[str | Path]) -> dict[str, list[str]]:
    """sha256 -> the run's files (relative paths) and the *extra_files* (as given) with that content."""
    by_sha: dict[str, list[str]] = defaultdict(list)
    for rel, sha in sha_of.items():
        by_sha[sha].append(rel)
    for extra in extra_files:
        extra = Path(extra)
        if extra.is_file():
            by_sha[sha256_file(extra)].append(str(extra))
    return by_sha


def _read_provenance(result: AuditResult, run_dir: Path, sha_of: dict[str, str]) -> dict[str, dict]:
    """What ``provenance.json`` recorded (path -> entry), if it exists and is valid, else ``{}``: lets
    a broken link name the file that changed."""
    recorded: dict[str, dict] = {}
    prov_path = run_dir / "provenance.json"
    if prov_path.exists():
        result.provenance_sha256 = sha_of.get("provenance.json")
        try:
            prov = read_artifact(prov_path, "provenance")
            recorded = {a["path"]: a for a in prov["artifacts"]}
        except ArtifactError as exc:
            result.add("provenance.json", "schema", str(exc))
    return recorded


def _check_retired(result: AuditResult, run_dir: Path, sha_of: dict[str, str]) -> None:
    """Retired validation retries: a warning that they are kept; and the retire rule's record, by which
    every retry it moved is kept under ``private/superseded/`` and out of the run."""
    retired = [rel for rel in sha_of if rel.startswith(RETIRED_PREFIX)]
    if retired:
        result.warnings.append(f"{len(retired)} file(s) under {RETIRED_PREFIX}: retired validation retries, "
                               "kept but no longer part of the run (not audited)")
    retired_record = run_dir / "private" / "retired.json"
    if retired_record.is_file():
        try:
            for move in read_artifact(retired_record, "retired")["moved"]:
                if move["from"] in sha_of:
                    result.add(move["from"], "retired", "listed as retired in private/retired.json, yet back in the run")
                if move["to"] not in sha_of and not (run_dir / move["to"]).is_dir():
                    result.add("private/retired.json", "retired", f"{move['to']}: a retired retry that is gone")
        except ArtifactError as exc:
            result.add("private/retired.json", "schema", str(exc))


def _check_artifacts(result: AuditResult, run_dir: Path, sha_of: dict[str, str], by_sha: dict[str, list[str]],
                     recorded: dict[str, dict]) -> dict[str, str]:
    """Checks 1, 2 and 4 (schema, inputs, manifests) over every JSON file of the run; returns the node
    each visit ran on (visit artifact -> node pseudonym), for check 5."""
    path_of_recorded_sha = {a["sha256"]: p for p, a in recorded.items()}
    nodes: dict[str, str] = {}
    for rel in sorted(sha_of):
        if not rel.endswith(".json") or rel.startswith((RETIRED_PREFIX, EXPORTED_PREFIX)):
            continue
        data = _read_json_artifact(result, run_dir, rel)
        if data is None:
            continue
        result.counts["artifacts"] += 1
        kind, version = parse_schema_id(data["schema"])
        result.versions[kind] = version
        if rel.startswith("measure/") and (data.get("host") or {}).get("node"):
            nodes[rel] = data["host"]["node"]
        _check_inputs(result, rel, data, by_sha, recorded, path_of_recorded_sha, sha_of)
        if kind == "source" and rel.startswith("source/"):
            _check_source_tree(result, rel, data, run_dir)
        root = _manifest_root(run_dir, rel, data)
        if root is not None:
            _check_manifest(result, rel, data, root, run_dir, sha_of)
    return nodes


def _read_json_artifact(result: AuditResult, run_dir: Path, rel: str) -> dict | None:
    """The JSON file *rel*, re-validated against its schema; None, with a finding unless it may be
    raw JSON (:data:`RAW_JSON_PREFIXES`), if it is not valid JSON or not a valid pairbench artifact."""
    path = run_dir / rel
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        if not rel.startswith(RAW_JSON_PREFIXES):
            result.add(rel, "schema", f"corrupt artifact, not valid JSON ({exc})")
        return None
    schema = data.get("schema") if isinstance(data, dict) else None
    if not (isinstance(schema, str) and schema.startswith("pairbench.")):
        if not rel.startswith(RAW_JSON_PREFIXES):
            result.add(rel, "schema", "JSON file without a pairbench 'schema' field")
        return None
    try:
        kind, _ = parse_schema_id(schema)
        return read_artifact(path, kind)
    except (ArtifactError, ValueError) as exc:
        result.add(rel, "schema", str(exc).replace(str(path), rel))
        return None


def _check_provenance(result: AuditResult, run_dir: Path, sha_of: dict[str, str], recorded: dict[str, dict]) -> None:
    """Check 3: every file *recorded* in provenance still hashes as recorded, and every covered file
    is recorded (nothing to check when there is no valid provenance)."""
    if not recorded:
        return
    for prel, entry in sorted(recorded.items()):
        result.counts["provenance_entries"] += 1
        now = sha_of.get(prel)
        if now is None:
            result.add(prel, "provenance", "recorded in provenance.json but missing")
        elif now != entry["sha256"]:
            result.add(prel, "provenance",
                       f"sha256 {now[:12]}… differs from provenance.json's {entry['sha256'][:12]}…: "
                       "modified after the run")
    for rel in covered_files(run_dir):
        if rel not in recorded:
            result.add(rel, "unrecorded", "file is not recorded in provenance.json (added after the run?)")


def check_placement(result: AuditResult, nodes: dict[str, str]) -> None:
    """One finding if the visits (*nodes*: visit artifact -> node pseudonym) ran on more than one node,
    naming each node and its visits; it is filed under the first visit off the first visit's node."""
    by_node: dict[str, list[str]] = defaultdict(list)
    for rel in sorted(nodes):
        by_node[nodes[rel]].append(rel)
    if len(by_node) < 2:
        return
    first = nodes[min(nodes)]
    culprit = min(rel for rel, node in nodes.items() if node != first)
    named = "; ".join(f"{node}: {', '.join(Path(r).stem for r in rels)}" for node, rels in by_node.items())
    result.add(culprit, "placement",
               f"the visits ran on {len(by_node)} nodes ({named}), so their pairs also compare the nodes; "
               "the real names are the 'node' of each visit's private/outputs/*.json")


def _check_inputs(result, rel, data, by_sha, recorded, path_of_recorded_sha, sha_of) -> None:
    inputs = data.get("inputs")
    if not isinstance(inputs, dict):
        result.add(rel, "inputs", "artifact records no 'inputs' object (role -> sha256)")
        return
    for role, sha in iter_input_hashes(inputs):
        result.counts["input_links"] += 1
        if sha is None:  # a role that has no input in this run (e.g. the first visit's predecessor)
            continue
        if not isinstance(sha, str) or not HEX64.match(sha):
            result.add(rel, "inputs", f"input {role!r} is not a sha256: {sha!r}")
            continue
        if by_sha.get(sha):
            continue
        was = path_of_recorded_sha.get(sha)
        if was is not None and was in sha_of:
            result.add(rel, "inputs",
                       f"input {role!r} sha256 {sha[:12]}… was {was} when this artifact was derived, "
                       f"but {was} now hashes to {sha_of[was][:12]}…: {was} was modified")
        else:
            result.add(rel, "inputs", f"input {role!r} sha256 {sha[:12]}… resolves to no file of the run")


def _check_manifest(result, rel, data, root: Path, run_dir: Path, sha_of) -> None:
    for mrel, sha in _manifest_entries(data):
        target = (root / mrel).relative_to(run_dir).as_posix() if not Path(mrel).is_absolute() else mrel
        now = sha_of.get(target)
        if now is None:
            result.add(target, "manifest", f"listed in {rel}'s manifest but missing")
        elif now != sha:
            result.add(target, "manifest", f"sha256 {now[:12]}… differs from {rel}'s manifest ({sha[:12]}…)")


def write_audit(result: AuditResult, out: str | Path) -> str:
    return write_artifact(out, KIND, result.body())


class AuditFailed(RuntimeError):
    """The audit had findings; its record was written first (the message names the first finding)."""


def run_audit(*, run_dir: str | Path, audit: str | Path, record: str | Path,
              extra_files: Iterable[str | Path] = ()) -> AuditResult:
    """The audit rule: audit *run_dir*, write its record to *record* (a log, which survives a failed
    job) and to *audit* (the output), print warnings and findings to stderr, and raise
    :class:`AuditFailed` if there was any finding."""
    result = audit_run(run_dir, extra_files)
    write_audit(result, record)
    write_audit(result, audit)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for finding in result.findings:
        print(f"FAIL {finding}", file=sys.stderr)
    if not result.ok:
        raise AuditFailed(f"audit of {run_dir} FAILED: {len(result.findings)} finding(s), first: "
                          f"{result.findings[0]}; the record is kept in {record}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pairbench.integrity.audit",
        description="Re-validate every artifact of a run folder and walk its hash chain (read-only).",
    )
    parser.add_argument("run_dir", help="the run folder, results/<label>")
    parser.add_argument("--extra", action="append", default=[],
                        help="a file outside the run folder that inputs may name (patch, model); repeatable")
    parser.add_argument("--out", help="also write the audit artifact (audit.json) here")
    args = parser.parse_args(argv)
    result = audit_run(args.run_dir, args.extra)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for finding in result.findings:
        print(f"FAIL {finding}", file=sys.stderr)
    c = result.counts
    summary = (f"{c['artifacts']} artifacts re-validated, {c['input_links']} input hashes resolved, "
               f"{c['provenance_entries']} provenance entries checked, {c['files']} files hashed")
    if args.out:
        write_audit(result, args.out)
    summary += "; schemas: " + ", ".join(f"{k} v{v}" for k, v in sorted(result.versions.items()))
    if result.ok:
        print(f"audit OK: {args.run_dir}: {summary}")
        return 0
    print(f"audit FAILED: {args.run_dir}: {len(result.findings)} finding(s); {summary}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
