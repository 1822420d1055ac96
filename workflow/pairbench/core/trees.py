"""A folder tree's sha256 manifest and one hash over it, and what a build added to a tree.

An arm's exported source is pinned by these (:mod:`pairbench.arms.source` writes them into
``source/<arm>.json``), the build checks that it left the source as exported and names what it
added (:func:`build_outputs`: a CMake build folder, a Python environment, generated files), and the
audit re-checks a run's trees against them (:mod:`pairbench.integrity.audit`): all read the same
definition of "the files of a tree".
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Iterable

from pairbench.core.artifacts import sha256_file

__all__ = ["build_outputs", "manifest", "source_files", "tree_sha256"]


def source_files(src: str | Path, exclude: Iterable[str] = ()) -> list[str]:
    """Files of a source tree, relative and sorted, without byte-code caches.

    Also without the empty ``.snakemake_timestamp`` that Snakemake leaves at the top of a
    ``directory()`` output: an external arm's tree is ``src/<arm>/`` itself, and that marker is the
    workflow's, not the source's. *exclude* names relative paths (folders or files, at any depth)
    to leave out: what a build added to the tree after the export (a compiled engine's ``build/``,
    an installed arm's ``.venv``; :func:`build_outputs`)."""
    src = Path(src)
    skip = set(exclude)
    out = []
    for dirpath, dirnames, filenames in os.walk(src):
        here = Path(dirpath).relative_to(src)
        dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", ".pytest_cache")
                             and (here / d).as_posix() not in skip)
        for name in filenames:
            if name.endswith((".pyc", ".pyo")):
                continue
            if name == ".snakemake_timestamp" and Path(dirpath) == src:
                continue
            rel = (here / name).as_posix()
            if rel not in skip:
                out.append(rel)
    return sorted(out)


def manifest(tree: str | Path, exclude: Iterable[str] = ()) -> dict[str, str]:
    """``{relative path: sha256}`` of every file of *tree* (:func:`source_files`)."""
    tree = Path(tree)
    return {rel: sha256_file(tree / rel) for rel in source_files(tree, exclude)}


def tree_sha256(man: dict[str, str]) -> str:
    """One hash for a whole manifest (sorted ``sha256  path`` lines, like sha256sum)."""
    text = "".join(f"{sha}  {path}\n" for path, sha in sorted(man.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def build_outputs(tree: str | Path, source: Iterable[str]) -> list[str]:
    """What a build added to *tree*, whose exported files are *source* (relative paths): each file
    that is not one of them, named by its topmost folder that holds no source file (``build``,
    ``.venv``, ``pkg.egg-info``), or by itself where it lies beside source files
    (``vllm/_C.abi3.so``). Sorted; folders without files are not counted."""
    source = set(source)
    source_dirs = {"."} | {Path(p).parent.as_posix() for p in source}
    source_dirs |= {Path(d).as_posix() for p in source for d in Path(p).parents}
    added = set()
    for rel in source_files(tree):
        if rel in source:
            continue
        parts = Path(rel).parts
        # the first ancestor (from the top) that holds no source file, else the file itself
        top = next(("/".join(parts[:i]) for i in range(1, len(parts)) if "/".join(parts[:i]) not in source_dirs), rel)
        added.add(top)
    return sorted(added)
