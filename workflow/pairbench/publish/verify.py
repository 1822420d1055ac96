"""Offline verification of a publication bundle: ``python -m pairbench verify <bundle> [--source DIR]``.

No network, no model, no engine: only the bundle, and optionally the clean source at the measured tag.
:func:`verify_bundle` returns a list of problems (empty = the bundle checks out):

- ``MANIFEST.json`` validates against ``pairbench.manifest/v1``; every file it lists exists with the
  recorded sha256 and size, and no unlisted file lies in the bundle;
- every JSON file validates against the schema its own ``"schema"`` field names (which must equal the
  MANIFEST's), and every CSV against ``pairbench.table/v1`` with its MANIFEST-listed categorical
  columns;
- the fixture manifest's hashes recompute from the synthetic messages and texts;
- bundled Python scripts pass a syntax check (``compile``; nothing is run);
- every verdict and number recomputes from ``tables/measurements.csv`` and ``stats_params.json``
  (:mod:`pairbench.publish.recompute`): the tables, the run facts and the README's statistics section;
- with the run folder it was made from: the cost channel's verdicts (``stats/cost.json``) recompute
  from ``cost/<arm>.json``, ``build/<arm>.json``, ``plan.json`` and ``stats/summary.json``
  (:mod:`pairbench.publish.costcheck`);
- with a clean source: the bundled patches apply in MANIFEST order (``git apply --check``, then
  ``git apply`` on a temporary copy) and the patched files' sha256 equal the ones recorded from the
  measured source (``MANIFEST.source.patched_files``).
"""

from __future__ import annotations

import copy
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

import jsonschema

from pairbench.core import artifacts
from pairbench.core.artifacts import ArtifactError, current_version, parse_schema_id, schema_id, sha256_file, validate

MANIFEST = "MANIFEST.json"
# Snakemake marks a directory() output with an empty .snakemake_timestamp after the job; it holds
# nothing, so verify tolerates it (empty only) rather than fail every pipeline-built bundle.
TOLERATED_EMPTY = {".snakemake_timestamp"}
TABLE_SCHEMA = schema_id("table")
FIXTURE_KIND = "fixture_manifest"


class PatchError(Exception):
    """A bundled patch does not apply to the clean source; the message names the patch."""


