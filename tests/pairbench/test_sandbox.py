"""The sandbox that runs model-written code: verdicts, limits and containment.

Each test hands ``run_python_tests`` code that misbehaves one way and checks both the verdict and
that the harness side is untouched (no file written, secret not seen, output bounded).
"""

import os
import socket
import threading

import pytest

from pairbench.validate import sandbox
from pairbench.validate.sandbox import run_python_tests

ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"


def test_correct_function_passes():
    r = run_python_tests(ADD, ADD_TESTS)
    assert r["verdict"] == "pass", r
    assert r["duration_s"] > 0
    assert {"env", "tmpdir", "rlimit", "wall", "audit"} <= set(r["isolation"])


def test_wrong_function_fails_naming_the_assert():
    r = run_python_tests("def add(a, b):\n    return a - b\n", ADD_TESTS)
    assert r["verdict"] == "fail"
    assert "assert add(2, 3) == 5" in r["reason"]


def test_syntax_error_fails():
    r = run_python_tests("def add(a, b)\n    return a + b\n", ADD_TESTS)
    assert r["verdict"] == "fail"
    assert "SyntaxError" in r["reason"]


def test_empty_code_fails():
    r = run_python_tests("", ADD_TESTS)
    assert r["verdict"] == "fail"
    assert "NameError" in r["reason"]


def test_exception_fails_without_quoting_the_candidate():
    r = run_python_tests("def add(a, b):\n    raise RuntimeError('boom')  # SECRET_TEXT\n", ADD_TESTS)
    assert r["verdict"] == "fail"
    assert "RuntimeError" in r["reason"] and "<candidate> line 2" in r["reason"]
    assert "SECRET_TEXT" not in r["reason"]


def test_infinite_loop_times_out_and_is_killed():
    r = run_python_tests("def add(a, b):\n    while True:\n        pass\n", ADD_TESTS, timeout_s=1.5)
    assert r["verdict"] == "timeout"
    assert 1.4 <= r["duration_s"] < 10


def test_cpu_limit_ends_a_busy_loop_before_the_wall_clock():
    r = run_python_tests("while True:\n    pass\n", "", timeout_s=120, cpu_s=1)
    assert r["verdict"] == "timeout"
    assert "CPU-time" in r["reason"]
    assert r["duration_s"] < 100


def test_sleeping_forever_times_out():
    r = run_python_tests("import time\ntime.sleep(3600)\n", "", timeout_s=1.0)
    assert r["verdict"] == "timeout"


def test_memory_limit_fails():
    r = run_python_tests("x = bytearray(2 << 30)\n", "", mem_bytes=256 << 20)
    assert r["verdict"] == "fail"
    assert "MemoryError" in r["reason"]


def test_environment_is_not_inherited(monkeypatch):
    monkeypatch.setenv("PAIRBENCH_TEST_TOKEN", "s3cr3t")
    code = (
        "import os\n"
        "LEAK = [k for k, v in os.environ.items() if 's3cr3t' in v or k == 'PAIRBENCH_TEST_TOKEN']\n"
    )
    r = run_python_tests(code, "assert LEAK == [], LEAK\n")
    assert r["verdict"] == "pass", r


def test_harness_environment_via_proc_is_unreadable(monkeypatch):
    monkeypatch.setenv("PAIRBENCH_TEST_TOKEN", "s3cr3t")
    code = f"data = open('/proc/{os.getpid()}/environ', 'rb').read()\n"
    r = run_python_tests(code, "assert b's3cr3t' not in data\n")
    assert r["verdict"] == "fail"
    assert "PermissionError" in r["reason"]


def test_write_outside_temp_dir_is_contained(tmp_path):
    target = tmp_path / "escaped.txt"
    r = run_python_tests(f"open({str(target)!r}, 'w').write('x')\n", "")
    assert r["verdict"] == "fail"
    assert "PermissionError" in r["reason"]
    assert not target.exists()


def test_delete_outside_temp_dir_is_contained(tmp_path):
    victim = tmp_path / "keep.txt"
    victim.write_text("precious")
    r = run_python_tests(f"import os\nos.remove({str(victim)!r})\n", "")
    assert r["verdict"] == "fail"
    assert victim.read_text() == "precious"


