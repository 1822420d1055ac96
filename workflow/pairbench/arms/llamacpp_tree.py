"""A llama.cpp git repository with a tag, made offline from the llama-cpp-python source distribution.

pairbench's external arms take ``source: {git: <repo>, tag: <tag>}``. A user with a clone of
ggml-org/llama.cpp points at it; a machine that reaches only PyPI cannot clone GitHub. The
llama-cpp-python sdist on PyPI, however, carries the complete llama.cpp tree in
``vendor/llama.cpp`` (CMake files, ``ggml``, ``tools/server``, ``tools/llama-bench``). This module
turns that tree into a local, bare git repository with one root commit per sdist version and a tag
named after its origin (``llama-cpp-python-<version>-vendor``), so arms use the ordinary git source
path exactly as with a real clone.

Steps (made once, in the user's cache; a second call only re-reads the tag):
1. ``pip download --no-deps --no-binary :all: llama-cpp-python==<version>`` into
   ``<cache>/sdist/``; its sha256 is checked against the pin below (a known version) and recorded;
2. the members under ``vendor/llama.cpp/`` are unpacked with tarfile's ``data`` filter, except the
   submodule's ``.git`` gitlink file (it points into the sdist's own ``.git/modules``);
3. they are committed with plumbing (a private index, ``write-tree``, ``commit-tree``) under a fixed
   identity and the sdist's own timestamp, so the same sdist always gives the same commit hash;
4. an annotated tag records the sdist's name, sha256 and the upstream llama.cpp commit that the sdist
   says it vendored (``.git/modules/vendor/llama.cpp/HEAD``; its objects are not in the sdist).

The repository lives in the user's cache (:func:`pairbench.core.cache.user_cache`), by default
``~/.cache/pairbench/llama.cpp``; a lock file serialises concurrent callers. Command line:
``python -m pairbench llama-tree [--version 0.3.36]`` prints the repository, tag and commit as JSON.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from contextlib import contextmanager
from pathlib import Path

from pairbench.core.cache import user_cache

DEFAULT_VERSION = "0.3.36"
# sha256 of the sdist as PyPI's simple index lists it (https://pypi.org/simple/llama-cpp-python/);
# pip verifies it (--require-hashes) and so do we. A version not listed is accepted and its sha256
# recorded, not checked.
SDIST_SHA256 = {
    "0.3.36": "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
}
IDENTITY = {"GIT_AUTHOR_NAME": "pairbench", "GIT_AUTHOR_EMAIL": "pairbench@invalid",
            "GIT_COMMITTER_NAME": "pairbench", "GIT_COMMITTER_EMAIL": "pairbench@invalid"}


class TreeError(Exception):
    """The tree cannot be made: download failed, hash mismatch, sdist without vendor/llama.cpp."""


def tag_name(version: str) -> str:
    return f"llama-cpp-python-{version}-vendor"


def _git(repo: Path, *args: str, env: dict | None = None, input: bytes | None = None) -> str:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    full.update(env or {})
    proc = subprocess.run(["git", "--git-dir", str(repo), *args], env=full, input=input,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        raise TreeError(f"git {' '.join(args[:2])} in {repo} failed: {proc.stderr.decode().strip()}")
    return proc.stdout.decode().strip()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def download_sdist(version: str, dest_dir: Path) -> Path:
    """The sdist in *dest_dir*, downloaded with pip if absent. Its hash is checked by pip when pinned."""
    name = f"llama_cpp_python-{version}.tar.gz"
    path = dest_dir / name
    if path.is_file():
        return path
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest_dir, prefix=".download-") as tmp:
        req = Path(tmp) / "requirements.txt"
        pin = SDIST_SHA256.get(version)
        req.write_text(f"llama-cpp-python=={version}" + (f" --hash=sha256:{pin}" if pin else "") + "\n")
        argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                "-d", tmp, "-r", str(req)] + (["--require-hashes"] if pin else [])
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        got = Path(tmp) / name
        if proc.returncode != 0 or not got.is_file():
            raise TreeError(f"pip download of llama-cpp-python=={version} failed:\n{proc.stdout.strip()}")
        os.replace(got, path)
    return path


def _vendor_members(tar: tarfile.TarFile, top: str) -> list[tarfile.TarInfo]:
    prefix = f"{top}/vendor/llama.cpp/"
    out = []
    for m in tar.getmembers():
        if not m.name.startswith(prefix) or m.name == prefix.rstrip("/"):
            continue
        rel = m.name[len(prefix):]
        if rel == ".git":  # the submodule's gitlink file, pointing into the sdist's .git/modules
            continue
        m = m.replace(name=rel, deep=False)
        out.append(m)
    return out


def _upstream_commit(tar: tarfile.TarFile, top: str) -> str | None:
    try:
        fh = tar.extractfile(f"{top}/.git/modules/vendor/llama.cpp/HEAD")
    except KeyError:
        return None
    text = fh.read().decode().strip() if fh else ""
    return text if len(text) == 40 and all(c in "0123456789abcdef" for c in text) else None


def ensure_tree(version: str = DEFAULT_VERSION, cache: str | os.PathLike | None = None) -> dict:
    """Make (once) and return ``{repo, tag, commit, tree, sdist, sdist_sha256, upstream_commit, files, made}``."""
    root = Path(cache).expanduser() if cache else user_cache()
    repo = root / "llama.cpp"
    tag = tag_name(version)
    with _locked(root / "llama.cpp.lock"):
        if (repo / "HEAD").is_file():
            try:
                commit = _git(repo, "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}")
            except TreeError:
                commit = None
            if commit:
                return _describe(repo, tag, made=False)
        sdist = download_sdist(version, root / "sdist")
        sdist_sha = _sha256(sdist)
        pin = SDIST_SHA256.get(version)
        if pin and sdist_sha != pin:
            raise TreeError(f"{sdist}: sha256 {sdist_sha} is not the pinned {pin}; delete it and rerun")
        if not (repo / "HEAD").is_file():
            tmp_repo = Path(tempfile.mkdtemp(dir=root, prefix=".llama.cpp-"))
            _git(tmp_repo, "init", "--quiet", "--bare")
            _git(tmp_repo, "config", "core.autocrlf", "false")
            if repo.exists():  # a leftover that is not a repository: never overwrite it
                shutil.rmtree(tmp_repo)
                raise TreeError(f"{repo} exists but is not a git repository; move it away and rerun")
            os.replace(tmp_repo, repo)
        with tempfile.TemporaryDirectory(dir=root, prefix=".unpack-") as work:
            with tarfile.open(sdist, "r:gz") as tar:
                top = tar.getmembers()[0].name.split("/")[0]
                members = _vendor_members(tar, top)
                if not any(m.name == "CMakeLists.txt" for m in members):
                    raise TreeError(f"{sdist} has no vendor/llama.cpp/CMakeLists.txt")
                upstream = _upstream_commit(tar, top)
                mtime = max(m.mtime for m in members)
                tar.extractall(work, members=members, filter="data")
            files = sum(1 for m in members if m.isfile())
            index = Path(work).parent / f".index-{os.getpid()}"
            env = {"GIT_INDEX_FILE": str(index), "GIT_WORK_TREE": work, **IDENTITY,
                   "GIT_AUTHOR_DATE": f"{mtime} +0000", "GIT_COMMITTER_DATE": f"{mtime} +0000"}
            try:
                # -f: commit every file the sdist ships, even one its own .gitignore would skip
                _git(repo, "add", "-A", "-f", ".", env=env)
                tree = _git(repo, "write-tree", env=env)
            finally:
                index.unlink(missing_ok=True)
            msg = (f"llama.cpp as vendored by llama-cpp-python {version}\n\n"
                   f"sdist: {sdist.name}\nsdist-sha256: {sdist_sha}\n"
                   f"upstream-commit: {upstream or 'unknown'}\n")
            commit = _git(repo, "commit-tree", tree, "-m", msg, env=env)
            n = _git(repo, "ls-tree", "-r", "--name-only", "-z", commit).count("\0")
            if n != files:
                raise TreeError(f"committed {n} files but the sdist has {files} under vendor/llama.cpp")
            _git(repo, "tag", "-a", tag, "-m", msg, commit, env={**env, "GIT_COMMITTER_DATE": f"{mtime} +0000"})
        return _describe(repo, tag, made=True)


def _describe(repo: Path, tag: str, made: bool) -> dict:
    commit = _git(repo, "rev-parse", f"refs/tags/{tag}^{{commit}}")
    fields = {}
    for line in _git(repo, "cat-file", "tag", f"refs/tags/{tag}").splitlines():
        key, sep, value = line.partition(": ")
        if sep and key in ("sdist", "sdist-sha256", "upstream-commit"):
            fields[key] = value
    return {"repo": str(repo), "tag": tag, "commit": commit,
            "tree": _git(repo, "rev-parse", f"{commit}^{{tree}}"),
            "sdist": fields.get("sdist"), "sdist_sha256": fields.get("sdist-sha256"),
            "upstream_commit": fields.get("upstream-commit"), "made": made}
