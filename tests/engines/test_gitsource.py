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


# --- refs: a branch, a tag or a sha, resolved to a commit; exports cached by that sha ----------------

from pairbench.arms import gitsource  # noqa: E402
from pairbench.arms.gitsource import check_clean, export_ref, resolve_ref  # noqa: E402
from pairbench.arms.source import same_commit_arms  # noqa: E402


@pytest.fixture
def branched(tmp_path: Path) -> Path:
    """main with two commits, a branch 'feature' one commit ahead of it, and a clean checkout of main."""
    repo = tmp_path / "branched"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("one\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "one")
    (repo / "a.txt").write_text("two\n")
    git(repo, "commit", "-q", "-am", "two")
    git(repo, "checkout", "-q", "-b", "feature")
    (repo / "a.txt").write_text("feature\n")
    git(repo, "commit", "-q", "-am", "feature")
    git(repo, "checkout", "-q", "main")
    return repo


def test_a_branch_a_sha_and_an_expression_resolve_to_their_commits(branched):
    main = resolve_ref(str(branched), "main")
    assert main.commit == git(branched, "rev-parse", "main") and main.ref_name == "refs/heads/main"
    assert main.tree == git(branched, "rev-parse", "main^{tree}") and main.tag is None
    feature = resolve_ref(str(branched), "feature")
    assert feature.commit == git(branched, "rev-parse", "feature") != main.commit
    sha = resolve_ref(str(branched), main.commit)
    assert sha.commit == main.commit and sha.ref_name is None
    assert resolve_ref(str(branched), "main~1").commit == git(branched, "rev-parse", "main~1")
    assert resolve_ref(str(branched), "HEAD").commit == main.commit
    assert main.record() == {"ref": "main", "ref_name": "refs/heads/main", "commit": main.commit, "tree": main.tree,
                             "tag": None, "tag_object": None}


def test_an_unknown_ref_or_repository_is_named(branched, tmp_path):
    with pytest.raises(GitSourceError, match=r"source.ref: 'nope' does not resolve to a commit in .*branched; "
                                             r"branches and tags here include: .*feature"):
        resolve_ref(str(branched), "nope")
    with pytest.raises(GitSourceError, match="is neither an existing path nor a URL"):
        resolve_ref(str(tmp_path / "nowhere"), "main")
    (tmp_path / "plain").mkdir()
    with pytest.raises(GitSourceError, match="is not a git repository"):
        resolve_ref(str(tmp_path / "plain"), "main")
    for bad in ("", "-x", "a b"):
        with pytest.raises(GitSourceError, match="source.ref"):
            resolve_ref(str(branched), bad)


def test_export_at_a_branch_is_its_commit_and_is_cached_by_sha(branched, tmp_path):
    cache = tmp_path / "cache"
    ref = resolve_ref(str(branched), "feature")
    assert export_ref(ref, tmp_path / "out1", cache_dir=cache) == 1
    assert (tmp_path / "out1" / "a.txt").read_text() == "feature\n"
    tar = cache / gitsource.EXPORTS / f"{ref.commit}.tar"
    assert tar.is_file() and (cache / gitsource.EXPORTS / f"{ref.commit}.json").is_file()
    # the second export of that sha is unpacked from the cache: a repository that cannot archive it
    # any more (its objects gone) does not matter
    gone = gitsource.GitRef(**{**ref.__dict__, "git_dir": None})
    assert export_ref(gone, tmp_path / "out2", cache_dir=cache) == 1
    assert (tmp_path / "out2" / "a.txt").read_text() == "feature\n"
    # a moved branch names another commit, exported afresh
    git(branched, "checkout", "-q", "feature")
    (branched / "a.txt").write_text("feature two\n")
    git(branched, "commit", "-q", "-am", "feature two")
    moved = resolve_ref(str(branched), "feature")
    assert moved.commit != ref.commit
    export_ref(moved, tmp_path / "out3", cache_dir=cache)
    assert (tmp_path / "out3" / "a.txt").read_text() == "feature two\n"
    assert sorted(p.stem for p in (cache / gitsource.EXPORTS).glob("*.tar")) == sorted([ref.commit, moved.commit])


def test_a_part_of_the_tree_is_exported_and_cached_apart(tmp_path):
    repo = tmp_path / "parts"
    (repo / "engine").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "engine" / "x.py").write_text("x = 1\n")
    (repo / "README.md").write_text("docs\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "one")
    cache = tmp_path / "cache"
    ref = resolve_ref(str(repo), "main")
    assert export_ref(ref, tmp_path / "part", cache_dir=cache, paths=("engine",)) == 1
    assert sorted(p.name for p in (tmp_path / "part").iterdir()) == ["engine"]
    assert export_ref(ref, tmp_path / "whole", cache_dir=cache) == 2
    assert len(list((cache / gitsource.EXPORTS).glob(f"{ref.commit}*.tar"))) == 2
    with pytest.raises(GitSourceError, match=r"'main' \([0-9a-f]{12}\) of .*parts has no kernels/"):
        export_ref(ref, tmp_path / "none", cache_dir=cache, paths=("kernels",))


def test_the_export_cache_keeps_the_most_recently_used(branched, tmp_path):
    cache = tmp_path / "cache"
    refs = [resolve_ref(str(branched), r) for r in ("main~1", "main", "feature")]
    for i, ref in enumerate(refs):
        export_ref(ref, tmp_path / f"out{i}", cache_dir=cache)
    gitsource._prune(cache / gitsource.EXPORTS, keep=2)
    assert sorted(p.stem for p in (cache / gitsource.EXPORTS).glob("*.tar")) == sorted(r.commit for r in refs[1:])


def test_a_url_branch_is_resolved_remotely_and_not_fetched_again_once_cached(branched, tmp_path):
    url = f"file://{branched}"
    cache = tmp_path / "cache"
    ref = resolve_ref(url, "feature", cache_dir=cache)
    assert ref.commit == git(branched, "rev-parse", "feature") and ref.ref_name == "refs/heads/feature"
    export_ref(ref, tmp_path / "out", cache_dir=cache)
    assert (tmp_path / "out" / "a.txt").read_text() == "feature\n"
    again = resolve_ref(url, "feature", cache_dir=cache)
    assert again.commit == ref.commit and again.git_dir is None  # the export cache has it: nothing fetched
    by_sha = resolve_ref(url, git(branched, "rev-parse", "main"), cache_dir=cache)
    assert by_sha.tree == git(branched, "rev-parse", "main^{tree}")
    with pytest.raises(GitSourceError, match=r"'nope' does not exist in file://"):
        resolve_ref(url, "nope", cache_dir=cache)
    with pytest.raises(GitSourceError, match="cannot read"):
        resolve_ref(f"file://{tmp_path / 'nowhere'}", "main", cache_dir=cache)


def test_a_url_tag_records_its_tag_object(upstream, tmp_path):
    ref = resolve_ref(f"file://{upstream}", "v1", cache_dir=tmp_path / "cache")
    assert ref.tag == "v1" and ref.ref_name == "refs/tags/v1"
    assert ref.commit == git(upstream, "rev-parse", "v1^{commit}")
    assert ref.tag_object == git(upstream, "rev-parse", "v1") != ref.commit


def test_a_ref_naming_a_dirty_checkout_is_refused(branched):
    check_clean(resolve_ref(str(branched), "HEAD"))  # clean: fine
    (branched / "a.txt").write_text("uncommitted\n")
    (branched / "new.txt").write_text("untracked files do not count\n")
    for ref in ("HEAD", "main"):
        with pytest.raises(GitSourceError, match=r"uncommitted changes to 1 tracked file\(s\) \(a.txt\), and ref "
                                                 rf"'{ref}' names its checked-out commit"):
            check_clean(resolve_ref(str(branched), ref))
    check_clean(resolve_ref(str(branched), "feature"))  # another commit: the work tree is not what it exports


def test_two_refs_of_one_commit_are_an_a_a(branched):
    arms = {"base": {"source": {"git": ".", "ref": "main"}, "patches": []},
            "head": {"source": {"git": ".", "ref": "HEAD"}, "patches": []}}
    sha = git(branched, "rev-parse", "main")
    [(arm, problem)] = same_commit_arms(arms, {"base": sha, "head": sha})
    assert arm == "head" and problem.startswith(f"arms base and head resolve 'main' and 'HEAD' to the same commit "
                                                f"{sha[:12]}") and "an A/A run" in problem
    arms["head"]["patches"] = ["x.patch"]  # the same commit with a patch on top is a comparison
    assert same_commit_arms(arms, {"base": sha, "head": sha}) == []
