"""Tests for pairbench.arms.gitsource: exporting a pristine tree at a tag from a throwaway git repo."""

import hashlib
import subprocess
from pathlib import Path

import pytest

from pairbench.arms.gitsource import GitSourceError, export_tag, is_url, resolve_tag


def git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
           "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo.parent), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def upstream(tmp_path: Path) -> Path:
    """A repo with an annotated tag v1, a lightweight tag v2, then uncommitted local edits."""
    repo = tmp_path / "upstream"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "server.c").write_text("int version = 1;\n")
    (repo / "sub").mkdir()
    (repo / "sub" / "util.h").write_text("#define X 1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "one")
    git(repo, "tag", "-a", "v1", "-m", "release one")
    (repo / "server.c").write_text("int version = 2;\n")
    git(repo, "commit", "-q", "-am", "two")
    git(repo, "tag", "v2")
    # The user's checkout is dirty: a staged change and an untracked file.
    (repo / "server.c").write_text("int version = 3; /* wip */\n")
    git(repo, "add", "server.c")
    (repo / "notes.txt").write_text("untracked\n")
    return repo


def snapshot(repo: Path) -> dict:
    """Everything the export must not change: index bytes, HEAD, refs, status, the working tree."""
    return {
        "index": hashlib.sha256((repo / ".git" / "index").read_bytes()).hexdigest(),
        "head": git(repo, "rev-parse", "HEAD"),
        "refs": git(repo, "show-ref"),
        "status": git(repo, "status", "--porcelain"),
        "server": (repo / "server.c").read_text(),
    }


def test_export_annotated_tag_is_pristine_and_leaves_checkout_alone(upstream, tmp_path):
    before = snapshot(upstream)
    out = export_tag(str(upstream), "v1", tmp_path / "out")
    assert (tmp_path / "out" / "server.c").read_text() == "int version = 1;\n"
    assert (tmp_path / "out" / "sub" / "util.h").read_text() == "#define X 1\n"
    assert not (tmp_path / "out" / "notes.txt").exists()
    assert not (tmp_path / "out" / ".git").exists()
    assert out.commit == git(upstream, "rev-parse", "v1^{commit}")
    assert out.tree == git(upstream, "rev-parse", "v1^{tree}")
    assert out.tag_object == git(upstream, "rev-parse", "v1") != out.commit
    assert out.files == 2
    assert snapshot(upstream) == before


def test_export_lightweight_tag_records_commit(upstream, tmp_path):
    out = export_tag(str(upstream), "v2", tmp_path / "out")
    assert (tmp_path / "out" / "server.c").read_text() == "int version = 2;\n"
    assert out.commit == git(upstream, "rev-parse", "v2")
    assert out.tag_object is None


def test_unknown_tag_fails_naming_tag_and_listing_known(upstream, tmp_path):
    with pytest.raises(GitSourceError, match=r"tag 'v9' does not resolve.*v2.*v1|tag 'v9' does not resolve.*v1"):
        export_tag(str(upstream), "v9", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_branch_name_is_not_a_tag(upstream):
    with pytest.raises(GitSourceError, match="'main' does not resolve"):
        resolve_tag(str(upstream), "main")


def test_not_a_repository_and_missing_path(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(GitSourceError, match="not a git repository"):
        resolve_tag(str(tmp_path / "plain"), "v1")
    with pytest.raises(GitSourceError, match="neither an existing path nor a URL"):
        resolve_tag(str(tmp_path / "nowhere"), "v1")


def test_url_source_is_fetched_into_cache(upstream, tmp_path):
    url = f"file://{upstream}"
    before = snapshot(upstream)
    out = export_tag(url, "v1", tmp_path / "out", cache_dir=tmp_path / "cache")
    assert (tmp_path / "out" / "server.c").read_text() == "int version = 1;\n"
    assert out.commit == git(upstream, "rev-parse", "v1^{commit}")
    assert len(list((tmp_path / "cache").glob("*.git"))) == 1
    # A second export reuses the cache; an unknown tag is named.
    export_tag(url, "v2", tmp_path / "out2", cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("*.git"))) == 1
    with pytest.raises(GitSourceError, match="tag 'nope' does not exist in file://"):
        export_tag(url, "nope", tmp_path / "out3", cache_dir=tmp_path / "cache")
    assert snapshot(upstream) == before


def test_non_empty_destination_is_refused(upstream, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "stale").write_text("x")
    with pytest.raises(GitSourceError, match="not empty"):
        export_tag(str(upstream), "v1", tmp_path / "out")


@pytest.mark.parametrize("repo,url", [
    ("https://github.com/ggml-org/llama.cpp", True),
    ("git@github.com:ggml-org/llama.cpp.git", True),
    ("file:///srv/llama.cpp", True),
    ("/home/me/llama.cpp", False),
    ("../llama.cpp", False),
])
def test_is_url(repo, url):
    assert is_url(repo) is url
