"""Export a pristine tree of a git repository at a tag, never touching the user's checkout.

An arm's source may be a git repository (a local path or a URL) plus a tag
(``source: {git: <path-or-url>, tag: <tag>}``). The harness needs a clean copy of exactly that
tag to apply patches to; the user's working tree, index and refs must stay as they are.

How:
- a **local path** is read in place with read-only plumbing (``rev-parse``, ``archive``) and
  ``GIT_OPTIONAL_LOCKS=0``, so git does not even refresh the user's index opportunistically;
- a **URL** (``https://``, ``ssh://``, ``file://``, ``user@host:path``) is fetched, tag only and
  shallow, into a private bare cache repository (one per URL, under ``cache_dir``) and read there;
- the tag must resolve to a commit (``refs/tags/<tag>^{commit}``), else :class:`GitSourceError`
  names the tag and the repository and lists a few tags that do exist;
- the tree is streamed out with ``git archive <commit>`` and unpacked with :mod:`tarfile`'s
  ``data`` filter (no absolute paths, no links leaving the tree, no device files).

Caveat (documented in docs/engines.md): ``git archive`` honours the repository's own
``export-ignore``/``export-subst`` attributes, like a release tarball; submodules are not included.
The commit and its tree hash are recorded so the export can be re-derived and audited.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["GitSourceError", "GitExport", "is_url", "resolve_tag", "export_tag"]

_URL_RE = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|[\w.-]+@[\w.-]+:)", re.IGNORECASE)


class GitSourceError(Exception):
    """A git source cannot be exported: bad repository, unknown tag, failed fetch. Names the culprit."""


@dataclass(frozen=True)
class GitExport:
    """What was exported. ``repo`` is as the user gave it (a path or URL: private, never published)."""

    repo: str
    tag: str
    commit: str  # 40-hex commit the tag peels to
    tree: str  # 40-hex tree of that commit
    tag_object: str | None  # the annotated tag object's sha, None for a lightweight tag
    files: int  # regular files written

    def to_dict(self) -> dict:
        return asdict(self)


def is_url(repo: str) -> bool:
    """True for ``scheme://...`` and scp-like ``user@host:path``; False for a filesystem path."""
    return bool(_URL_RE.match(repo))


def _git(args: list[str], *, git_dir: str | None = None, cwd: str | None = None,
         stdout=subprocess.PIPE, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["GIT_OPTIONAL_LOCKS"] = "0"  # never rewrite the user's index as a side effect
    env["GIT_TERMINAL_PROMPT"] = "0"  # a URL needing credentials fails instead of hanging
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    cmd = ["git"]
    if git_dir is not None:
        cmd += ["--git-dir", git_dir]
    cmd += args
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=stdout, stderr=subprocess.PIPE)
    if check and proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd, proc.stdout, proc.stderr)
    return proc


def _local_git_dir(repo: str) -> str:
    path = Path(repo).expanduser()
    if not path.exists():
        raise GitSourceError(f"source.git: {repo!r} is neither an existing path nor a URL")
    proc = _git(["rev-parse", "--absolute-git-dir"], cwd=str(path), check=False)
    if proc.returncode != 0:
        raise GitSourceError(
            f"source.git: {repo!r} is not a git repository ({proc.stderr.decode().strip()})"
        )
    return proc.stdout.decode().strip()


def _cache_git_dir(url: str, tag: str, cache_dir: Path) -> str:
    """Fetch only ``refs/tags/<tag>`` (shallow) from *url* into a bare cache repo; return its path."""
    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    git_dir = cache_dir / f"{key}.git"
    if not (git_dir / "HEAD").exists():
        git_dir.parent.mkdir(parents=True, exist_ok=True)
        _git(["init", "--quiet", "--bare", str(git_dir)])
    ref = f"refs/tags/{tag}"
    proc = _git(
        ["fetch", "--quiet", "--depth", "1", "--no-tags", url, f"+{ref}:{ref}"],
        git_dir=str(git_dir), check=False,
    )
    if proc.returncode != 0:
        err = proc.stderr.decode().strip()
        if "couldn't find remote ref" in err or "not our ref" in err:
            raise GitSourceError(f"source.tag: tag {tag!r} does not exist in {url}")
        raise GitSourceError(f"source.git: fetching tag {tag!r} from {url} failed: {err}")
    return str(git_dir)


def _known_tags(git_dir: str, limit: int = 8) -> list[str]:
    proc = _git(["for-each-ref", "--sort=-creatordate", "--format=%(refname:short)",
                 f"--count={limit}", "refs/tags"], git_dir=git_dir, check=False)
    return proc.stdout.decode().split() if proc.returncode == 0 else []


def resolve_tag(repo: str, tag: str, cache_dir: str | os.PathLike | None = None) -> tuple[str, str, str, str | None]:
    """Resolve *tag* in *repo*; return ``(git_dir, commit, tree, tag_object_or_None)``.

    Only a tag is accepted (``refs/tags/<tag>``), not a branch or a bare sha: a tag is the
    reproducible name the issue asks for. Raises :class:`GitSourceError` naming the tag.
    """
    if not tag or not isinstance(tag, str):
        raise GitSourceError("source.tag: a non-empty tag name is required with source.git")
    if is_url(repo):
        if cache_dir is None:
            raise GitSourceError(f"source.git: {repo!r} is a URL; a cache_dir is needed to fetch it")
        git_dir = _cache_git_dir(repo, tag, Path(cache_dir))
    else:
        git_dir = _local_git_dir(repo)
    ref = f"refs/tags/{tag}"
    proc = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], git_dir=git_dir, check=False)
    if proc.returncode != 0:
        known = _known_tags(git_dir)
        hint = f"; tags here include: {', '.join(known)}" if known else "; this repository has no tags"
        raise GitSourceError(f"source.tag: tag {tag!r} does not resolve to a commit in {repo}{hint}")
    commit = proc.stdout.decode().strip()
    tree = _git(["rev-parse", f"{commit}^{{tree}}"], git_dir=git_dir).stdout.decode().strip()
    obj = _git(["rev-parse", ref], git_dir=git_dir).stdout.decode().strip()
    return git_dir, commit, tree, (obj if obj != commit else None)


def export_tag(repo: str, tag: str, dest: str | os.PathLike,
               cache_dir: str | os.PathLike | None = None) -> GitExport:
    """Write the tree of *repo* at *tag* into *dest* (created; must not exist or be empty).

    The user's repository is only read. Returns a :class:`GitExport` recording the commit.
    """
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise GitSourceError(f"export destination {dest} is not empty")
    git_dir, commit, tree, tag_object = resolve_tag(repo, tag, cache_dir)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as tar_fh:
        proc = _git(["archive", "--format=tar", commit], git_dir=git_dir, stdout=tar_fh, check=False)
        if proc.returncode != 0:
            raise GitSourceError(
                f"git archive of {tag!r} ({commit[:12]}) in {repo} failed: {proc.stderr.decode().strip()}"
            )
        tar_fh.seek(0)
        files = 0
        with tarfile.open(fileobj=tar_fh, mode="r:") as tar:
            members = tar.getmembers()
            files = sum(1 for m in members if m.isfile())
            # 'data' filter: refuse absolute paths, '..', links out of dest and special files.
            tar.extractall(dest, members=members, filter="data")
    return GitExport(repo=repo, tag=tag, commit=commit, tree=tree, tag_object=tag_object, files=files)
