"""Provenance of a run folder: what produced ``results/<label>/``, down to every file's sha256.

``provenance.json`` records the pairbench git commit and dirty flag, the Python, Snakemake and torch
versions (plus the harness's main libraries), the config hash from ``plan.json``, and the sha256,
size and schema id of every file the run folder holds, except the parts listed in :data:`EXCLUDED`
(each with its reason, which is written into the artifact too). :mod:`pairbench.integrity.audit` re-checks
every recorded hash later.

Versions come from installed distribution metadata (``importlib.metadata``), never from importing
the package: importing torch just to read its version costs seconds.
"""

from __future__ import annotations

import fnmatch

import importlib.metadata
import json
import platform
import subprocess
from pathlib import Path

from pairbench import __version__ as PAIRBENCH_VERSION
from pairbench.core.artifacts import sha256_file, write_artifact

KIND = "provenance"

# Path prefixes (relative to results/<label>/) that provenance does not cover, and why.
EXCLUDED: dict[str, str] = {
    "private/": "raw outputs, prompts, server logs, pid files and host facts: never published, and "
    "partly transient (pid files); the measure/validate artifacts record the hashes of what they used",
    "src/": "exported arm source trees: each is covered file by file by the sha256 manifest in "
    "source/<arm>.json, which the audit re-checks",
    "publish/": "the sanitized bundle is made after provenance and may include it; publish/MANIFEST.json "
    "records every bundled file's sha256, which the audit re-checks",
    ".publish.building-*/": "the bundle while the publish job builds it (pairbench.publish.bundle), renamed "
    "to publish/ when done; provenance may run at the same time (a cluster runs them side by side)",
    "provenance.json": "this file itself",
    "audit.json": "written by the audit, after provenance",
    "gate/": "the CI gate's record of a passing run (rule gate, after the audit): a copy of publish/gate.json, "
    "which publish/MANIFEST.json covers",
}

# Distributions whose versions are recorded besides python, snakemake and torch.
LIBRARIES = ("pandas", "numpy", "scipy", "jsonschema", "httpx", "matplotlib", "detect-secrets")


def is_temporary(rel: str) -> bool:
    """A temporary file of :func:`pairbench.core.artifacts.atomic_write_text` (``.<name>.<random>.tmp``)."""
    name = rel.rsplit("/", 1)[-1]
    return name.startswith(".") and name.endswith(".tmp")


def is_excluded(rel: str) -> bool:
    """Whether *rel* is one of :data:`EXCLUDED`: a file, or under a top-level folder (a glob)."""
    top = rel.split("/", 1)[0] + "/"
    return any(rel == p or (p.endswith("/") and "/" in rel and fnmatch.fnmatchcase(top, p)) for p in EXCLUDED)


def covered_files(run_dir: Path) -> list[str]:
    """Relative POSIX paths of the files provenance covers, sorted (temporary files never count)."""
    out = []
    for path in run_dir.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        rel = path.relative_to(run_dir).as_posix()
        if is_excluded(rel) or is_temporary(rel):
            continue
        out.append(rel)
    return sorted(out)


def schema_of(path: Path) -> str | None:
    """The ``schema`` field of a JSON artifact; None for other files (tables, plots)."""
    if path.suffix != ".json":
        return None
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    value = data.get("schema") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def git_state(repo: Path) -> tuple[str | None, bool | None]:
    """(HEAD commit, dirty) of the git checkout at *repo*; (None, None) when it is not one."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit, bool(status.strip())


def dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def collect_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {
        "python": platform.python_version(),
        "snakemake": dist_version("snakemake") or "unknown",
        "torch": dist_version("torch"),
    }
    for lib in LIBRARIES:
        versions[lib] = dist_version(lib)
    return versions


def build_provenance(run_dir: Path, config_sha256: str, plan_sha256: str, repo: Path) -> dict:
    """The provenance body for *run_dir* (without the ``schema`` stamp)."""
    run_dir = Path(run_dir)
    commit, dirty = git_state(repo)
    artifacts = []
    for rel in covered_files(run_dir):
        path = run_dir / rel
        artifacts.append({
            "path": rel,
            "sha256": sha256_file(path),
            "size_bytes": path.stat().st_size,
            "schema": schema_of(path),
        })
    return {
        "label": run_dir.name,
        "pairbench": {"version": PAIRBENCH_VERSION, "commit": commit, "dirty": dirty},
        "versions": collect_versions(),
        "config_sha256": config_sha256,
        "artifacts": artifacts,
        "excluded": dict(EXCLUDED),
        "inputs": {"plan": plan_sha256},
    }


def write_provenance(run_dir: Path, out: Path, config_sha256: str, plan_path: Path, repo: Path) -> str:
    """Build and atomically write ``provenance.json``; returns its sha256."""
    body = build_provenance(Path(run_dir), config_sha256, sha256_file(plan_path), Path(repo))
    return write_artifact(out, KIND, body)
