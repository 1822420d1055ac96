"""Export a pristine tree of a git repository at a tag or ref, never touching the user's checkout.

An arm's source may be a git repository (a local path or a URL) plus a tag
(``source: {git: <path-or-url>, tag: <tag>}``) or any ref, a branch, a tag or a commit sha
(``source: {git: <path-or-url>, ref: <ref>}``: :func:`resolve_ref`, :func:`export_ref`). The harness
needs a clean copy of exactly that commit to apply patches to; the user's working tree, index and
refs must stay as they are.

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

A ref (a branch moves, a tag or a sha does not) is resolved to its commit first, so the export is
keyed by that sha: :func:`export_ref` unpacks a cached ``git archive`` of the commit
(``<cache_dir>/exports/<commit>.tar``) when there is one, and a URL whose ref still names a cached
commit is not fetched again. The pipeline passes the resolved sha to the source job as a parameter,
so a moved branch re-exports and rebuilds, and an unmoved one reruns nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["GitSourceError", "GitExport", "GitRef", "is_url", "resolve_tag", "export_tag", "resolve_ref",
           "export_ref", "check_clean", "describe_ref"]

_URL_RE = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|[\w.-]+@[\w.-]+:)", re.IGNORECASE)


class GitSourceError(Exception):
    """A git source cannot be exported: bad repository, unknown tag or ref, failed fetch. Names the
    culprit. ``field`` is the source key at fault (``git``, ``tag`` or ``ref``; None for an export
    that failed as such), ``message`` what is wrong with it; the text reads ``source.<field>: <message>``."""

    def __init__(self, field_or_message: str, message: str | None = None):
        self.field = field_or_message if message is not None else None
        self.message = message if message is not None else field_or_message
        super().__init__(f"source.{self.field}: {self.message}" if self.field else self.message)


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
        raise GitSourceError("git", f"{repo!r} is neither an existing path nor a URL")
    proc = _git(["rev-parse", "--absolute-git-dir"], cwd=str(path), check=False)
    if proc.returncode != 0:
        raise GitSourceError(
            "git", f"{repo!r} is not a git repository ({proc.stderr.decode().strip()})"
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
            raise GitSourceError("tag", f"tag {tag!r} does not exist in {url}")
        raise GitSourceError("git", f"fetching tag {tag!r} from {url} failed: {err}")
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
        raise GitSourceError("tag", "a non-empty tag name is required with source.git")
    if is_url(repo):
        if cache_dir is None:
            raise GitSourceError("git", f"{repo!r} is a URL; a cache_dir is needed to fetch it")
        git_dir = _cache_git_dir(repo, tag, Path(cache_dir))
    else:
        git_dir = _local_git_dir(repo)
    ref = f"refs/tags/{tag}"
    proc = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], git_dir=git_dir, check=False)
    if proc.returncode != 0:
        known = _known_tags(git_dir)
        hint = f"; tags here include: {', '.join(known)}" if known else "; this repository has no tags"
        raise GitSourceError("tag", f"tag {tag!r} does not resolve to a commit in {repo}{hint}")
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


# --- any ref: a branch, a tag or a commit, resolved to a sha and exported through a sha-keyed cache ---

_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
EXPORTS = "exports"  # <cache_dir>/exports/<commit>.tar (+ .json): one git archive per commit
KEEP_EXPORTS = 16  # archives kept, the most recently used first


@dataclass(frozen=True)
class GitRef:
    """A ref resolved to its commit.

    ``repo`` and ``ref`` are as the user gave them (the repo is private, never published);
    ``ref_name`` is the full refname the ref went through (``refs/heads/main``, ``refs/tags/v1``,
    ``HEAD``; None for a sha or an expression such as ``main~1``); ``tag_object`` the annotated tag's
    own sha; ``git_dir`` where the commit's objects are (None when only the export cache holds it)."""

    repo: str
    ref: str
    ref_name: str | None
    commit: str
    tree: str
    tag_object: str | None
    git_dir: str | None

    @property
    def tag(self) -> str | None:
        """The tag's name when the ref went through ``refs/tags/``, else None."""
        prefix = "refs/tags/"
        return self.ref_name[len(prefix):] if self.ref_name and self.ref_name.startswith(prefix) else None

    def record(self) -> dict:
        """The source artifact's ``git`` block (no repository path: it is private)."""
        return {"ref": self.ref, "ref_name": self.ref_name, "commit": self.commit, "tree": self.tree,
                "tag": self.tag, "tag_object": self.tag_object}


