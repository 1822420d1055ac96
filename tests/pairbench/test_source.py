"""Source export and patching: pristine copy, sha256 manifest, git apply --check, clear failures."""

import subprocess

import pytest

from pairbench.arms import source as pb_source

GOOD = """--- a/engine/core.py
+++ b/engine/core.py
@@ -1,3 +1,3 @@
 def answer():
-    return 41
+    return 42
 # end
"""
BAD = """--- a/engine/core.py
+++ b/engine/core.py
@@ -1,3 +1,3 @@
 def answer():
-    return 7
+    return 8
 # end
"""


@pytest.fixture
def repo(tmp_path):
    """A git repository (like pairbench's own) holding a tiny engine source and two patches."""
    root = tmp_path / "repo"
    (root / "engine").mkdir(parents=True)
    (root / "engine" / "VERSION").write_text("1.2.3\n")
    (root / "engine" / "core.py").write_text("def answer():\n    return 41\n# end\n")
    (root / "engine" / "__pycache__").mkdir()
    (root / "engine" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"junk")
    (root / "good.patch").write_text(GOOD)
    (root / "bad.patch").write_text(BAD)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def test_export_is_pristine_and_patched(repo):
    arm_dir = repo / "results" / "x" / "src" / "cand"  # inside the enclosing git repo, as in a real run
    body = pb_source.export_source("cand", "engine", ["good.patch"], arm_dir, repo, plan_sha256="0" * 64)
    assert (arm_dir / "engine" / "core.py").read_text() == "def answer():\n    return 42\n# end\n"
    assert (repo / "engine" / "core.py").read_text().endswith("return 41\n# end\n"), "the source must never change"
    assert not (arm_dir / "engine" / "__pycache__").exists()
    assert body["version"] == "1.2.3"
    assert set(body["pristine"]["manifest"]) == {"VERSION", "core.py"}
    assert body["patched"]["changed"] == ["core.py"]
    assert body["patched"]["tree_sha256"] != body["pristine"]["tree_sha256"]
    assert body["patches"][0]["files"] == ["engine/core.py"]


def test_export_without_patches_has_equal_trees(repo):
    body = pb_source.export_source("base", "engine", [], repo / "out" / "base", repo, plan_sha256="0" * 64)
    assert body["patched"]["tree_sha256"] == body["pristine"]["tree_sha256"]
    assert body["patched"]["changed"] == []


def test_non_applying_patch_names_patch_and_hunk(repo):
    with pytest.raises(pb_source.PatchError) as err:
        pb_source.export_source("cand", "engine", ["good.patch", "bad.patch"], repo / "out" / "cand", repo,
                                plan_sha256="0" * 64)
    msg = str(err.value)
    assert msg.startswith("arms.cand.patches[1]: patch bad.patch does not apply")
    assert "engine/core.py (hunk at line 1)" in msg


def test_patch_for_a_missing_file(repo):
    (repo / "ghost.patch").write_text(GOOD.replace("core.py", "ghost.py"))
    with pytest.raises(pb_source.PatchError, match=r"ghost\.patch does not apply: first failure at engine/ghost\.py"):
        pb_source.export_source("cand", "engine", ["ghost.patch"], repo / "out" / "cand", repo, plan_sha256="0" * 64)


def test_tree_sha256_depends_on_content_and_path():
    a = pb_source.tree_sha256({"a.py": "1" * 64})
    assert a != pb_source.tree_sha256({"b.py": "1" * 64})
    assert a != pb_source.tree_sha256({"a.py": "2" * 64})


def _git(repo, *args):
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo.parent),
           "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def committed(repo):
    """*repo* with its engine committed on main, and a branch 'slow' that changes engine/core.py."""
    (repo / ".gitignore").write_text("results/\nout/\nresources/\n__pycache__/\n")
    _git(repo, "add", ".gitignore", "engine", "good.patch", "bad.patch")
    _git(repo, "commit", "-q", "-m", "engine")
    _git(repo, "branch", "-M", "main")
    _git(repo, "checkout", "-q", "-b", "slow")
    (repo / "engine" / "core.py").write_text("def answer():\n    return 41  # slow\n# end\n")
    _git(repo, "commit", "-q", "-am", "slow")
    _git(repo, "checkout", "-q", "main")
    return repo


