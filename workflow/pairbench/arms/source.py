"""Export an arm's source pristine, then apply its patches: ``src/<arm>/engine/`` + ``source/<arm>.json``.

The harness never edits a source in place. It copies the arm's source directory (default
``engine/``, at the version in its ``VERSION`` file) to ``src/<arm>/engine/``, records a sha256
manifest of the pristine copy, then for each patch in order runs ``git apply --check`` and
``git apply`` with the working directory ``src/<arm>/`` (patches are unified diffs against
``engine/…`` paths). A patch that does not apply fails with a :class:`PatchError` naming the patch
and the first failing file or hunk.

``git apply`` is run with ``GIT_CEILING_DIRECTORIES`` set so it never discovers the enclosing
pairbench repository: inside a repository, git apply silently *skips* paths outside the current
directory, which would make every patch a no-op that "applies".
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from pairbench.arms.gitsource import (GitRef, GitSourceError, check_clean, export_ref, is_url, resolve_ref,
                                      resolve_tag)
from pairbench.core.artifacts import sha256_file
from pairbench.core.trees import manifest, tree_sha256

IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", ".pytest_cache")


class PatchError(Exception):
    """A patch does not apply. The message names the arm, the patch and the first failing file/hunk."""


def _git_apply(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(cwd.resolve().parent)}
    return subprocess.run(["git", "apply", *args], cwd=cwd, env=env, capture_output=True, text=True)


def first_failure(stderr: str) -> str:
    """The first failing file or hunk from git apply's stderr, e.g. ``engine/model.py (hunk at line 42)``."""
    m = re.search(r"error: patch failed: (\S+):(\d+)", stderr)
    if m:
        return f"{m.group(1)} (hunk at line {m.group(2)})"
    m = re.search(r"error: (\S+): (No such file or directory|does not exist in index|already exists in working directory)", stderr)
    if m:
        return f"{m.group(1)} ({m.group(2)})"
    m = re.search(r"error: (.+)", stderr)
    return m.group(1).strip() if m else (stderr.strip().splitlines() or ["git apply failed"])[0]


def patched_files(patch: Path) -> list[str]:
    files = []
    for line in patch.read_text(errors="replace").splitlines():
        if line.startswith("+++ ") and not line.startswith("+++ /dev/null"):
            path = line[4:].split("\t")[0].strip()
            files.append(path[2:] if path.startswith("b/") else path)
    return files


def apply_patches(arm: str, patches: list[str], arm_dir: Path, root: Path) -> list[dict]:
    """Check then apply each patch in order; raise :class:`PatchError` on the first that fails."""
    done = []
    for i, rel in enumerate(patches):
        patch = (Path(root) / rel).resolve()
        if not patch.is_file():
            raise PatchError(f"arms.{arm}.patches[{i}]: patch file {rel} does not exist")
        check = _git_apply(["--check", "--verbose", str(patch)], arm_dir)
        if check.returncode != 0:
            raise PatchError(
                f"arms.{arm}.patches[{i}]: patch {rel} does not apply: first failure at "
                f"{first_failure(check.stderr)}\n--- git apply --check said:\n{check.stderr.strip()}"
            )
        applied = _git_apply([str(patch)], arm_dir)
        if applied.returncode != 0:  # should not happen after a clean --check
            raise PatchError(f"arms.{arm}.patches[{i}]: patch {rel} failed to apply: {first_failure(applied.stderr)}")
        files = patched_files(patch)
        if not files:
            raise PatchError(f"arms.{arm}.patches[{i}]: patch {rel} changes no files (is it a unified diff?)")
        done.append({"path": rel, "sha256": sha256_file(patch), "files": files})
    return done


def export_source(arm: str, source: str, patches: list[str], arm_dir: str | Path, root: str | Path,
                  plan_sha256: str, commit: str | None = None, paths: tuple[str, ...] = ()) -> dict:
    """Export *source* into ``arm_dir/engine/``, apply *patches*; return the ``source`` artifact body.

    *source* may also be ``{"git": <path or URL>, "tag": <tag>}`` or ``{"git": ..., "ref": <branch,
    tag or sha>}`` (exported clean at that commit into ``arm_dir/`` itself, so patches are against the
    repository's own paths: ``engine/...`` for this repository's embedded engine) or None (an
    installed engine: an empty tree, no patches). *commit*, when given, is the sha the pipeline
    resolved the ref to when it planned the job: a ref that names another commit by now is an error.
    *paths*, for a ``ref``: export only these folders of the commit (``("engine",)`` for the embedded
    engine: what is compared is its package, not the rest of the repository).
    """
    root, arm_dir = Path(root), Path(arm_dir)
    if source is None or isinstance(source, dict):
        return _export_external(arm, source, patches, arm_dir, root, plan_sha256, commit, paths)
    src = root / source
    version_file = src / "VERSION"
    if not version_file.is_file():
        raise FileNotFoundError(f"arms.{arm}.source: {source} has no VERSION file")
    if arm_dir.exists():
        shutil.rmtree(arm_dir)
    dest = arm_dir / "engine"
    shutil.copytree(src, dest, ignore=IGNORE)
    return {
        "arm": arm,
        "source": source,
        "version": version_file.read_text().strip(),
        **_patch_and_record(arm, patches, dest, arm_dir, root, f"under {source}"),
        "inputs": {"plan": plan_sha256},
    }


