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
                  plan_sha256: str) -> dict:
    """Export *source* into ``arm_dir/engine/``, apply *patches*; return the ``source`` artifact body.

    *source* may also be ``{"git": <path or URL>, "tag": <tag>}`` (exported clean at the tag into
    ``arm_dir/`` itself, so patches are against the repository's own paths) or None (an installed
    engine: an empty tree, no patches).
    """
    root, arm_dir = Path(root), Path(arm_dir)
    if source is None or isinstance(source, dict):
        return _export_external(arm, source, patches, arm_dir, root, plan_sha256)
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
                     plan_sha256: str) -> dict:
    """The git-tag (or installed, ``None``) source of a non-embedded arm; see :func:`export_source`."""
    from pairbench.arms.gitsource import export_tag

    if arm_dir.exists():
        shutil.rmtree(arm_dir)
    git = None
    if source is None:
        arm_dir.mkdir(parents=True)
        version = "installed"
    else:
        repo = source["git"]
        if not is_url_like(repo):  # ~/.cache/pairbench/llama.cpp works as written in a config
            repo = str((root / Path(repo).expanduser()).resolve())
        exp = export_tag(repo, source["tag"], arm_dir, cache_dir=root / "resources" / "cache" / "git")
        git = {"tag": exp.tag, "commit": exp.commit, "tree": exp.tree, "tag_object": exp.tag_object}
        version = exp.tag
    body = {
        "arm": arm,
        "source": None if source is None else {"git": source["git"], "tag": source["tag"]},
        "version": version,
        **_patch_and_record(arm, patches, arm_dir, arm_dir, root, "of the exported tree"),
        "inputs": {"plan": plan_sha256},
    }
    if git is not None:
        body["git"] = git
    return body


def is_url_like(repo: str) -> bool:
    from pairbench.arms.gitsource import is_url

    return is_url(repo)
