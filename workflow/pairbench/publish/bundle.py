"""Build the publication bundle: allowlist, scrub, field checks, MANIFEST, leak gate, atomic move.

:func:`build_bundle` is the whole ``publish`` stage as a library call. It fails closed: any problem
(a file that will not parse, a non-numeric field, a patch that no longer applies, a single leak-gate
finding) raises :class:`PublishError` naming the file, line/field and detector, writes the full
result under ``private_dir``, and leaves no bundle, half-built or otherwise, at ``out_dir``.

See docs/publishing.md for the contract with the pipeline.
"""

from __future__ import annotations

import csv
import fnmatch
import io
import os
import re
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Mapping

from pairbench import __version__
from pairbench.publish import leakgate
from pairbench.publish import sanitize
from pairbench.core.artifacts import (ArtifactError, atomic_write_text, dumps, fsync_dir, parse_artifact, sha256_bytes,
                                      validate, write_artifact)
from pairbench.publish.verify import (MANIFEST, TABLE_SCHEMA, PatchError, apply_patches, fixture_problems, messages_sha256,
                     patched_file_problems, table_problems, text_sha256)

# What may be published. Glob patterns over bundle-relative paths; '*' never crosses a '/'.
DEFAULT_ALLOWLIST: tuple[str, ...] = (
    "README.md",               # the report
    "environment.json",        # envfacts.public(): public machine facts
    "fixtures.json",           # fixture manifest: synthetic messages + hashes (fixture_manifest())
    "stats_params.json",       # what the statistics were computed with (pairbench verify recomputes them)
    "gate.json",               # the CI gate's decision (pairbench.publish.gate; verify recomputes it)
    "config.resolved.yaml",    # the resolved config (scrubbed text; not field-checked)
    "tables/*.csv",            # numeric tables
    "tables/*.json",           # numeric JSON tables (stats summary, verdicts)
    "patches/*.patch",         # stripped prototype patches (passed via build_bundle(patches=...))
    "plots/*.png",             # plots, text metadata stripped
    "scripts/*.py",            # optional helper scripts (syntax-checked by verify)
    "MANIFEST.json",           # written by build_bundle itself
)

# The only fields of a CSV/JSON table that may hold text. Everything else is numeric, boolean or null.
CATEGORICAL_FIELDS: frozenset[str] = frozenset({
    "arm", "baseline", "candidate", "condition", "round", "metric", "verdict", "case", "case_name", "cases",
    "kind", "stat", "statistic", "unit", "direction", "status", "reason", "reasons", "flags", "label",
    "method", "test", "alternative", "order", "visit_order", "role", "engine", "model", "quantization",
    "significant", "better", "schema", "quantity", "size", "tool", "tool_direction", "functions",
})

# Files exempt from the field check (still scrubbed and leak-gated): prose, config, code, and JSON
# whose text fields are constrained by their own strict schema.
FIELD_CHECK_EXEMPT: tuple[str, ...] = ("README.md", "config.resolved.yaml", "patches/*.patch", "scripts/*.py",
                                       "environment.json", "fixtures.json", "stats_params.json", "gate.json",
                                       "MANIFEST.json")