def _check_ref_text(ref) -> None:
    if not isinstance(ref, str) or not ref.strip():
        raise GitSourceError("ref", "a non-empty branch, tag or commit is required with source.git")
    if ref.startswith("-") or any(ord(c) < 0x21 or c == "\x7f" for c in ref) or len(ref) > 255:
        raise GitSourceError("ref", f"{ref!r} is not a git ref (no leading '-', spaces or control characters)")


def resolve_ref(repo: str, ref: str, cache_dir: str | os.PathLike | None = None) -> GitRef:
    """Resolve *ref* (a branch, tag, full refname, ``HEAD``, or a commit sha; locally any revision
    git understands, ``main~1`` included) in *repo* to its commit.

    A local repository is only read. A URL is asked with ``git ls-remote`` (a URL's commit must be
    a branch, a tag or a full 40-hex sha); its objects are fetched, shallow, into a bare cache under
    *cache_dir* only when the export cache (:func:`export_ref`) lacks that commit. Raises
    :class:`GitSourceError` naming the ref and the repository.
    """
    _check_ref_text(ref)
    if is_url(repo):
        if cache_dir is None:
            raise GitSourceError("git", f"{repo!r} is a URL; a cache_dir is needed to fetch it")
        return _resolve_url(repo, ref, Path(cache_dir))
    return _resolve_local(repo, ref)


def _known_refs(git_dir: str, limit: int = 8) -> list[str]:
    proc = _git(["for-each-ref", "--sort=-committerdate", "--format=%(refname:short)", f"--count={limit}",
                 "refs/heads", "refs/tags"], git_dir=git_dir, check=False)
    return proc.stdout.decode().split() if proc.returncode == 0 else []


def _resolve_local(repo: str, ref: str) -> GitRef:
    git_dir = _local_git_dir(repo)
    proc = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], git_dir=git_dir, check=False)
    if proc.returncode != 0:
        known = _known_refs(git_dir)
        hint = (f"; branches and tags here include: {', '.join(known)}" if known
                else "; this repository has no branches or tags")
        raise GitSourceError("ref", f"{ref!r} does not resolve to a commit in {repo}{hint}")
    commit = proc.stdout.decode().strip()
    full = _git(["rev-parse", "--symbolic-full-name", ref], git_dir=git_dir, check=False)
    ref_name = full.stdout.decode().strip() if full.returncode == 0 else ""
    ref_name = ref_name if ref_name and "\n" not in ref_name else None
    tree = _git(["rev-parse", f"{commit}^{{tree}}"], git_dir=git_dir).stdout.decode().strip()
    tag_object = None
    if ref_name and ref_name.startswith("refs/tags/"):
        obj = _git(["rev-parse", ref_name], git_dir=git_dir).stdout.decode().strip()
        tag_object = obj if obj != commit else None
    return GitRef(repo=repo, ref=ref, ref_name=ref_name, commit=commit, tree=tree, tag_object=tag_object,
                  git_dir=git_dir)


def _ls_remote(url: str, ref: str) -> tuple[str, str, str | None]:
    """``(commit, full refname, annotated tag object or None)`` of *ref* at *url*: the ref as a full
    refname or ``HEAD``, else a tag of that name, else a branch."""
    proc = _git(["ls-remote", url], check=False)
    if proc.returncode != 0:
        raise GitSourceError("git", f"cannot read {url}: {proc.stderr.decode().strip() or 'git ls-remote failed'}")
    listing = {}
    for line in proc.stdout.decode().splitlines():
        sha, _, name = line.partition("\t")
        listing[name.strip()] = sha.strip()
    exact = [ref] if ref.startswith("refs/") or ref == "HEAD" else []
    for name in [*exact, f"refs/tags/{ref}", f"refs/heads/{ref}"]:
        if name in listing:
            peeled = listing.get(f"{name}^{{}}")
            return (peeled, name, listing[name]) if peeled else (listing[name], name, None)
    raise GitSourceError("ref", f"{ref!r} does not exist in {url} (no branch, tag or ref of that name; "
                         "a commit of a URL is named by its full 40-hex sha)")


def _resolve_url(url: str, ref: str, cache_dir: Path) -> GitRef:
    if _SHA_RE.match(ref):
        commit, ref_name, tag_object = ref, None, None
    else:
        commit, ref_name, tag_object = _ls_remote(url, ref)
    tree = _cached_tree(cache_dir, commit)
    if tree is not None:  # exported before: nothing to fetch unless another part of it is wanted
        return GitRef(repo=url, ref=ref, ref_name=ref_name, commit=commit, tree=tree, tag_object=tag_object,
                      git_dir=None)
    return _fetch(GitRef(repo=url, ref=ref, ref_name=ref_name, commit=commit, tree="", tag_object=tag_object,
                         git_dir=None), cache_dir)