def test_writes_inside_temp_dir_work_and_are_removed(monkeypatch):
    made = []
    real_mkdtemp = sandbox.tempfile.mkdtemp

    def recording_mkdtemp(*args, **kwargs):
        made.append(real_mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(sandbox.tempfile, "mkdtemp", recording_mkdtemp)
    code = "open('scratch.txt', 'w').write('ok')\n"
    r = run_python_tests(code, "assert open('scratch.txt').read() == 'ok'\n")
    assert r["verdict"] == "pass", r
    assert len(made) == 1 and not os.path.exists(made[0])


def test_subprocess_is_refused(tmp_path):
    target = tmp_path / "from_shell.txt"
    r = run_python_tests(f"import os\nos.system('touch {target}')\n", "")
    assert r["verdict"] == "fail"
    assert not target.exists()


def _listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(3)
    hits = []

    def accept():
        try:
            conn, _ = srv.accept()
            hits.append(conn.recv(100))
            conn.close()
        except OSError:
            pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    return srv, t, hits


@pytest.mark.parametrize("how", ["socket", "_socket"])
def test_network_is_refused(how):
    srv, thread, hits = _listener()
    port = srv.getsockname()[1]
    code = (
        f"import {how}\n"
        f"s = {how}.socket({how}.AF_INET, {how}.SOCK_STREAM)\n"
        f"s.connect(('127.0.0.1', {port}))\n"
        "s.send(b'hello')\n"
    )
    try:
        r = run_python_tests(code, "")
    finally:
        thread.join(timeout=4)
        srv.close()
    assert r["verdict"] == "fail"
    assert hits == []


def test_huge_output_is_bounded():
    r = run_python_tests("import sys\nsys.stdout.write('x' * (100 << 20))\n", "", max_output_bytes=4096,
                         timeout_s=60)
    assert r["verdict"] == "pass", r
    assert r["output_truncated"] is True
    assert r["output_bytes"] == 100 << 20
    assert "output truncated" in r["reason"]


def test_endless_output_times_out():
    r = run_python_tests("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", "", timeout_s=1.5)
    assert r["verdict"] == "timeout"
    assert r["output_truncated"] is True


def test_huge_file_write_is_stopped():
    code = "with open('big.bin', 'wb') as f:\n    f.write(b'0' * (64 << 20))\n"
    r = run_python_tests(code, "", mem_bytes=1 << 30)
    assert r["verdict"] == "fail"
    assert "file size" in r["reason"] or "File too large" in r["reason"]


def test_early_exit_is_not_a_pass():
    r = run_python_tests("import os\nos._exit(0)\n", "assert False\n")
    assert r["verdict"] == "fail"
    r = run_python_tests("raise SystemExit(0)\n", "assert False\n")
    assert r["verdict"] == "fail"


def test_broken_tests_are_an_error_not_the_candidates_fault():
    r = run_python_tests(ADD, "assert add(2, 3) ==\n")
    assert r["verdict"] == "error"


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        run_python_tests(ADD, ADD_TESTS, timeout_s=0)
    with pytest.raises(TypeError):
        run_python_tests(None, ADD_TESTS)


@pytest.mark.skipif(not sandbox._landlock_abi(), reason="Landlock is not available on this kernel")
def test_landlock_alone_contains_writes_and_reads(tmp_path):
    """The kernel layer holds even when the Python audit hook is switched off."""
    target = tmp_path / "escaped.txt"
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cr3t")
    code = (
        "import errno\nresults = []\n"
        f"for path, mode in (({str(target)!r}, 'w'), ({str(secret)!r}, 'r')):\n"
        "    try:\n        open(path, mode)\n        results.append('open')\n"
        "    except PermissionError:\n        results.append('denied')\n"
    )
    r = run_python_tests(code, "assert results == ['denied', 'denied'], results\n", _audit=False)
    assert r["verdict"] == "pass", r
    assert "landlock-fs" in r["isolation"] and "audit" not in r["isolation"]
    assert not target.exists()
