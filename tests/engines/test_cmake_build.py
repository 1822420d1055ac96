"""A CMake build through ccache (pairbench.arms.cmake) on a two-file C project (tests/data/cmake-tiny).

Real cmake, cc and ccache, a private cache folder per test. Locally the tests skip when a tool is
missing; under CI (``CI`` set) they fail: ``./install.sh --test`` installs all three.
"""

import shutil
from pathlib import Path

import pytest

from pairbench.arms import cmake as pc

DATA = Path(__file__).resolve().parents[1] / "data" / "cmake-tiny"
SPEC = {"targets": ["hello", "other"], "jobs": 2, "build_dir": "build", "compiler_cache": "ccache"}


@pytest.fixture(autouse=True)
def toolchain(tmp_path, monkeypatch):
    missing = [t for t in ("cmake", "cc", "ccache") if shutil.which(t) is None]
    if missing:
        msg = f"{', '.join(missing)} not installed (./install.sh --test installs them)"
        pytest.skip(msg)
    monkeypatch.setenv("CCACHE_DIR", str(tmp_path / "ccache"))


def tree(tmp_path, name, edit=None):
    dest = tmp_path / name
    shutil.copytree(DATA, dest)
    if edit:
        (dest / "hello.c").write_text((dest / "hello.c").read_text().replace(*edit))
    return dest


def build(t, log, **kw):
    return pc.cmake_build("cand", {**SPEC, **kw}, t, log, flags=["-DCMAKE_BUILD_TYPE=Release"], timeout_s=300)


def test_only_the_asked_targets_are_built_and_the_toolchain_is_recorded(tmp_path):
    t = tree(tmp_path, "baseline")
    out = build(t, tmp_path / "b.log")
    assert [s["step"] for s in out["steps"]] == ["configure", "compile"]
    assert all(s["exit_code"] == 0 for s in out["steps"])
    assert (t / "build" / "hello").is_file() and (t / "build" / "other").is_file()
    assert not (t / "build" / "unused").exists()  # its source does not even compile
    tc = out["toolchain"]
    assert tc["flags"] == ["-DCMAKE_BUILD_TYPE=Release", *pc.LAUNCHERS]
    assert tc["targets"] == ["hello", "other"] and tc["jobs"] == 2
    assert tc["c_compiler"]["id"] in ("GNU", "Clang") and tc["c_compiler"]["version"][0].isdigit()
    assert tc["cmake"].startswith("cmake version ") and tc["ccache"]["version"].startswith("ccache version ")
    assert {k: tc["ccache"][k] for k in ("calls", "hits", "misses", "hit_rate")} == \
        {"calls": 2, "hits": 0, "misses": 2, "hit_rate": 0.0}


def test_a_patched_copy_elsewhere_recompiles_only_the_patched_file_and_a_rerun_nothing(tmp_path):
    build(tree(tmp_path, "baseline"), tmp_path / "b.log")
    cand = tree(tmp_path, "candidate", edit=("hello %d", "hello, patched %d"))
    out = build(cand, tmp_path / "c.log")
    cc = out["toolchain"]["ccache"]
    # other.c is byte-identical at another absolute path: a hit, thanks to CCACHE_BASEDIR
    assert (cc["calls"], cc["hits"], cc["misses"], cc["hit_rate"]) == (2, 1, 1, 0.5)
    again = build(cand, tmp_path / "c2.log")
    assert again["toolchain"]["ccache"]["calls"] == 0 and again["toolchain"]["ccache"]["hit_rate"] is None


def test_a_relative_log_path_still_counts(tmp_path, monkeypatch):
    # the rule passes logs/<label>/build/<arm>.steps.log, relative to the checkout; ccache runs in
    # the build's subfolders, so the stats log must be made absolute before it is handed over
    t = tree(tmp_path, "baseline")
    monkeypatch.chdir(tmp_path)
    out = build(t, Path("rel.log"))
    assert out["toolchain"]["ccache"]["calls"] == 2 and (tmp_path / "rel.log.ccache").is_file()


def test_a_compile_error_names_the_arm_and_quotes_the_first_error_without_the_tree_path(tmp_path):
    bad = tree(tmp_path, "broken", edit=('printf("hello %d\\n", 1);', "printf(undeclared_name);"))
    with pytest.raises(pc.CMakeBuildError) as err:
        build(bad, tmp_path / "x.log")
    msg = str(err.value)
    assert msg.startswith("arm cand: build step 'compile' exited with status ")
    first = msg.split("first error:\n", 1)[1].splitlines()[0].strip()
    assert first.startswith("hello.c:4:") and "error:" in first and "undeclared_name" in first
    assert str(bad) not in msg.split("see ")[0]


def test_a_configure_error_is_cmakes_own_message(tmp_path):
    bad = tree(tmp_path, "broken")
    (bad / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.16)\nproject(tiny C)\nadd_executable(hello)\n")
    with pytest.raises(pc.CMakeBuildError, match=r"build step 'configure' exited .*\n  CMake Error at CMakeLists.txt:3"):
        build(bad, tmp_path / "x.log")


def test_without_ccache_the_build_says_how_to_install_it(tmp_path, monkeypatch):
    which = shutil.which
    monkeypatch.setattr(pc.shutil, "which", lambda tool: None if tool == "ccache" else which(tool))
    with pytest.raises(pc.CMakeBuildError, match="arm cand: this engine is built through ccache, which is not installed"):
        build(tree(tmp_path, "t"), tmp_path / "x.log")


def test_stats_log_counts():
    text = ("# a.c\ndirect_cache_hit\nlocal_storage_hit\n# b.c\ncache_miss\ndirect_cache_miss\n"
            "# c.c\npreprocessed_cache_hit\n# d.c\ncalled_for_link\n")
    assert pc.parse_stats_log(text) == {"calls": 4, "hits": 2, "direct_hits": 1, "preprocessed_hits": 1,
                                        "misses": 1, "uncacheable": 1, "hit_rate": round(2 / 3, 4)}


def test_first_error_prefers_the_compiler_diagnostic():
    log = ("make[2]: *** [x] Error 1\n/t/src/q.c:10:3: warning: unused\n/t/src/q.c:12:5: error: 'y' undeclared\n"
           "   12 |     y = 1;\n      |     ^\n/t/src/q.c:13:1: error: second\n")
    assert pc.first_error(log, Path("/t")) == "src/q.c:12:5: error: 'y' undeclared\n   12 |     y = 1;\n      |     ^"