def _fetch(ref: GitRef, cache_dir: Path) -> GitRef:
    """*ref* of a URL fetched (shallow: its ref, or its sha) into the URL's bare cache repository."""
    url = ref.repo
    git_dir = Path(cache_dir) / f"{hashlib.sha256(url.encode()).hexdigest()[:16]}.git"
    if not (git_dir / "HEAD").exists():
        git_dir.parent.mkdir(parents=True, exist_ok=True)
        _git(["init", "--quiet", "--bare", str(git_dir)])
    want = ref.commit if ref.ref_name is None else f"+{ref.ref_name}:refs/pairbench/fetched"
    proc = _git(["fetch", "--quiet", "--depth", "1", "--no-tags", url, want], git_dir=str(git_dir), check=False)
    if proc.returncode != 0:
        raise GitSourceError("git", f"fetching {ref.ref!r} ({ref.commit[:12]}) from {url} failed: "
                             f"{proc.stderr.decode().strip()}")
    commit, tag_object = ref.commit, ref.tag_object
    if ref.ref_name is not None:  # the ref as fetched (it may have moved since ls-remote)
        commit = _git(["rev-parse", "refs/pairbench/fetched^{commit}"], git_dir=str(git_dir)).stdout.decode().strip()
        obj = _git(["rev-parse", "refs/pairbench/fetched"], git_dir=str(git_dir)).stdout.decode().strip()
        tag_object = obj if obj != commit else None
    tree = _git(["rev-parse", f"{commit}^{{tree}}"], git_dir=str(git_dir), check=False)
    if tree.returncode != 0:
        raise GitSourceError("ref", f"{ref.ref!r}: commit {commit} is not in what {url} sent")
    return GitRef(repo=url, ref=ref.ref, ref_name=ref.ref_name, commit=commit, tree=tree.stdout.decode().strip(),
                  tag_object=tag_object, git_dir=str(git_dir))


def _archive_stem(commit: str, paths: tuple[str, ...]) -> str:
    """The export cache's name of *commit*'s archive: the sha, and for a part of the tree a digest of
    which part (``<sha>-<8 hex>``)."""
    if not paths:
        return commit
    return f"{commit}-{hashlib.sha256(chr(0).join(paths).encode()).hexdigest()[:8]}"


_STEM_RE = re.compile(r"^[0-9a-f]{40}(-[0-9a-f]{8})?$")


def _cached_meta(cache_dir: Path | None, commit: str, paths: tuple[str, ...] = ()) -> dict | None:
    """The export cache's record of *commit* (``{"commit", "tree", "paths", "files"}``) when its
    archive (of *paths*, or the whole tree) is there."""
    if cache_dir is None:
        return None
    store = Path(cache_dir) / EXPORTS
    stem = _archive_stem(commit, paths)
    tar_path, meta_path = store / f"{stem}.tar", store / f"{stem}.json"
    if not (tar_path.is_file() and meta_path.is_file()):
        return None
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    ok = meta.get("commit") == commit and _SHA_RE.match(str(meta.get("tree", ""))) and \
        tuple(meta.get("paths") or ()) == tuple(paths)
    return meta if ok else None


def _cached_tree(cache_dir: Path, commit: str) -> str | None:
    """The tree of *commit* as any of its cached archives records it (None: none is cached)."""
    for meta_path in sorted((Path(cache_dir) / EXPORTS).glob(f"{commit}*.json")):
        meta = _cached_meta(cache_dir, commit, tuple(_read_json(meta_path).get("paths") or ()))
        if meta is not None:
            return meta["tree"]
    return None


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _unpack(tar_source, dest: Path) -> int:
    """Unpack a tar (a path or an open file) into *dest*; the number of regular files written."""
    dest.mkdir(parents=True, exist_ok=True)
    kwargs = {"name": str(tar_source)} if isinstance(tar_source, (str, Path)) else {"fileobj": tar_source}
    with tarfile.open(mode="r:", **kwargs) as tar:
        members = tar.getmembers()
        # 'data' filter: refuse absolute paths, '..', links out of dest and special files.
        tar.extractall(dest, members=members, filter="data")
    return sum(1 for m in members if m.isfile())


