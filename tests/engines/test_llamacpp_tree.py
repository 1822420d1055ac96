"""The llama.cpp repository made from a llama-cpp-python sdist (pairbench.arms.llamacpp_tree).

The sdist here is a small tarball with the real sdist's shape (``<top>/vendor/llama.cpp/...``, the
submodule's ``.git`` gitlink file, ``.git/modules/vendor/llama.cpp/HEAD``); nothing is downloaded.
"""

import io
import subprocess
import tarfile

import pytest

from pairbench.arms import llamacpp_tree as lt
from pairbench.arms.gitsource import export_tag

UPSTREAM = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


def _add(tar, name, data: bytes, mode=0o644, mtime=1667997441):
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, mtime
    tar.addfile(info, io.BytesIO(data))


def fake_sdist(cache, version):
    path = cache / "sdist" / f"llama_cpp_python-{version}.tar.gz"
    path.parent.mkdir(parents=True)
    top = f"llama_cpp_python-{version}"
    with tarfile.open(path, "w:gz") as tar:
        _add(tar, f"{top}/PKG-INFO", b"Name: llama_cpp_python\n")
        _add(tar, f"{top}/.git/modules/vendor/llama.cpp/HEAD", UPSTREAM.encode() + b"\n")
        _add(tar, f"{top}/vendor/llama.cpp/.git", b"gitdir: ../../.git/modules/vendor/llama.cpp\n")
        _add(tar, f"{top}/vendor/llama.cpp/.gitignore", b"build/\n*.o\n")
        _add(tar, f"{top}/vendor/llama.cpp/CMakeLists.txt", b"project(llama)\n")
        _add(tar, f"{top}/vendor/llama.cpp/ggml/src/x.o", b"shipped although .gitignore names it\n")
        _add(tar, f"{top}/vendor/llama.cpp/scripts/run.sh", b"#!/bin/sh\n", mode=0o755)
        _add(tar, f"{top}/llama_cpp/__init__.py", b"")
    return path


def test_makes_a_tagged_repository_once_that_exports_like_a_clone(tmp_path):
    fake_sdist(tmp_path, "9.9.9")
    info = lt.ensure_tree("9.9.9", tmp_path)
    assert info["made"] is True and info["tag"] == "llama-cpp-python-9.9.9-vendor"
    assert info["upstream_commit"] == UPSTREAM and info["sdist"] == "llama_cpp_python-9.9.9.tar.gz"
    assert info["sdist_sha256"] == lt._sha256(tmp_path / "sdist" / "llama_cpp_python-9.9.9.tar.gz")
    again = lt.ensure_tree("9.9.9", tmp_path)
    assert again == {**info, "made": False}

    out = tmp_path / "export"
    exp = export_tag(info["repo"], info["tag"], out)
    assert exp.commit == info["commit"] and exp.files == 4
    # the gitlink file is left out; a file the tree's own .gitignore names is kept; modes survive
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        ".gitignore", "CMakeLists.txt", "ggml/src/x.o", "scripts/run.sh"]
    assert (out / "scripts" / "run.sh").stat().st_mode & 0o111


def test_the_same_sdist_gives_the_same_commit_anywhere(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    fake_sdist(a, "9.9.9")
    fake_sdist(b, "9.9.9")
    assert lt.ensure_tree("9.9.9", a)["commit"] == lt.ensure_tree("9.9.9", b)["commit"]


def test_a_second_version_is_a_second_tag_in_the_same_repository(tmp_path):
    fake_sdist(tmp_path, "9.9.8")
    (tmp_path / "sdist").rename(tmp_path / "sdist-old")
    fake_sdist(tmp_path, "9.9.9")
    (tmp_path / "sdist-old" / "llama_cpp_python-9.9.8.tar.gz").rename(tmp_path / "sdist" / "llama_cpp_python-9.9.8.tar.gz")
    one, two = lt.ensure_tree("9.9.8", tmp_path), lt.ensure_tree("9.9.9", tmp_path)
    assert one["repo"] == two["repo"]
    tags = subprocess.run(["git", "--git-dir", one["repo"], "tag"], capture_output=True, text=True).stdout.split()
    assert tags == ["llama-cpp-python-9.9.8-vendor", "llama-cpp-python-9.9.9-vendor"]


def test_a_pinned_version_whose_sdist_hash_differs_is_refused(tmp_path, monkeypatch):
    fake_sdist(tmp_path, "9.9.9")
    monkeypatch.setitem(lt.SDIST_SHA256, "9.9.9", "0" * 64)
    with pytest.raises(lt.TreeError, match="is not the pinned 0000"):
        lt.ensure_tree("9.9.9", tmp_path)
    assert not (tmp_path / "llama.cpp" / "refs" / "tags" / "llama-cpp-python-9.9.9-vendor").exists()


def test_an_sdist_without_the_vendored_tree_is_refused(tmp_path):
    path = tmp_path / "sdist" / "llama_cpp_python-9.9.9.tar.gz"
    path.parent.mkdir(parents=True)
    with tarfile.open(path, "w:gz") as tar:
        _add(tar, "llama_cpp_python-9.9.9/PKG-INFO", b"")
    with pytest.raises(lt.TreeError, match="no vendor/llama.cpp/CMakeLists.txt"):
        lt.ensure_tree("9.9.9", tmp_path)