def _patch_and_record(arm: str, patches: list[str], tree: Path, patch_cwd: Path, root: Path, where: str) -> dict:
    """Apply *patches* (from *patch_cwd*) and return the source record's ``pristine``, ``patches`` and
    ``patched`` parts for *tree*; patches that change no file are an error naming the arm."""
    pristine = manifest(tree)
    applied = apply_patches(arm, patches, patch_cwd, root)
    patched = manifest(tree)
    changed = sorted(p for p in set(pristine) | set(patched) if pristine.get(p) != patched.get(p))
    if patches and not changed:
        raise PatchError(f"arms.{arm}.patches: the patches applied but changed no file {where}")
    return {
        "pristine": {"files": len(pristine), "tree_sha256": tree_sha256(pristine), "manifest": pristine},
        "patches": applied,
        "patched": {"files": len(patched), "tree_sha256": tree_sha256(patched), "changed": changed},
    }


def _export_external(arm: str, source: dict | None, patches: list[str], arm_dir: Path, root: Path,
                     plan_sha256: str, commit: str | None = None, paths: tuple[str, ...] = ()) -> dict:
    """The git (or installed, ``None``) source of an arm; see :func:`export_source`."""
    if arm_dir.exists():
        shutil.rmtree(arm_dir)
    git = None
    if source is None:
        arm_dir.mkdir(parents=True)
        version = "installed"
    else:  # a ref or a tag: resolved to its commit, exported through the cache of commits
        ref = resolve_source(source, root)
        key = "ref" if "ref" in source else "tag"
        if commit is not None and ref.commit != commit:
            raise GitSourceError(f"arms.{arm}.source.{key}: {source[key]!r} moved from {commit[:12]} to "
                                 f"{ref.commit[:12]} while the run started; run it again")
        export_ref(ref, arm_dir, cache_dir=git_cache(root), paths=paths)
        git, version = ref.record(), source[key]
    body = {
        "arm": arm,
        "source": None if source is None else {k: source[k] for k in ("git", "tag", "ref") if k in source},
        "version": version,
        **_patch_and_record(arm, patches, arm_dir, arm_dir, root, "of the exported tree"),
        "inputs": {"plan": plan_sha256},
    }
    if git is not None:
        body["git"] = git
    return body


def git_cache(root: str | Path) -> Path:
    """Where git sources are cached: a URL's bare repository, and every exported commit's archive."""
    return Path(root) / "resources" / "cache" / "git"


def _repo_path(repo: str, root: Path) -> str:
    if is_url(repo):
        return repo
    return str((Path(root) / Path(repo).expanduser()).resolve())  # ~/.cache/pairbench/llama.cpp works as written


def is_git_source(source) -> bool:
    return isinstance(source, dict) and "git" in source


def resolve_source(source: dict, root: str | Path) -> GitRef:
    """The commit an arm's ``{git, ref}`` or ``{git, tag}`` source names now (the repository path
    relative to *root*): :class:`~pairbench.arms.gitsource.GitSourceError` names the ref and the
    repository when it does not resolve or the repository cannot be read; a ref naming the
    checked-out commit of a work tree with uncommitted changes is refused (:func:`check_clean`)."""
    repo = _repo_path(source["git"], Path(root))
    if "ref" in source:
        ref = resolve_ref(repo, source["ref"], cache_dir=git_cache(root))
        check_clean(ref)
        return ref
    tag = source["tag"]
    git_dir, commit, tree, tag_object = resolve_tag(repo, tag, cache_dir=git_cache(root))
    return GitRef(repo=repo, ref=tag, ref_name=f"refs/tags/{tag}", commit=commit, tree=tree, tag_object=tag_object,
                  git_dir=git_dir)


def same_commit_arms(arms: dict, commits: dict) -> list[tuple[str, str]]:
    """``(arm, message)`` for arms that would measure the same code: two git arms whose refs resolve
    to one commit (*commits*: arm -> sha) with the same patches, build, launch, arguments and
    environment. That is an A/A run, not base against head (a deliberate A/A names one path source
    twice)."""
    problems, seen = [], {}
    keys = ("engine", "patches", "build", "launch", "args", "env", "threads")
    for name, commit in commits.items():
        arm = arms[name] or {}
        what = (commit, repr([arm.get(k) for k in keys]))
        if what in seen:
            other = seen[what]
            refs = [(arms[n].get("source") or {}).get("ref") or (arms[n].get("source") or {}).get("tag") for n in (other, name)]
            problems.append((name, f"arms {other} and {name} resolve {refs[0]!r} and {refs[1]!r} to the same commit "
                                   f"{commit[:12]} with the same patches and settings: an A/A run, not base against "
                                   "head. Name two different commits (a deliberate A/A names one path source in both "
                                   "arms)"))
        else:
            seen[what] = name
    return problems


def git_problems(arms: dict, root: str | Path) -> tuple[dict, list[tuple[tuple, str]]]:
    """``({arm: GitRef}, problems)``: every git arm's ref resolved now, and each reason one cannot be
    as ``(key, message)``: a ref that does not resolve, a repository that cannot be read, a ref naming
    a dirty checkout (``arms.<arm>.source.<git|ref|tag>``), two arms of one commit
    (``arms.<arm>.source``)."""
    refs, problems = {}, []
    for name, arm in arms.items():
        source = (arm or {}).get("source")
        if not is_git_source(source):
            continue
        try:
            refs[name] = resolve_source(source, root)
        except GitSourceError as exc:
            problems.append((("arms", name, "source", *([exc.field] if exc.field else [])), exc.message))
    problems += [(("arms", name, "source"), message)
                 for name, message in same_commit_arms(arms, {n: r.commit for n, r in refs.items()})]
    return refs, problems


def is_url_like(repo: str) -> bool:
    return is_url(repo)
