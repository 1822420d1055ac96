"""A folder tree's sha256 manifest and one hash over it.

An arm's exported source is pinned by these (:mod:`pairbench.arms.source` writes them into
``source/<arm>.json``), and the audit re-checks a run's trees against them
(:mod:`pairbench.integrity.audit`): both read the same definition of "the files of a tree".
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pairbench.core.artifacts import sha256_file

__all__ = ["manifest", "source_files", "tree_sha256"]


def source_files(src: str | Path, exclude_top: tuple[str, ...] = ()) -> list[str]:
    """Files of a source tree, relative and sorted, without byte-code caches.

    Also without the empty ``.snakemake_timestamp`` that Snakemake leaves at the top of a
    ``directory()`` output: an external arm's tree is ``src/<arm>/`` itself, and that marker is the
    workflow's, not the source's. *exclude_top* names top-level folders to leave out: a compiled
    engine's in-tree build folder (``build/``), which the build adds after the export."""
    src = Path(src)
    out = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", ".pytest_cache")
                             and not (Path(dirpath) == src and d in exclude_top))
        for name in filenames:
            if name.endswith((".pyc", ".pyo")):
                continue
            if name == ".snakemake_timestamp" and Path(dirpath) == src:
                continue
            out.append((Path(dirpath) / name).relative_to(src).as_posix())
    return sorted(out)


def manifest(tree: str | Path, exclude_top: tuple[str, ...] = ()) -> dict[str, str]:
    """``{relative path: sha256}`` of every file of *tree* (:func:`source_files`)."""
    tree = Path(tree)
    return {rel: sha256_file(tree / rel) for rel in source_files(tree, exclude_top)}


def tree_sha256(man: dict[str, str]) -> str:
    """One hash for a whole manifest (sorted ``sha256  path`` lines, like sha256sum)."""
    text = "".join(f"{sha}  {path}\n" for path, sha in sorted(man.items()))
    return hashlib.sha256(text.encode()).hexdigest()