def _archive(ref: GitRef, fh, paths: tuple[str, ...] = ()) -> None:
    for path in paths:  # a part of the tree that the commit lacks is named, not an empty export
        proc = _git(["cat-file", "-e", f"{ref.commit}:{path}"], git_dir=ref.git_dir, check=False)
        if proc.returncode != 0:
            raise GitSourceError("ref", f"{ref.ref!r} ({ref.commit[:12]}) of {ref.repo} has no {path}/")
    proc = _git(["archive", "--format=tar", ref.commit, *(["--", *paths] if paths else [])], git_dir=ref.git_dir,
                stdout=fh, check=False)
    if proc.returncode != 0:
        raise GitSourceError(f"git archive of {ref.ref!r} ({ref.commit[:12]}) in {ref.repo} failed: "
                             f"{proc.stderr.decode().strip()}")


def export_ref(ref: GitRef, dest: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
               paths: tuple[str, ...] = ()) -> int:
    """Write the tree of *ref*'s commit (or only *paths* of it, e.g. ``("engine",)``) into *dest*
    (created; must not exist or be empty); the number of files written.

    With a *cache_dir*, the commit's ``git archive`` is kept as ``<cache_dir>/exports/<commit>.tar``
    (written atomically, with a ``.json`` naming its tree) and unpacked from there the next time any
    arm or run exports that commit; the :data:`KEEP_EXPORTS` most recently used are kept."""
    dest = Path(dest)
    paths = tuple(paths)
    if dest.exists() and any(dest.iterdir()):
        raise GitSourceError(f"export destination {dest} is not empty")
    if cache_dir is None:
        with tempfile.TemporaryFile() as fh:
            _archive(ref, fh, paths)
            fh.seek(0)
            return _unpack(fh, dest)
    store = Path(cache_dir) / EXPORTS
    stem = _archive_stem(ref.commit, paths)
    tar_path = store / f"{stem}.tar"
    if _cached_meta(cache_dir, ref.commit, paths) is not None:
        os.utime(tar_path)  # most recently used
        return _unpack(tar_path, dest)
    if ref.git_dir is None:  # a URL's commit cached in another part only: fetch it after all
        ref = _fetch(ref, Path(cache_dir))
    store.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=store, prefix=f".{ref.commit[:12]}-", suffix=".tar")
    try:
        with os.fdopen(fd, "wb") as fh:
            _archive(ref, fh, paths)
        files = _unpack(Path(tmp), dest)
        os.replace(tmp, tar_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    meta = json.dumps({"commit": ref.commit, "tree": ref.tree, "paths": list(paths), "files": files}, sort_keys=True)
    fd, tmp_meta = tempfile.mkstemp(dir=store, prefix=f".{ref.commit[:12]}-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        fh.write(meta)
    os.replace(tmp_meta, store / f"{stem}.json")
    _prune(store)
    return files


def _prune(store: Path, keep: int = KEEP_EXPORTS) -> None:
    archives = sorted((p for p in store.glob("*.tar") if _STEM_RE.match(p.stem)), key=lambda p: p.stat().st_mtime,
                      reverse=True)
    for old in archives[keep:]:
        if _STEM_RE.match(old.stem):
            old.unlink(missing_ok=True)
            old.with_suffix(".json").unlink(missing_ok=True)


def check_clean(ref: GitRef, limit: int = 5) -> None:
    """Refuse a ref of a local work tree that has uncommitted changes to tracked files when the ref
    names the commit checked out there (``HEAD``, its branch or its sha): the export is the commit,
    so those changes would silently not be measured. :class:`GitSourceError` names the repository,
    the ref and the first files. A URL, a bare repository or another commit is not checked."""
    if is_url(ref.repo):
        return
    path = Path(ref.repo).expanduser()
    bare = _git(["rev-parse", "--is-bare-repository"], cwd=str(path), check=False)
    if bare.returncode != 0 or bare.stdout.decode().strip() == "true":
        return
    head = _git(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], cwd=str(path), check=False)
    if head.returncode != 0 or head.stdout.decode().strip() != ref.commit:
        return
    status = _git(["status", "--porcelain", "--untracked-files=no", "--ignore-submodules=all"], cwd=str(path),
                  check=False)
    changed = [line[3:] for line in status.stdout.decode().splitlines() if line.strip()]
    if status.returncode != 0 or not changed:
        return
    shown = ", ".join(changed[:limit]) + (f" and {len(changed) - limit} more" if len(changed) > limit else "")
    raise GitSourceError(
        "git", f"the work tree of {ref.repo} has uncommitted changes to {len(changed)} tracked file(s) "
        f"({shown}), and ref {ref.ref!r} names its checked-out commit {ref.commit[:12]}: the export is the "
        "commit, so those changes would not be measured. Commit or stash them, or name another ref")


def describe_ref(source: dict) -> str:
    """``git <repo> @ <ref or tag>``, for a plan in words."""
    return f"git {source['git']} @ {source.get('ref') or source.get('tag')}"