README_MARKER = "<!-- pairbench:leak-gate -->"
_SAFE_TOKEN = re.compile(r"^[A-Za-z0-9_.:+/ <>=()-]{0,64}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_TEXT_SUFFIXES = leakgate.TEXT_SUFFIXES


class PublishError(Exception):
    """Publishing failed; nothing was published. The message names the file, line/field and cause."""


class LeakGateError(PublishError):
    """The leak gate found something in the built bundle."""

    def __init__(self, message: str, findings: list[leakgate.Finding]):
        super().__init__(message)
        self.findings = findings


def allowed(rel: str, allowlist: Iterable[str]) -> bool:
    """Whether bundle path *rel* matches one of the allowlist globs, component by component."""
    parts = PurePosixPath(rel).parts
    for pattern in allowlist:
        pparts = PurePosixPath(pattern).parts
        if len(pparts) == len(parts) and all(fnmatch.fnmatchcase(a, p) for a, p in zip(parts, pparts)):
            return True
    return False


def _norm(rel: str) -> str:
    p = PurePosixPath(str(rel).replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or not p.parts or not re.fullmatch(r"[A-Za-z0-9_.+/-]+", str(p)):
        raise PublishError(f"{rel!r}: not a plain relative bundle path")
    return str(p)


def _read_source(name: str, src: Any) -> bytes:
    if isinstance(src, bytes):
        return src
    if isinstance(src, (str, os.PathLike)):
        try:
            return Path(src).read_bytes()
        except OSError as exc:
            raise PublishError(f"{name}: cannot read its source file: {exc}") from None
    raise PublishError(f"{name}: source must be a path (str/PathLike) or bytes, got {type(src).__name__}")


# --- field checks ------------------------------------------------------------------------------

def json_field_problems(rel: str, data: Any, categorical: Iterable[str]) -> list[str]:
    """Strings in a JSON table may only sit under categorical keys (or be sha256 digests)."""
    cat = set(categorical)
    problems: list[str] = []

    def walk(node: Any, path: str, key: str | None) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if not _SAFE_TOKEN.match(k) or not k:
                    problems.append(f"{rel}: field {path or '<root>'}: key {k!r} is not a plain field name")
                walk(v, f"{path}/{k}" if path else k, k)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}/{i}", key)
        elif isinstance(node, str):
            if _HEX64.match(node):
                return
            if key not in cat:
                problems.append(f"{rel}: field {path!r} holds text but {key!r} is not an allowlisted categorical field")
            elif not _SAFE_TOKEN.match(node):
                problems.append(f"{rel}: field {path!r}: categorical value is not a short label")

    walk(data, "", None)
    return problems


def _csv_categorical(text: str, categorical: Iterable[str]) -> list[str]:
    header = next(csv.reader(io.StringIO(text)), [])
    return sorted(set(header) & set(categorical))


# --- fixture manifest --------------------------------------------------------------------------

def fixture_manifest(fixtures: Iterable[Mapping[str, Any]], inputs: Mapping[str, str] | None = None) -> dict:
    """The ``fixtures.json`` body from fixture records ({condition, messages, [prompt_tokens], [text]}),
    in the order given (the plan's condition order).

    Hashes are computed here with :func:`pairbench.publish.verify.messages_sha256` / ``text_sha256``, the
    same functions ``verify`` uses. Write it with ``write_artifact(path, "fixture_manifest", body)``.
    """
    out = []
    for fx in fixtures:
        entry = {"condition": str(fx["condition"]),
                 "messages": [{"role": m["role"], "content": m["content"]} for m in fx["messages"]]}
        entry["messages_sha256"] = messages_sha256(entry["messages"])
        if fx.get("prompt_tokens") is not None:
            entry["prompt_tokens"] = int(fx["prompt_tokens"])
        if fx.get("text") is not None:
            entry["text"] = fx["text"]
            entry["text_sha256"] = text_sha256(fx["text"])
        out.append(entry)
    return {"inputs": dict(inputs or {}), "fixtures": out}


# --- the bundle --------------------------------------------------------------------------------

def _prepare(rel: str, data: bytes, identifiers, pseudonyms, categorical) -> tuple[bytes, dict]:
    """Scrub and check one file; return its final bytes and its MANIFEST entry fields."""
    suffix = PurePosixPath(rel).suffix.lower()
    entry: dict[str, Any] = {"schema": None}
    if suffix == ".png":
        try:
            return leakgate.strip_png_metadata(data), entry
        except ValueError as exc:
            raise PublishError(f"{rel}: {exc}") from None
    if suffix not in _TEXT_SUFFIXES:
        raise PublishError(f"{rel}: unknown file type {suffix!r}; add a scrub rule before allowlisting it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PublishError(f"{rel}: not UTF-8 text ({exc})") from None
    text = sanitize.scrub_text(text, identifiers, pseudonyms)
    exempt = allowed(rel, FIELD_CHECK_EXEMPT)
    if suffix == ".json":
        try:  # after scrubbing, still an artifact of a known schema
            obj, kind, version = parse_artifact(text, rel)
            validate(kind, obj, where=rel)
        except ArtifactError as exc:
            raise PublishError(f"a published JSON file must be a valid pairbench artifact: {exc}") from None
        problems = [] if exempt else json_field_problems(rel, obj, categorical)
        problems += fixture_problems(rel, obj) if kind == "fixture_manifest" else []
        if problems:
            raise PublishError("\n".join(problems))
        entry["schema"] = obj["schema"]
    elif suffix == ".csv":
        cats = _csv_categorical(text, categorical)
        problems = table_problems(rel, text, cats)
        if problems:
            raise PublishError("\n".join(problems))
        entry["schema"] = TABLE_SCHEMA
        entry["categorical"] = cats
    elif suffix == ".py":
        try:
            compile(text, rel, "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise PublishError(f"{rel}: line {exc.lineno}: Python syntax error after scrubbing: {exc.msg}") from None
    return text.encode("utf-8"), entry


def build_bundle(
    out_dir: str | os.PathLike,
    files: Mapping[str, str | os.PathLike | bytes],
    *,
    identifiers: Mapping[str, Iterable[str]],
    private_dir: str | os.PathLike,
    allowlist: Iterable[str] = DEFAULT_ALLOWLIST,
    categorical: Iterable[str] = CATEGORICAL_FIELDS,
    patches: Mapping[str, str | os.PathLike] | None = None,
    clean_source: str | os.PathLike | None = None,
    patched_files: Mapping[str, str] | None = None,
    patch_roots: Iterable[str] = (),
    patch_sets: Mapping[str, tuple[list[str], Mapping[str, str]]] | None = None,
) -> dict:
    """Build the bundle at *out_dir* from *files* (bundle path -> source path or bytes).

    - A ``str`` or ``PathLike`` value is a path to read; ``bytes`` are the content itself.
    - Names not matching *allowlist* are not copied; they are listed in the result's ``excluded``.
    - *patches*: patch name -> path of ``git format-patch`` output, in application order; each is
      stripped (:func:`sanitize.strip_patch`, paths under *patch_roots* made relative), scrubbed and
      written to ``patches/<name>.patch``.
    - *clean_source*: when given, the stripped patches must apply to it in order, and the files named
      in *patched_files* (source-relative path -> sha256 from the measured source) must hash equal
      afterwards. *patched_files* is recorded in MANIFEST.json for ``verify`` either way.
    - *patch_sets*: with several patched candidates, candidate -> (its patch names, in order, keys of
      *patches*; its *patched_files*): each set is checked alone against *clean_source* and recorded
      under ``MANIFEST.source.candidates`` (*patches* then holds every candidate's, once each).
    - A ``README.md`` line holding ``<!-- pairbench:leak-gate -->`` gets the gate's report line.

    Returns ``{"bundle", "files", "detectors", "findings", "report_line", "excluded",
    "patches_checked", "private_result", "pseudonyms"}``; ``report_line`` is "0 findings by
    detect-secrets (N plugins, ...), ..., over M files", detectors counted by family
    (:func:`leakgate.report_line`); ``patches_checked`` says whether the patches were re-applied to
    a clean source (False when there are patches but no *clean_source*: say so in the report).
    """
    out_dir = Path(out_dir)
    private_dir = Path(private_dir)
    allowlist = tuple(allowlist)
    pseudonyms: dict[str, str] = {}
    prepared, entries, excluded = _prepare_files(files, allowlist, identifiers, pseudonyms, frozenset(categorical))
    patch_order = _prepare_patches(patches or {}, prepared, entries, allowlist, identifiers, pseudonyms, patch_roots)
    rel_of = {name: patch_order[i] for i, name in enumerate(patches or {})}
    sets = {cand: ([rel_of[n] for n in names], dict(sorted(files.items())))
            for cand, (names, files) in (patch_sets or {}).items()}
    if clean_source is not None:
        _check_patches_apply(clean_source, sets or {None: (patch_order, patched_files or {})}, prepared)

    # The report line: N detectors, M files (everything prepared + MANIFEST.json), 0 findings, since
    # any finding aborts the publication below.
    detectors = leakgate.detector_names(identifiers)
    n_files = len(prepared) + 1
    line = leakgate.report_line(0, detectors, n_files)
    if "README.md" in prepared:
        readme = prepared["README.md"].decode("utf-8")
        if README_MARKER in readme:
            prepared["README.md"] = readme.replace(README_MARKER, line).encode("utf-8")

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    private_dir.mkdir(parents=True, exist_ok=True)
    tmp_bundle = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.building-", dir=out_dir.parent))
    try:
        _write_tree(tmp_bundle, prepared, _manifest(prepared, entries, patch_order, patched_files, sets))
        private_result = _leak_gate(tmp_bundle, out_dir, private_dir, prepared, identifiers=identifiers,
                                    detectors=detectors, n_files=n_files, excluded=excluded, pseudonyms=pseudonyms)
        _move_into_place(tmp_bundle, out_dir)
    finally:
        if tmp_bundle.exists():
            shutil.rmtree(tmp_bundle, ignore_errors=True)

    return {
        "bundle": str(out_dir),
        "files": n_files,
        "detectors": len(detectors),
        "findings": 0,
        "report_line": line,
        "excluded": sorted(excluded),
        "patches_checked": clean_source is not None,
        "private_result": str(private_result),
        "pseudonyms": str(private_dir / "pseudonyms.json"),
    }


def _prepare_files(files: Mapping[str, str | os.PathLike | bytes], allowlist: tuple[str, ...], identifiers,
                   pseudonyms: dict[str, str], categorical: frozenset[str]) -> tuple[dict[str, bytes], dict[str, dict], list[str]]:
    """Scrub and check every allowlisted one of *files*; their final bytes and MANIFEST entry fields
    (by bundle path), and the bundle paths left out as not allowlisted."""
    prepared: dict[str, bytes] = {}
    entries: dict[str, dict] = {}
    excluded: list[str] = []
    for name, src in files.items():
        rel = _norm(name)
        if rel == MANIFEST:
            raise PublishError(f"{MANIFEST}: written by build_bundle itself; do not pass it in files")
        if rel.startswith("patches/"):
            raise PublishError(f"{rel}: pass patches through build_bundle(patches=...), which strips identities")
        if not allowed(rel, allowlist):
            excluded.append(rel)
            continue
        prepared[rel], entries[rel] = _prepare(rel, _read_source(rel, src), identifiers, pseudonyms, categorical)
    return prepared, entries, excluded


def _prepare_patches(patches: Mapping[str, str | os.PathLike], prepared: dict[str, bytes], entries: dict[str, dict],
                     allowlist: tuple[str, ...], identifiers, pseudonyms: dict[str, str],
                     patch_roots: Iterable[str]) -> list[str]:
    """Strip and scrub each of *patches* into *prepared* and *entries* as ``patches/<name>.patch``;
    their bundle paths, in application order."""
    patch_order: list[str] = []
    for name, src in patches.items():
        base = PurePosixPath(_norm(name)).name
        rel = f"patches/{base if base.endswith('.patch') else base + '.patch'}"
        if rel in prepared:
            raise PublishError(f"{rel}: two patches map to the same bundle name")
        if not allowed(rel, allowlist):
            raise PublishError(f"{rel}: patches are not on the allowlist")
        raw = _read_source(rel, src)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise PublishError(f"{rel}: patch is not UTF-8 text") from None
        text = sanitize.scrub_text(sanitize.strip_patch(text, roots=patch_roots), identifiers, pseudonyms)
        prepared[rel], entries[rel] = text.encode("utf-8"), {"schema": None}
        patch_order.append(rel)
    return patch_order


def _check_patches_apply(clean_source: str | os.PathLike, sets: Mapping[str | None, tuple[list[str], Mapping[str, str]]],
                         prepared: Mapping[str, bytes]) -> None:
    """Each set (candidate, or None for the only one -> its stripped patches' bundle paths, in order;
    the files they patch -> sha256) must apply to *clean_source* and give files of those hashes."""
    for cand, (rels, files) in sets.items():
        who = f"candidate {cand}: " if cand else ""
        with tempfile.TemporaryDirectory(prefix="pairbench-apply-") as tmp:
            try:
                tree = apply_patches(clean_source, [(rel, prepared[rel]) for rel in rels], tmp)
            except PatchError as exc:
                raise PublishError(f"{who}stripped patch no longer applies: {exc}") from None
            problems = patched_file_problems(tree, files)
            if problems:
                raise PublishError(f"{who}patched source differs from the measured one:\n" + "\n".join(problems))


def _manifest(prepared: Mapping[str, bytes], entries: Mapping[str, dict], patch_order: list[str],
              patched_files: Mapping[str, str] | None, sets: Mapping[str, tuple[list[str], dict]]) -> dict:
    """The MANIFEST.json body: every prepared file's hash, size and entry fields, and the source's patches."""
    return {
        "inputs": {},
        "pairbench_version": __version__,
        "files": [{"path": rel, "sha256": sha256_bytes(prepared[rel]), "size_bytes": len(prepared[rel]), **entries[rel]}
                  for rel in sorted(prepared)],
        "source": {"patches": patch_order, "patched_files": dict(sorted((patched_files or {}).items())),
                   **({"candidates": {c: {"patches": r, "patched_files": f} for c, (r, f) in sets.items()}}
                      if sets else {})},
    }


def _write_tree(tmp_bundle: Path, prepared: Mapping[str, bytes], manifest: dict) -> None:
    """Write the prepared files and MANIFEST.json under *tmp_bundle*, with modes for sharing."""
    for rel, data in prepared.items():
        dest = tmp_bundle / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    write_artifact(tmp_bundle / MANIFEST, "manifest", manifest)
    # mkdtemp/mkstemp make 0700/0600; a bundle is meant to be shared: directories 0755, files 0644.
    for p in [tmp_bundle, *tmp_bundle.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


def _leak_gate(tmp_bundle: Path, out_dir: Path, private_dir: Path, prepared: Mapping[str, bytes], *,
               identifiers, detectors, n_files: int, excluded: list[str], pseudonyms: dict[str, str]) -> Path:
    """Scan the built bundle and write the full result and the pseudonyms under *private_dir*; raise
    if it found anything or the bundle holds files other than the prepared ones. The result's path."""
    findings = leakgate.scan(tmp_bundle, identifiers)
    gate = {
        "detectors": detectors,
        "files": leakgate.bundle_files(tmp_bundle),
        "findings": [f.private_dict() for f in findings],
        "excluded": sorted(excluded),
        "report_line": leakgate.report_line(len(findings), detectors, n_files),
    }
    private_result = private_dir / "leakgate.json"
    atomic_write_text(private_result, dumps(gate))
    atomic_write_text(private_dir / "pseudonyms.json", dumps(pseudonyms))
    if findings:
        raise LeakGateError(
            f"leak gate: {len(findings)} finding(s) in the bundle for {out_dir}; nothing was published "
            f"(full result: {private_result}):\n" + leakgate.format_findings(findings),
            findings,
        )
    if gate["files"] != sorted([*prepared, MANIFEST]):
        raise PublishError(f"bundle holds unexpected files: {sorted(set(gate['files']) - set(prepared))}")
    return private_result


def fsync_path(p: Path) -> None:
    """Sync a file's data, or a folder's entries."""
    if p.is_dir():
        fsync_dir(p)
        return
    with open(p, "rb") as fh:
        os.fsync(fh.fileno())


def _move_into_place(tmp_bundle: Path, out_dir: Path) -> None:
    """Replace *out_dir* by *tmp_bundle*: the old bundle (if any) aside, the new one in, the old one deleted."""
    old = None
    for p in [*tmp_bundle.rglob("*"), tmp_bundle]:  # every file's data and every folder's entries on disk
        fsync_path(p)
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.replace(out_dir, old / "bundle")
    os.replace(tmp_bundle, out_dir)
    fsync_dir(out_dir.parent)  # the renames themselves
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
