"""The report's line on the sandbox's isolation layers (pairbench.publish.report.isolation_lines)."""

from pairbench.publish.report import isolation_lines

ALL = ["env", "tmpdir", "rlimit", "wall", "output", "netns", "landlock-fs", "landlock-net", "landlock-scope", "audit"]


def _rec(missing=None, sandboxed=True):
    verdicts = {"token_counts": {"verdict": "pass", "reason": ""}}
    if sandboxed:
        v = {"verdict": "pass", "reason": "all tests passed", "duration_s": 0.1}
        if missing is not None:
            v["isolation"] = {"applied": [layer for layer in ALL if layer not in missing], "missing": list(missing)}
        verdicts["python_function"] = v
    return {"length": 8, "output_sha256": "0" * 64, "selected": True, "verdicts": verdicts}


def _validations(*records_per_visit):
    return {(f"r0{i}-baseline", 0): {"records": list(recs)} for i, recs in enumerate(records_per_visit, 1)}


def test_every_layer_applied_is_said_in_one_line():
    lines = isolation_lines(_validations([_rec([]), _rec([])], [_rec([])]))
    assert lines == ["Sandbox isolation: all 10 layers (env, tmpdir, rlimit, wall, output, netns, landlock-fs, "
                     "landlock-net, landlock-scope, audit) applied to each of the 3 records whose function ran in "
                     "the sandbox; the verdict is decided outside it. (docs/validation.md)", ""]


def test_a_missing_layer_is_named_with_how_many_records_lacked_it():
    lines = isolation_lines(_validations([_rec(["landlock-scope"]), _rec(["netns", "landlock-scope"])],
                                         [_rec([]), _rec(sandboxed=False)]))
    assert lines[0] == ("Sandbox isolation: NOT every layer applied to the records whose function ran in the "
                        "sandbox: missing `netns` for 1 of 3; `landlock-scope` for 2 of 3. (docs/validation.md)")


def test_missing_landlock_fs_says_what_that_means():
    line = isolation_lines(_validations([_rec(["landlock-fs", "landlock-net", "landlock-scope"])]))[0]
    assert "missing `landlock-fs` for 1 of 1; `landlock-net` for 1 of 1; `landlock-scope` for 1 of 1." in line
    assert "could read this machine's files" in line


def test_records_from_an_older_pairbench_are_said_to_record_no_layers():
    line = isolation_lines(_validations([_rec([]), _rec(None)]))[0]
    assert line.endswith("1 sandboxed record(s) do not record their layers (validated by an older pairbench). "
                         "(docs/validation.md)")


def test_no_sandboxed_record_no_line():
    assert isolation_lines(_validations([_rec(sandboxed=False)])) == []
    assert isolation_lines({}) == []