def messages_sha256(messages: Any) -> str:
    """sha256 of the canonical JSON of a fixture's messages (sorted keys, no spaces, UTF-8)."""
    text = json.dumps(messages, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- CSV tables --------------------------------------------------------------------------------

_NUMBER = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$|^[+-]?(?:inf|nan)$", re.I)


def coerce_cell(cell: str) -> Any:
    """A CSV cell as JSON would type it: '' -> None, true/false -> bool, numbers -> int/float."""
    s = cell.strip()
    if s == "":
        return None
    if s.lower() in ("true", "false"):
        return s.lower() == "true"
    if _NUMBER.match(s):
        try:
            return int(s)
        except ValueError:
            v = float(s)
            return None if v != v else v  # NaN: a missing value, valid JSON-Schema-wise
    return s


def table_schema(categorical: Iterable[str]) -> dict:
    """pairbench.table/v1 with one string-or-number property per categorical column."""
    schema = copy.deepcopy(artifacts.load_schema("table"))
    cat = schema["$defs"]["categorical"]
    schema["properties"] = {c: dict(cat) for c in categorical}
    return schema


def table_problems(rel: str, text: str, categorical: Iterable[str]) -> list[str]:
    """Problems with a CSV table: shape, header, and every row against pairbench.table/v1."""
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return [f"{rel}: empty CSV (no header)"]
    header = rows[0]
    problems = []
    if len(set(header)) != len(header) or any(not re.fullmatch(r"[A-Za-z0-9_.:+-]{1,64}", h) for h in header):
        problems.append(f"{rel}: line 1: header must be unique short field names, got {header!r}")
        return problems
    validator = jsonschema.Draft202012Validator(table_schema(c for c in categorical if c in header))
    for n, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(header):
            problems.append(f"{rel}: line {n}: {len(row)} cells, header has {len(header)}")
            continue
        obj = {h: coerce_cell(c) for h, c in zip(header, row)}
        for err in validator.iter_errors(obj):
            col = "/".join(str(p) for p in err.absolute_path) or "<row>"
            problems.append(f"{rel}: line {n}: column {col!r} is not numeric or an allowlisted categorical field "
                            f"({err.message})")
        if len(problems) > 20:
            break
    return problems


class TableError(ValueError):
    """A CSV table that is not what its schema says; the message names the file, line and column."""


def read_table(path: str | Path, categorical: Iterable[str], required: Iterable[str] = ()):
    """The CSV table at *path* as a DataFrame, read back against ``pairbench.table/v1`` (every cell
    numeric, boolean or empty except the *categorical* columns, which hold short labels) and holding
    the *required* columns; :class:`TableError` naming the file, line and column otherwise. A table
    is data the next stage trusts: it is checked where it is read, as an artifact is."""
    import pandas as pd

    text = Path(path).read_text(encoding="utf-8")
    header = next(csv.reader(io.StringIO(text)), [])
    missing = [c for c in required if c not in header]
    problems = [f"{path}: line 1: missing column(s) {missing}"] if missing else []
    problems += table_problems(str(path), text, [c for c in categorical if c in header])
    if problems:
        raise TableError("\n".join(problems[:20]))
    return pd.read_csv(io.StringIO(text))


# --- fixtures ----------------------------------------------------------------------------------

def fixture_problems(rel: str, data: Mapping[str, Any]) -> list[str]:
    problems = []
    for i, fx in enumerate(data.get("fixtures", [])):
        where = f"{rel}: fixtures[{i}] (condition {fx.get('condition')})"
        if messages_sha256(fx.get("messages")) != fx.get("messages_sha256"):
            problems.append(f"{where}: messages_sha256 does not recompute from the messages")
        if "text" in fx and text_sha256(fx["text"]) != fx.get("text_sha256"):
            problems.append(f"{where}: text_sha256 does not recompute from the text")
    return problems


# --- patches -----------------------------------------------------------------------------------

def _git_env(ceiling: Path) -> dict:
    env = dict(os.environ)
    # git apply inside someone else's repository applies paths relative to *that* repository's root;
    # the ceiling keeps git from finding one above our temporary copy.
    env["GIT_CEILING_DIRECTORIES"] = str(ceiling)
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["GIT_CONFIG_GLOBAL"] = os.devnull
    return env


def apply_patches(clean_source: str | os.PathLike, patches: Iterable[tuple[str, bytes]], workdir: str | os.PathLike) -> Path:
    """Copy *clean_source* under *workdir* and apply *patches* (name, bytes) in order; return the copy.

    Raises PatchError naming the patch and git's complaint (which names the file and hunk).
    """
    src = Path(clean_source)
    if not src.is_dir():
        raise PatchError(f"clean source {src} is not a directory")
    work = Path(workdir)
    tree = work / "src"
    shutil.copytree(src, tree, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    env = _git_env(work)
    for name, data in patches:
        pfile = work / "current.patch"
        pfile.write_bytes(data)
        for args in (["--check"], []):
            proc = subprocess.run(["git", "apply", *args, str(pfile)], cwd=tree, env=env,
                                  capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                msg = (proc.stderr or proc.stdout).strip().replace(str(pfile), name)
                raise PatchError(f"{name}: does not apply to the clean source: {msg}")
    return tree


# --- the whole bundle --------------------------------------------------------------------------

def verify_bundle(bundle_dir: str | os.PathLike, *, clean_source: str | os.PathLike | None = None,
                  recompute_stats: bool = True, run_dir: str | os.PathLike | None = None) -> list[str]:
    """Problems found in the bundle (empty list = verified). Never raises for a bad bundle.
    *recompute_stats* False skips the statistics recomputation (the bundle stage's own pre-check,
    run before the report and parameters it would compare exist). *run_dir*: the run folder the
    bundle was made from, whose cost channel's verdicts (``stats/cost.json``, not bundled) are then
    recomputed from their inputs too, when the bundle publishes them
    (:func:`pairbench.publish.costcheck.cost_problems`)."""
    root = Path(bundle_dir)
    if not root.is_dir():
        return [f"{root}: not a directory"]
    mpath = root / MANIFEST
    try:
        manifest = json.loads(mpath.read_text())
        validate("manifest", manifest, where=MANIFEST)
    except FileNotFoundError:
        return [f"{MANIFEST}: missing"]
    except (json.JSONDecodeError, ArtifactError) as exc:
        return [f"{MANIFEST}: {exc}"]

    problems: list[str] = []
    listed = {e["path"]: e for e in manifest["files"]}
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink()}
    tolerated = {rel for rel in on_disk & TOLERATED_EMPTY if (root / rel).is_file() and (root / rel).stat().st_size == 0}
    for rel in sorted(on_disk - set(listed) - {MANIFEST} - tolerated):
        problems.append(f"{rel}: in the bundle but not listed in {MANIFEST}")

    for rel, entry in sorted(listed.items()):
        path = root / rel
        if not path.is_file() or path.is_symlink():
            problems.append(f"{rel}: listed in {MANIFEST} but missing (or not a plain file)")
            continue
        digest = sha256_file(path)
        if digest != entry["sha256"]:
            problems.append(f"{rel}: sha256 mismatch: {MANIFEST} records {entry['sha256'][:16]}..., file has {digest[:16]}...")
            continue
        if path.stat().st_size != entry["size_bytes"]:
            problems.append(f"{rel}: size {path.stat().st_size} bytes, {MANIFEST} records {entry['size_bytes']}")
        problems += _content_problems(rel, path, entry)

    if recompute_stats and not problems:  # recompute only from files whose hashes check out
        from pairbench.publish.recompute import recompute_problems

        problems += recompute_problems(root)
    if clean_source is not None:
        problems += _source_problems(root, manifest["source"], clean_source)
    if run_dir is not None:
        from pairbench.publish import costcheck

        publisher = costcheck.published_by(root)
        if publisher is not None:  # a stats/cost.json the bundle does not publish is no figure of it
            problems += costcheck.cost_problems(run_dir, published_by=publisher)
    return problems


def bundle_versions(bundle_dir: str | os.PathLike) -> dict[str, int]:
    """``{kind: version}`` of the bundle's MANIFEST and of every file it lists with a schema id."""
    manifest = json.loads((Path(bundle_dir) / MANIFEST).read_text())
    ids = [manifest.get("schema"), *(e.get("schema") for e in manifest.get("files", []))]
    out = {}
    for sid in ids:
        try:
            kind, version = parse_schema_id(sid)
        except ValueError:
            continue
        out[kind] = version
    return dict(sorted(out.items()))


def _content_problems(rel: str, path: Path, entry: Mapping[str, Any]) -> list[str]:
    suffix = path.suffix.lower()
    schema = entry.get("schema")
    if suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return [f"{rel}: not valid JSON ({exc})"]
        got = data.get("schema") if isinstance(data, dict) else None
        if got != schema:
            return [f"{rel}: its schema field says {got!r}, {MANIFEST} says {schema!r}"]
        try:
            kind, version = parse_schema_id(got)
            if version != current_version(kind):
                return [f"{rel}: unknown version v{version} of {kind} (this pairbench reads {schema_id(kind)})"]
            validate(kind, data, where=rel)
        except (ValueError, ArtifactError) as exc:
            return [f"{rel}: {exc}"]
        return fixture_problems(rel, data) if kind == FIXTURE_KIND else []
    if suffix == ".csv":
        if schema != TABLE_SCHEMA:
            return [f"{rel}: CSV must be recorded with schema {TABLE_SCHEMA}, {MANIFEST} says {schema!r}"]
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            return [f"{rel}: not UTF-8"]
        return table_problems(rel, text, entry.get("categorical", []))
    if suffix == ".py":
        try:
            compile(path.read_bytes(), rel, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            return [f"{rel}: line {getattr(exc, 'lineno', '?')}: Python syntax error: {getattr(exc, 'msg', exc)}"]
    return []


def _source_problems(root: Path, source: Mapping[str, Any], clean_source: str | os.PathLike) -> list[str]:
    """The bundled patches re-applied to *clean_source*: every candidate's set alone when the
    manifest has several (``source.candidates``), else the one set."""
    if "candidates" in source:
        return [f"candidate {cand}: {p}" for cand, sub in source["candidates"].items()
                for p in _source_problems(root, sub, clean_source)]
    patches = [(rel, (root / rel).read_bytes()) for rel in source["patches"] if (root / rel).is_file()]
    missing = [rel for rel in source["patches"] if not (root / rel).is_file()]
    if missing:
        return [f"{rel}: patch listed in {MANIFEST} source.patches is missing" for rel in missing]
    with tempfile.TemporaryDirectory(prefix="pairbench-verify-") as tmp:
        try:
            tree = apply_patches(clean_source, patches, tmp)
        except PatchError as exc:
            return [str(exc)]
        return patched_file_problems(tree, source["patched_files"])


def patched_file_problems(tree: Path, patched_files: Mapping[str, str]) -> list[str]:
    problems = []
    for rel, want in sorted(patched_files.items()):
        path = tree / rel
        if not path.is_file():
            problems.append(f"source {rel}: missing after applying the patches")
        elif (got := sha256_file(path)) != want:
            problems.append(f"source {rel}: sha256 after patching is {got[:16]}..., the measured source had {want[:16]}...")
    return problems
