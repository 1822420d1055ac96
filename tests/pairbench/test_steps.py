"""The one step runner (pairbench.core.steps.run_step): a subprocess as a named, logged, recorded step."""

import os
import sys

import pytest

from pairbench.core.steps import StepError, public_argv, run_step

PY = sys.executable


def test_a_step_is_logged_and_recorded_with_its_public_argv(tmp_path):
    log = tmp_path / "logs" / "build.log"
    res = run_step("version", [PY, "-c", "import sys; print('v 1.2'); sys.stderr.write('note\\n')"], cwd=tmp_path,
                   log=log, capture="both")
    assert res.stdout == "v 1.2\n" and res.stderr == "note\n" and res.exit_code == 0
    assert res.record["step"] == "version" and res.record["argv"][:2] == ["python", "-c"]
    assert set(res.record) == {"step", "argv", "exit_code", "duration_s"} and res.record["duration_s"] >= 0
    text = log.read_text()
    assert text.startswith(f"$ {PY} -c ") and "note\n" in text and "v 1.2\n" in text


def test_uncaptured_output_goes_to_the_log_and_the_environment_is_the_one_given(tmp_path):
    log = tmp_path / "s.log"
    res = run_step("build", [PY, "-c", "import os; print(os.environ['STEP_X'])"], cwd=tmp_path, log=log,
                   env={**os.environ, "STEP_X": "from-env"})
    assert res.stdout == "" and log.read_text().splitlines()[-1] == "from-env"


def test_a_failing_step_names_itself_its_exit_status_and_the_log(tmp_path):
    log = tmp_path / "b.log"
    argv = [PY, "-c", "import sys; sys.stderr.write('boom: bad flag\\n'); sys.exit(3)"]
    with pytest.raises(StepError) as err:
        run_step("configure", argv, cwd=tmp_path, log=log)
    assert str(err.value) == f"step 'configure' exited with status 3; see {log}"
    assert err.value.reason == "exit" and err.value.record["exit_code"] == 3 and err.value.step == "configure"
    assert err.value.output == "boom: bad flag\n" and "boom: bad flag" in log.read_text()
    # the caller's words for the step, and the line worth quoting from its output
    with pytest.raises(StepError, match=r"^arm cand: build step 'compile' exited with status 3; first: boom\nsee "):
        run_step("compile", argv, cwd=tmp_path, log=log, subject="arm cand: build step 'compile'",
                 diagnose=lambda out: "first: " + out.split(":")[0])
    # not checked: the caller judges the exit status
    assert run_step("probe", argv, cwd=tmp_path, log=log, check=False, capture="both").exit_code == 3


def test_a_timeout_is_recorded_and_named(tmp_path):
    log = tmp_path / "t.log"
    with pytest.raises(StepError, match=rf"^step 'tool' exceeded 0\.3 s; see {log}$") as err:
        run_step("tool", [PY, "-c", "import time; time.sleep(600)"], cwd=tmp_path, log=log, timeout_s=0.3)
    rec = err.value.record
    assert err.value.reason == "timeout" and rec["timed_out"] is True and rec["timeout_s"] == 0.3
    assert rec["exit_code"] is None and rec["duration_s"] >= 0.3
    assert log.read_text().endswith("(step 'tool' exceeded 0.3 s and was killed)\n")


def test_a_missing_program_is_named(tmp_path):
    with pytest.raises(StepError, match=r"^step 'version': llama-server not found; see ") as err:
        run_step("version", [str(tmp_path / "build" / "bin" / "llama-server"), "--version"], cwd=tmp_path,
                 log=tmp_path / "v.log")
    assert err.value.reason == "not_found" and err.value.record["exit_code"] == 127
    assert err.value.record["argv"] == ["llama-server", "--version"]


def test_public_argv_hides_this_machines_paths():
    assert public_argv([PY, "-m", "engine", "convert", "/home/me/m.gguf", "rel/x", "-DX=1"]) == \
        ["python", "-m", "engine", "convert", "m.gguf", "rel/x", "-DX=1"]