def test_an_embedded_engine_at_a_ref_of_this_repository(committed):
    """{git: ., ref: <ref>}: the repository's engine/ at that commit (only it), patches on top."""
    arm_dir = committed / "results" / "x" / "src" / "head"
    body = pb_source.export_source("head", {"git": ".", "ref": "slow"}, [], arm_dir, committed,
                                   plan_sha256="0" * 64, commit=_git(committed, "rev-parse", "slow"), paths=("engine",))
    assert (arm_dir / "engine" / "core.py").read_text().endswith("return 41  # slow\n# end\n")
    assert sorted(p.name for p in arm_dir.iterdir()) == ["engine"]  # not good.patch, .gitignore, ...
    assert body["source"] == {"git": ".", "ref": "slow"} and body["version"] == "slow"
    assert body["git"] == {"ref": "slow", "ref_name": "refs/heads/slow", "tag": None, "tag_object": None,
                           "commit": _git(committed, "rev-parse", "slow"),
                           "tree": _git(committed, "rev-parse", "slow^{tree}")}
    # patches name engine/... as for the path source; the export is cached under resources/cache/git
    base = pb_source.export_source("base", {"git": ".", "ref": "main"}, ["good.patch"], committed / "out" / "base",
                                   committed, plan_sha256="0" * 64, paths=("engine",))
    assert (committed / "out" / "base" / "engine" / "core.py").read_text() == "def answer():\n    return 42\n# end\n"
    assert base["patched"]["changed"] == ["engine/core.py"]
    assert sorted(p.stem[:40] for p in (committed / "resources/cache/git/exports").glob("*.tar")) == sorted(
        [_git(committed, "rev-parse", "main"), _git(committed, "rev-parse", "slow")])


def test_a_ref_that_moved_since_the_job_was_planned_is_an_error(committed):
    planned = _git(committed, "rev-parse", "main")
    _git(committed, "commit", "-q", "--allow-empty", "-m", "moved")
    with pytest.raises(pb_source.GitSourceError, match=rf"arms.base.source.ref: 'main' moved from {planned[:12]} to "):
        pb_source.export_source("base", {"git": ".", "ref": "main"}, [], committed / "out" / "base", committed,
                                plan_sha256="0" * 64, commit=planned)


def test_a_tag_is_exported_like_a_ref_and_recorded_as_its_tag(committed):
    _git(committed, "tag", "-a", "v1", "-m", "one", "slow")
    body = pb_source.export_source("cand", {"git": ".", "tag": "v1"}, [], committed / "out" / "cand", committed,
                                   plan_sha256="0" * 64)
    assert body["source"] == {"git": ".", "tag": "v1"} and body["version"] == "v1"
    assert body["git"] == {"ref": "v1", "ref_name": "refs/tags/v1", "tag": "v1",
                           "tag_object": _git(committed, "rev-parse", "v1"),
                           "commit": _git(committed, "rev-parse", "slow"), "tree": _git(committed, "rev-parse", "slow^{tree}")}
    assert (committed / "out" / "cand" / "engine" / "core.py").read_text().endswith("# slow\n# end\n")


def test_git_problems_name_the_key_of_each_bad_ref(committed):
    arms = {"base": {"source": {"git": ".", "ref": "main"}}, "head": {"source": {"git": ".", "ref": "nope"}},
            "path": {"source": "engine"}, "gone": {"source": {"git": "missing", "ref": "main"}}}
    refs, problems = pb_source.git_problems(arms, committed)
    assert sorted(refs) == ["base"] and refs["base"].commit == _git(committed, "rev-parse", "main")
    assert [key for key, _ in problems] == [("arms", "head", "source", "ref"), ("arms", "gone", "source", "git")]
    assert problems[0][1].startswith("'nope' does not resolve to a commit in ")
    arms = {"base": {"source": {"git": ".", "ref": "main"}}, "head": {"source": {"git": ".", "ref": "HEAD"}}}
    assert [key for key, _ in pb_source.git_problems(arms, committed)[1]] == [("arms", "head", "source")]
    (committed / "engine" / "core.py").write_text("dirty\n")
    dirty = pb_source.git_problems(arms, committed)[1]  # main and HEAD both name the checked-out commit
    assert [key for key, _ in dirty] == [("arms", "base", "source", "git"), ("arms", "head", "source", "git")]
    assert "uncommitted changes to 1 tracked file(s) (engine/core.py)" in dirty[1][1]
