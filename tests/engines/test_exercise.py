"""The exercise probe (pairbench.measure.exercise): which compiled functions a patch changed, and
whether any of them ran, on real programs compiled here (gcc, objdump, gdb).

Three small C programs stand for a baseline and its patches: a change to a function the run calls
(exercised), a change to a function it never calls (not exercised: the "kernel for a quantization
type the model does not use"), and an edit that only shifts the source lines of an assert below it
(the assert's line number moves, the code does not: one changed function, not two).
"""

import shutil
import subprocess

import pytest

from pairbench.measure import exercise as ex

BASE = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline, noreturn)) void report_abort(const char *file, int line) {
    fprintf(stderr, "%s:%d: assertion failed\n", file, line); abort();
}
__attribute__((noinline)) int used_kernel(int x) { return x * 3 + 1; }
__attribute__((noinline)) int unused_kernel(int x) { return x * 5 + 2; }
__attribute__((noinline)) int guarded(int x) { if (x < 0) report_abort(__FILE__, __LINE__); return x + 7; }
int main(int argc, char **argv) {
    int x = argc;
    if (argc > 5) x = unused_kernel(x);   /* never taken by the probe's command */
    printf("%d %d\n", used_kernel(x), guarded(x));
    return 0;
}
"""

TOOLS = [t for t in ("gcc", "objdump", "gdb", "nm") if shutil.which(t) is None]
pytestmark = pytest.mark.skipif(bool(TOOLS), reason=f"needs {', '.join(TOOLS)} (install.sh --llama-cpp installs them)")


def build(tmp_path, name: str, source: str):
    tree = tmp_path / name
    (tree / "bin").mkdir(parents=True)
    (tree / "p.c").write_text(source)
    subprocess.run(["gcc", "-O2", "-fno-inline", "-o", str(tree / "bin" / "prog"), str(tree / "p.c")], check=True)
    return tree


def run(tmp_path, source: str):
    base, cand = build(tmp_path, "base", BASE), build(tmp_path, "cand", source)
    return ex.exercise(baseline_dir=base, candidate_dir=cand, binaries=["bin/prog"],
                       commands=[[str(cand / "bin" / "prog"), "a"]], log=tmp_path / "probe.log", timeout_s=60)


def test_a_change_to_a_function_that_runs_is_exercised(tmp_path):
    rec = run(tmp_path, BASE.replace("x * 3 + 1", "x * 3 + 2"))
    assert rec["changed"] == {"prog": ["used_kernel"]} and rec["probed"] == ["used_kernel"]
    assert rec["hit"] == ["used_kernel"] and rec["exercised"] is True


def test_a_change_to_a_function_that_never_runs_is_not_exercised(tmp_path):
    rec = run(tmp_path, BASE.replace("x * 5 + 2", "x * 5 + 4"))
    assert rec["changed"] == {"prog": ["unused_kernel"]} and rec["hit"] == []
    assert rec["exercised"] is False
    assert "none of them ran under prog" in rec["reason"] and "unused_kernel" in rec["reason"]


def test_identical_code_is_not_exercised_without_running_anything(tmp_path):
    rec = run(tmp_path, BASE.replace("/* never taken", "/* a comment edited, never taken"))
    assert rec["changed"] == {"prog": []} and rec["exercised"] is False
    assert rec["commands"] == [["prog", "a"]]  # the tree's location is private: file names only
    assert rec["reason"] == "the patch leaves the code of every function of prog identical to the baseline's build"


def test_lines_added_above_an_assert_change_only_the_edited_function(tmp_path):
    # the edit adds three source lines inside used_kernel, so guarded's __LINE__ below it (handed to
    # report_abort, as GGML_ASSERT hands it to ggml_abort) grows by three: its code does not change
    src = BASE.replace("int used_kernel(int x) { return x * 3 + 1; }",
                       "int used_kernel(int x) {\n  int y = x * 3;\n  return y + 2;\n}")
    rec = run(tmp_path, src)
    assert rec["changed"] == {"prog": ["used_kernel"]}


def test_the_line_number_handed_to_an_abort_is_not_code():
    a = ["mov    $0x283a,%esi", "lea    0x1(%rip),%rdi        # <x>", "call   4a5b30 <ggml_abort>"]
    b = ["mov    $0x283b,%esi", "lea    0x9(%rip),%rdi        # <x>", "call   4a5b90 <ggml_abort>"]
    assert ex.normalize(a) == ex.normalize(b) == ["mov    $LINE,%esi", "lea    X(%rip),%rdi", "call   <ggml_abort>"]
    # a constant compared in the code is code: changing it is a change
    assert ex.normalize(["cmp    $0x1ff,%rax"]) != ex.normalize(["cmp    $0xff,%rax"])


def test_a_missing_program_is_reported_not_raised(tmp_path):
    base = build(tmp_path, "base", BASE)
    rec = ex.exercise(baseline_dir=base, candidate_dir=tmp_path / "nothing", binaries=["bin/prog"],
                      commands=[["prog"]], log=tmp_path / "probe.log", timeout_s=60)
    assert rec["exercised"] is None and rec["reason"].startswith("not probed: prog is not built in")


def test_the_published_form_and_the_report_say_not_exercised(tmp_path):
    from pairbench.core.artifacts import schema_id, validate
    from pairbench.publish.bundle import CATEGORICAL_FIELDS, json_field_problems
    from pairbench.publish.report import exercise_section

    rec = run(tmp_path, BASE.replace("x * 5 + 2", "x * 5 + 4"))
    short = ex.status(rec)
    assert short == {"exercised": False, "status": "not exercised: no changed function ran", "changed": 1,
                     "probed": 1, "hit": 0, "functions": ["unused_kernel"]}
    body = {"schema": schema_id("crosscheck_summary"), "inputs": {}, "baseline": "baseline", "candidate": "candidate",
            "tool": "prog", "noise": 0.01, "rounds": 1, "rows": [], "direction_counts": {"agree": 0, "disagree": 0,
            "undecided": 0}, "size_within_ci": 0, "exercise": short}
    validate("crosscheck_summary", body)
    assert json_field_problems("tables/crosscheck.json", body, CATEGORICAL_FIELDS) == []
    text = "\n".join(exercise_section(body))
    assert text.startswith("## Not exercised: `candidate`'s patch never ran")
    assert "says nothing about the change" in text and "(`unused_kernel`) and none of them ran under `prog`" in text
    assert exercise_section({**body, "exercise": ex.status(run(tmp_path / "b", BASE.replace("x * 3 + 1", "x * 3 + 2")))})[0] \
        == "## Exercise of `candidate`'s patch"
