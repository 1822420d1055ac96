"""Validation cases (token_counts, done_marker, python_function, matches_baseline), selection and the
validate artifact schema; the completion parser runs over the stored outputs in tests/data/validate.
"""

import hashlib
import os
import json
from pathlib import Path

import pytest

from pairbench.core import artifacts
from pairbench.core import tasks
from pairbench.validate import cases as validate
from pairbench.validate.cases import extract_function, is_selected, run_cases

DATA = Path(__file__).resolve().parent.parent / "data" / "validate"
PARSER_CASES = json.loads((DATA / "outputs.json").read_text())["cases"]
SMOLLM2 = json.loads((DATA / "smollm2.json").read_text())

GOOD_ADD = "```python\ndef add(a, b):\n    return a + b\n```\n# adds\n# two numbers\n"
BAD_ADD = "```python\ndef add(a, b):\n    return a - b\n```\n# subtracts, by mistake\n"


def _fixture(task="add", input_tokens=256, output_tokens=8):
    return {"input_tokens": input_tokens, "output_tokens": output_tokens, "task": task}


def _record(prompt_tokens=256, completion_tokens=8, input_tokens=256, text=GOOD_ADD):
    return {"condition": f"in{input_tokens}-out8", "input_tokens": input_tokens, "output_tokens": 8,
            "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "output_sha256": hashlib.sha256(text.encode()).hexdigest()}


def _output(text=GOOD_ADD, ids=None):
    return {"text": text, "token_ids": list(range(8)) if ids is None else ids}


def _run(cases, *, text=GOOD_ADD, ids=None, record=None, fixture=None, baseline=None, options=None):
    return run_cases(cases, record=record or _record(text=text), output=_output(text, ids),
                     fixture=fixture or _fixture(), baseline_output=baseline, options=options)


# --- the parser --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PARSER_CASES))
def test_parser_on_stored_outputs(name):
    expect = PARSER_CASES[name]
    task = tasks.get_task(expect["task"])
    text = (DATA / "outputs" / name).read_text()
    found = extract_function(text, task.entry_point)
    assert (found is not None) == expect["complete"], found
    if found is not None:
        assert f"def {task.entry_point}(" in found
        compile(found, name, "exec")
        assert "```" not in found and "<|" not in found
    v = run_cases(["python_function"], record=_record(), output=_output(text),
                  fixture=_fixture(expect["task"]), baseline_output=None)
    assert (v["python_function"]["verdict"] == "pass") == expect["passes"], v


@pytest.mark.parametrize("task_name", sorted(SMOLLM2["outputs"]))
def test_parser_on_real_smollm2_outputs(task_name):
    """Outputs the real model produced (python -m pairbench.validate.probe probe); see docs/validation.md."""
    seen = SMOLLM2["outputs"][task_name]
    task = tasks.get_task(task_name)
    text = (DATA / "smollm2" / f"{task_name}.txt").read_text()
    assert validate.sha256_text(text) == seen["output_sha256"]
    verdicts = run_cases(["done_marker", "python_function"], record=_record(), output=_output(text),
                         fixture=_fixture(task_name), baseline_output=None)
    assert verdicts["done_marker"]["verdict"] == seen["done_marker"]
    assert verdicts["python_function"]["verdict"] == seen["python_function"]


def test_parser_takes_the_first_complete_definition():
    text = ("```python\ndef add(a, b):\n    \"\"\"doc\"\"\"\n```\nBetter:\n```python\n"
            "def add(a, b):\n    return a + b\n```\n")
    assert extract_function(text, "add") == "def add(a, b):\n    return a + b\n"


def test_parser_ignores_other_functions_and_indented_defs():
    text = "def helper():\n    return 1\n\n    def add(a, b):\n        return a + b\n\n# done\n"
    assert extract_function(text, "add") == "def add(a, b):\n    return a + b\n"
    assert extract_function(text, "adder") is None


def test_parser_rejects_bad_entry_point():
    with pytest.raises(ValueError, match="entry_point"):
        extract_function("def f(): pass", "not an identifier")


# --- token_counts --------------------------------------------------------------------------------


def test_token_counts_pass():
    assert _run(["token_counts"])["token_counts"]["verdict"] == "pass"


@pytest.mark.parametrize(
    "record, ids, culprit",
    [
        (_record(prompt_tokens=257), None, "prompt_tokens: got 257, planned 256"),
        (_record(completion_tokens=7), None, "completion_tokens: got 7, planned 8"),
        (_record(), [1, 2, 3], "token_ids: got 3, planned 8"),
    ],
)
def test_token_counts_fail_names_the_counter(record, ids, culprit):
    v = _run(["token_counts"], record=record, ids=ids)["token_counts"]
    assert v["verdict"] == "fail"
    assert culprit in v["reason"]


# --- done_marker -------------------------------------------------------------------------------


def test_done_marker_pass_and_fail():
    assert _run(["done_marker"])["done_marker"]["verdict"] == "pass"
    v = _run(["done_marker"], text="```python\ndef add(a, b):\n    return (a +")["done_marker"]
    assert v["verdict"] == "fail" and "add()" in v["reason"]


def test_done_marker_empty_output_fails():
    v = _run(["done_marker", "python_function"], text="")
    assert v["done_marker"] == {"verdict": "fail", "reason": "empty output"}
    assert v["python_function"]["verdict"] == "fail"


# --- python_function ---------------------------------------------------------------------------


def test_python_function_pass_and_wrong_answer():
    assert _run(["python_function"])["python_function"]["verdict"] == "pass"
    v = _run(["python_function"], text=BAD_ADD)["python_function"]
    assert v["verdict"] == "fail" and "assertion failed" in v["reason"]


def test_python_function_syntax_error_fails():
    v = _run(["python_function"], text="def add(a, b)\n    return a + b\n# x\n")["python_function"]
    assert v["verdict"] == "fail"


def test_python_function_infinite_loop_is_a_timeout_not_a_crash():
    text = "def add(a, b):\n    while True:\n        pass\n# never returns\n"
    v = _run(["python_function"], text=text, options={"timeout_s": 1.0})["python_function"]
    assert v["verdict"] == "timeout"
    assert v["duration_s"] >= 1.0


def test_python_function_cannot_read_the_harness_environment(monkeypatch):
    monkeypatch.setenv("PAIRBENCH_TEST_TOKEN", "s3cr3t")
    text = ("def add(a, b):\n    import os\n"
            "    return a + b + len(os.environ.get('PAIRBENCH_TEST_TOKEN', ''))\n# x\n")
    assert _run(["python_function"], text=text)["python_function"]["verdict"] == "pass"


def test_python_function_cannot_write_outside(tmp_path):
    target = tmp_path / "escaped"
    text = f"def add(a, b):\n    open({str(target)!r}, 'w').write('x')\n    return a + b\n# x\n"
    v = _run(["python_function"], text=text)["python_function"]
    assert v["verdict"] == "fail" and not target.exists()


def test_python_function_huge_output_is_bounded():
    text = "def add(a, b):\n    print('x' * (100 << 20))\n    return a + b\n# x\n"
    # three asserts print 300 MB in all: a generous wall clock so a busy machine cannot flake it
    v = _run(["python_function"], text=text, options={"timeout_s": 60.0, "cpu_s": 60})["python_function"]
    assert v["verdict"] == "pass"
    assert "output truncated" in v["reason"]


# --- matches_baseline --------------------------------------------------------------------------


def test_agreement_definition():
    assert validate.agreement([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert validate.agreement([1, 2, 9, 4], [1, 2, 3, 4]) == 0.5  # positions after a divergence count as lost
    assert validate.agreement([1, 2], [1, 2, 3, 4]) == 0.5
    assert validate.agreement([], []) == 1.0
    assert validate.agreement([5], [6]) == 0.0


def test_matches_baseline_identical_passes():
    v = _run(["matches_baseline"], baseline=_output())["matches_baseline"]
    assert v["verdict"] == "pass" and v["agreement"] == 1.0 and v["first_divergence"] is None


def test_matches_baseline_divergence_fails_by_default_and_passes_with_threshold():
    cand = [0, 1, 2, 3, 4, 5, 6, 99]
    v = _run(["matches_baseline"], ids=cand, baseline=_output())["matches_baseline"]
    assert v["verdict"] == "fail" and v["agreement"] == 0.875 and v["first_divergence"] == 7
    v = _run(["matches_baseline"], ids=cand, baseline=_output(),
             options={"min_agreement": 0.8})["matches_baseline"]
    assert v["verdict"] == "pass"
    v = _run(["matches_baseline"], ids=cand, baseline=_output(),
             options={"min_agreement": 0.9})["matches_baseline"]
    assert v["verdict"] == "fail"


def test_matches_baseline_fails_when_nothing_was_compared():
    v = _run(["matches_baseline"], ids=[], baseline=_output(ids=[]))["matches_baseline"]
    assert v == {"verdict": "fail", "reason": "nothing to compare: neither output holds a token id"}


def test_matches_baseline_skipped_for_the_baseline_arm():
    assert _run(["matches_baseline"], baseline=None)["matches_baseline"]["verdict"] == "skipped"


# --- errors, selection, artifact -------------------------------------------------------------


def test_unknown_case_is_named():
    with pytest.raises(ValueError, match="'no_such_case'"):
        _run(["token_counts", "no_such_case"])


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="fixture lacks 'task'"):
        run_cases(["done_marker"], record=_record(), output=_output(),
                  fixture={"input_tokens": 1, "output_tokens": 8}, baseline_output=None)
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        _run(["done_marker"], fixture=_fixture(task="nope"))
    with pytest.raises(ValueError, match="min_agreement"):
        _run(["matches_baseline"], options={"min_agreement": 1.5})
    with pytest.raises(ValueError, match="'colour'"):
        _run(["matches_baseline"], options={"colour": 1})


def test_is_selected():
    assert is_selected({"a": {"verdict": "pass"}, "b": {"verdict": "skipped"}})
    assert not is_selected({"a": {"verdict": "pass"}, "b": {"verdict": "timeout"}})
    assert not is_selected({"a": {"verdict": "fail"}})


def test_artifact_from_all_cases_validates_and_carries_no_text():
    good = _run(list(validate.CASES), baseline=_output())
    bad = _run(list(validate.CASES), text=BAD_ADD, ids=[0, 1, 2, 3, 4, 5, 6, 7], baseline=_output())
    entries = [validate.record_entry(_record(), _fixture(), good),
               validate.record_entry(_record(text=BAD_ADD), _fixture(), bad)]
    assert entries[0]["selected"] and not entries[1]["selected"]
    assert [e["condition"] for e in entries] == ["in256-out8"] * 2
    assert entries[1]["excluded_because"][0].startswith("python_function: fail:")
    doc = {"schema": artifacts.schema_id("validate"), "inputs": {"measure": "0" * 64}, "round": 1,
           "arm": "candidate", "attempt": 1, "cases": list(validate.CASES),
           "options": dict(validate.DEFAULT_OPTIONS), "records": entries}
    artifacts.validate("validate", doc)
    assert "return a" not in json.dumps(doc)
    doc["records"][0]["text"] = GOOD_ADD
    with pytest.raises(artifacts.ArtifactError, match="records/0"):
        artifacts.validate("validate", doc)


# --- isolation layers per record ---------------------------------------------------------------


def test_python_function_records_which_isolation_layers_applied(monkeypatch):
    from pairbench.validate import sandbox

    v = _run(["python_function"])["python_function"]
    applied, missing = v["isolation"]["applied"], v["isolation"]["missing"]
    # the kernel layers are required: a run without them is refused, never recorded as a pass
    assert {"env", "tmpdir", "rlimit", "wall", "output", "user", "pidns", "mountns", "netns", "audit"} <= set(applied)
    assert sorted(applied + missing) == sorted(sandbox.LAYERS) and not set(applied) & set(missing)

    # A machine without Landlock: the record says which layers were missing.
    kernel = ["env", "tmpdir", "rlimit", "wall", "output", "user", "pidns", "mountns", "netns", "audit"]
    real = sandbox.run_python_tests
    monkeypatch.setattr(sandbox, "run_python_tests", lambda *a, **k: {**real(*a, **k), "isolation": kernel})
    entry = validate.record_entry(_record(), _fixture(), _run(["python_function"]))
    assert entry["verdicts"]["python_function"]["isolation"] == {
        "applied": kernel, "missing": ["landlock-fs", "landlock-net", "landlock-scope"]}
    doc = {"schema": artifacts.schema_id("validate"), "inputs": {}, "round": 1, "arm": "baseline", "attempt": 1,
           "cases": ["python_function"], "records": [entry]}
    artifacts.validate("validate", doc)
    entry["verdicts"]["python_function"]["isolation"]["applied"].append("seccomp")  # not a layer we have
    with pytest.raises(artifacts.ArtifactError, match="isolation"):
        artifacts.validate("validate", doc)


def test_a_record_whose_function_never_reached_the_sandbox_records_no_layers():
    v = _run(["python_function"], text="no function here\n")["python_function"]
    assert v["verdict"] == "fail" and "isolation" not in v


def test_probe_evaluate_rejudges_stored_outputs_as_the_catalogue_records_them(tmp_path):
    # the command docs/validation.md gives for re-judging the task catalogue, run as a user runs it
    import shutil
    import subprocess
    import sys

    for f in (DATA / "smollm2").glob("*.txt"):
        shutil.copy(f, tmp_path / f.name)
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-m", "pairbench.validate.probe", "evaluate", "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=root, timeout=300,
                         env={**os.environ, "PYTHONPATH": f"{root / 'workflow'}:{root}"})
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads((tmp_path / "smollm2.json").read_text())["outputs"]
    assert got == SMOLLM2["outputs"]
    assert run.stdout.splitlines()[0] == "add: done_marker=pass python_function=pass (all tests passed)"
