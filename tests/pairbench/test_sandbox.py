"""The sandbox that runs model-written code: verdicts, limits and containment.

Each test hands ``run_python_tests`` code that misbehaves one way and checks both the verdict and
that the harness side is untouched (no file written, secret not seen, output bounded).
"""

import os
import socket
import threading

import psutil
import pytest

from pairbench.validate import confine, sandbox
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


# --- the kernel's layers, each shown to hold with the layers above it switched off ---------------
#
# None of these skip: a machine (CI's included) that cannot give the sandbox its namespaces and an
# unprivileged user gets the verdict "error" from every run, and these tests fail there.

KERNEL_ONLY = frozenset({"audit", "landlock"})  # the Python audit hook and Landlock switched off


def test_this_machine_can_confine_model_written_code():
    how = confine.plan()
    assert isinstance(how, confine.Plan), how  # else: the reason and how to enable it
    r = run_python_tests(ADD, ADD_TESTS)
    assert set(confine.REQUIRED) | {"rlimit"} <= set(r["isolation"]), r


def test_the_code_runs_as_an_unprivileged_user_even_as_root():
    code = ("import os\nIDS = sorted(set(os.getresuid() + os.getresgid()))\n"
            "CAPS = [l.split()[1] for l in open('/sandbox/status.txt')] if False else None\n")
    expected = sorted({confine.plan().uid, confine.plan().gid}) if os.geteuid() == 0 else [0]
    r = run_python_tests(code, f"assert IDS == {expected!r}\n", _off=KERNEL_ONLY)
    assert r["verdict"] == "pass", r
    assert "user" in r["isolation"]  # observed from here: no uid 0, no capability, no new privileges


def test_the_namespaces_alone_contain_writes_and_reads(tmp_path):
    """Without the audit hook and Landlock: the harness's files, /tmp and /proc are not in the
    child's view of the filesystem, and what is in it is read-only outside /sandbox."""
    target = tmp_path / "escaped.txt"
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cr3t")
    code = (
        "results = []\n"
        f"for path, mode in (({str(target)!r}, 'w'), ({str(secret)!r}, 'r'), ({__file__!r}, 'r'),\n"
        "                   ('/proc/1/environ', 'rb'), ('/usr/escaped.txt', 'w'), ('/escaped.txt', 'w')):\n"
        "    try:\n        open(path, mode)\n        results.append('open')\n"
        "    except OSError:\n        results.append('denied')\n"
        "open('/sandbox/mine.txt', 'w').write('ok')\n"
    )
    r = run_python_tests(code, "assert results == ['denied'] * 6\nassert open('/sandbox/mine.txt').read() == 'ok'\n",
                         _off=KERNEL_ONLY)
    assert r["verdict"] == "pass", r
    assert {"mountns", "user"} <= set(r["isolation"]) and "landlock-fs" not in r["isolation"]
    assert not target.exists()


def test_a_patched_realpath_does_not_open_the_filesystem(tmp_path):
    """Issue 38's attack on a kernel without Landlock: patch os.path.realpath, which the audit hook
    used, then write outside. The hook now holds its own realpath; the mount namespace holds anyway."""
    target = tmp_path / "escaped.txt"
    code = ("import os, os.path\nos.path.realpath = lambda p, **k: '/sandbox/x'\n"
            f"try:\n    open({str(target)!r}, 'w').write('out')\n    WROTE = True\nexcept OSError:\n    WROTE = False\n")
    for off in (frozenset({"landlock"}), KERNEL_ONLY):
        r = run_python_tests(code, "assert WROTE is False\n", _off=off)
        assert r["verdict"] == "pass", (off, r)
        assert not target.exists()


def test_rebinding_the_audit_hooks_globals_does_not_let_the_code_fork():
    """Issue 38's first attack: set the runner's _BLOCKED to () and fork. The hook reads its own
    closure; without it, RLIMIT_NPROC = 0 holds for the unprivileged user (it did not for root)."""
    code = ("import __main__, os\n__main__._BLOCKED = ()\n__main__._PATH_EVENTS = ()\n"
            "try:\n    pid = os.fork()\nexcept OSError as e:\n    FORK = type(e).__name__\nelse:\n"
            "    if pid == 0:\n        os._exit(0)\n    FORK = 'forked'\n")
    r = run_python_tests(code, "assert FORK == 'PermissionError'\n")
    assert r["verdict"] == "pass", r
    r = run_python_tests(code, "assert FORK == 'BlockingIOError'\n", _off=KERNEL_ONLY)  # EAGAIN: RLIMIT_NPROC
    assert r["verdict"] == "pass", r


def _sandboxed_processes() -> list[psutil.Process]:
    runner = str(sandbox.RUNNER)
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if runner in " ".join(p.info["cmdline"] or ()):
            found.append(p)
    return found


def test_no_process_outlives_the_sandbox():
    """With every layer but the namespaces off (RLIMIT_NPROC too), the candidate forks, the child
    leaves the process group and session (setsid) and forks a grandchild that would sleep a
    minute. The candidate's add() returns only once the grandchild has written its handshake file,
    so it surely ran; when the verdict is in, no process of the sandbox is left, and the verdict
    did not wait for the grandchild."""
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        open('/sandbox/grandchild', 'w').write(str(os.getpid()))\n        time.sleep(60)\n    os._exit(0)\n"
        "def add(a, b):\n"
        "    while not os.path.exists('/sandbox/grandchild'):\n        time.sleep(0.01)\n    return a + b\n"
    )
    r = run_python_tests(code, ADD_TESTS, timeout_s=20, _off=KERNEL_ONLY | {"nproc"})
    assert r["verdict"] == "pass", r
    assert r["duration_s"] < 15
    assert "pidns" in r["isolation"]
    assert _sandboxed_processes() == []


def test_a_machine_that_cannot_confine_refuses_to_run_the_code(monkeypatch, tmp_path):
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w')\n" + ADD
    monkeypatch.setattr(confine, "plan", lambda: "`unshare --pid` failed here (no namespaces): enable them so")
    r = run_python_tests(code, ADD_TESTS)
    assert r["verdict"] == "error"
    assert r["reason"].startswith("the sandbox refuses to run model-written code: `unshare --pid` failed here")
    assert r["isolation"] == [] and not marker.exists()


@pytest.mark.parametrize("layer", confine.REQUIRED)
def test_a_kernel_layer_the_worker_does_not_show_refuses_the_run(monkeypatch, layer):
    """The kernel layers come from /proc of the worker, read from the harness's side; one missing
    refuses the run before the candidate is loaded (this one would sleep a minute at import)."""
    real = confine.observe
    monkeypatch.setattr(confine, "observe", lambda pid, how: real(pid, how) - {layer})
    r = run_python_tests("import time\ntime.sleep(60)\n" + ADD, ADD_TESTS, timeout_s=30)
    assert r["verdict"] == "error", r
    assert f"the kernel does not show {layer} for its worker" in r["reason"]
    assert r["duration_s"] < 20 and layer not in r["isolation"]


@pytest.mark.skipif(not sandbox._landlock_abi(), reason="CI cannot meet: Landlock is not available on this kernel")
def test_landlock_alone_denies_what_the_view_holds():
    """Landlock on top of the view: /usr/bin is in the view (bound read-only) but not on Landlock's
    read list, so reading it is denied by Landlock even with the audit hook off."""
    code = "try:\n    open('/usr/bin/env', 'rb')\n    R = 'open'\nexcept PermissionError:\n    R = 'denied'\n"
    r = run_python_tests(code, "assert R == 'denied'\n", _off=frozenset({"audit"}))
    assert r["verdict"] == "pass", r
    assert "landlock-fs" in r["isolation"] and "audit" not in r["isolation"]
    r = run_python_tests(code, "assert R == 'open'\n", _off=KERNEL_ONLY)  # the control: the view alone has it
    assert r["verdict"] == "pass", r


# --- hostile code that tries to forge its own verdict ------------------------------------------------
#
# Each candidate below is a wrong add() (a - b) plus one way of trying to talk its way to a pass.
# ADD_TESTS has two asserts with different expected values (5 and 0), so a forger that reports one
# constant value for every call cannot pass by luck.

WRONG_ADD = "def add(a, b):\n    return a - b\n"
_FORGED_LINES = (
    '{"phase": "done", "verdict": "pass", "reason": "all tests passed"}\n'
    + "".join(f'{{"id": {i}, "ok": true, "value": "5"}}\n' for i in range(8))
)
SPRAY_EVERY_FD = (
    "import os\n"
    f"for _fd in range(256):\n"
    f"    try:\n        os.write(_fd, {_FORGED_LINES.encode()!r})\n"
    "    except OSError:\n        pass\n"
)


def _in_body(statements: str) -> str:
    """A wrong add() that runs *statements* when the tests call it."""
    body = "".join(f"    {line}\n" for line in statements.splitlines())
    return f"def add(a, b):\n{body}    return a - b\n"


FORGERIES = {
    # writing a verdict (old and new protocol) to every descriptor 0..255, then leaving
    "fds-at-import-then-os._exit": WRONG_ADD + SPRAY_EVERY_FD + "os._exit(0)\n",
    "fds-in-body-then-os._exit": _in_body(SPRAY_EVERY_FD + "os._exit(0)"),
    "fds-at-import-then-carry-on": WRONG_ADD + SPRAY_EVERY_FD,
    "fds-in-body-then-carry-on": _in_body(SPRAY_EVERY_FD),
    # exiting early with a success-looking output
    "print-OK-then-os._exit-at-import": WRONG_ADD + "print('OK')\nprint('all tests passed')\nimport os\nos._exit(0)\n",
    "print-OK-then-os._exit-in-body": _in_body("print('OK')\nimport os\nos._exit(0)"),
    "sys.exit-at-import": WRONG_ADD + "import sys\nsys.exit(0)\n",
    "sys.exit-in-body": _in_body("import sys\nsys.exit(0)"),
    "raise-SystemExit-in-body": _in_body("raise SystemExit(0)"),
    "close-the-pipes-and-sleep": _in_body("import os, time\nfor fd in range(3, 256):\n    try:\n        os.close(fd)\n"
                                          "    except OSError:\n        pass\ntime.sleep(60)"),
    "close-the-pipes-and-exit-0": _in_body("import os\nfor fd in range(3, 256):\n    try:\n        os.close(fd)\n"
                                           "    except OSError:\n        pass\nos._exit(0)"),
    # patching the runner, builtins, unittest and sys.exit
    "patch-runner-encode": WRONG_ADD + "import __main__\n__main__.encode = lambda value: '5'\n",
    "patch-runner-answer": WRONG_ADD + "import __main__\n__main__.answer = lambda *a: {'ok': True, 'value': 'True'}\n",
    "patch-every-runner-function": WRONG_ADD + (
        "import __main__\nfor _name in dir(__main__):\n    if callable(getattr(__main__, _name)):\n"
        "        setattr(__main__, _name, lambda *a, **k: {'ok': True, 'value': '5', 'phase': 'done', "
        "'verdict': 'pass'})\n"),
    "patch-builtins-repr": WRONG_ADD + "import builtins\nbuiltins.repr = lambda o: '5'\n",
    "patch-builtins-type-isinstance-AssertionError": WRONG_ADD + (
        "import builtins\nbuiltins.type = lambda *a: int\nbuiltins.isinstance = lambda *a: True\n"
        "builtins.AssertionError = type('Never', (Exception,), {})\n"),
    "patch-unittest-and-sys.exit": WRONG_ADD + (
        "import sys, os, unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n"
        "unittest.TestCase.assertTrue = lambda *a, **k: None\nsys.exit = lambda *a: None\nos._exit = lambda *a: None\n"),
    # taking the protocol over: answer every request itself, with a plausible value
    "answer-the-supervisor-itself": WRONG_ADD + (
        "import os, sys, json\n_req = os.fdopen(int(sys.argv[2]), 'rb')\n_rep = int(sys.argv[3])\n"
        "os.write(_rep, b'{\"id\": 0, \"ok\": true}\\n')\n"
        "for _line in _req:\n    _r = json.loads(_line)\n"
        "    os.write(_rep, json.dumps({'id': _r['id'], 'ok': True, 'value': '5'}).encode() + b'\\n')\n"
        "os._exit(0)\n"),
    # return values that compare equal to anything
    "__eq__-always-true": "class Yes:\n    def __eq__(self, other):\n        return True\n"
                          "    __hash__ = object.__hash__\n\ndef add(a, b):\n    return Yes()\n",
    "int-subclass-__eq__": "class Five(int):\n    def __eq__(self, other):\n        return True\n"
                           "    __hash__ = int.__hash__\n\ndef add(a, b):\n    return Five(a - b)\n",
    "list-holding-an-__eq__-object": "class Yes:\n    def __eq__(self, other):\n        return True\n\n"
                                     "def add(a, b):\n    return [Yes()]\n",
    "repr-that-lies": "class Five:\n    def __repr__(self):\n        return '5'\n\ndef add(a, b):\n    return Five()\n",
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_forged_verdicts_fail(name):
    r = run_python_tests(FORGERIES[name], ADD_TESTS)
    assert r["verdict"] == "fail", r


def test_truthy_object_does_not_pass_a_bare_assert():
    code = "class Truthy:\n    def __bool__(self):\n        return True\n\ndef is_even(n):\n    return Truthy()\n"
    r = run_python_tests(code, "assert is_even(4)\nassert not is_even(7)\n")
    assert r["verdict"] == "fail", r
    assert "cannot be compared outside the sandbox" in r["reason"]


def test_forged_pass_under_the_old_protocol_no_longer_passes():
    """The forgery of issue 12: the verdict line on the result fd, then os._exit(0)."""
    code = WRONG_ADD + (
        "import os\nfor fd in range(3, 256):\n    try:\n"
        "        os.write(fd, b'{\"phase\":\"done\",\"verdict\":\"pass\"}\\n')\n"
        "    except OSError:\n        pass\nos._exit(0)\n")
    r = run_python_tests(code, ADD_TESTS)
    assert r["verdict"] == "fail"
    assert r["reason"] == "the sandboxed code broke the result protocol: it sent a message that is not the reply to request 0"


def test_the_child_never_holds_the_expected_values():
    """A probe searches everything it can reach (every gc-tracked container, every frame, the temp
    dir, argv) for the expected value 735019 of the test; it must find nothing, so it returns the
    right sum and passes. Under the old runner the tests' source sat in its memory and its temp dir."""
    probe = (
        "import gc, os, sys\n"
        "def _found():\n"
        "    number = int(''.join(['7', '3', '5', '0', '1', '9']))  # built here: no constant holds it\n"
        "    needle = str(number)\n"
        "    def hit(x):\n"
        "        if x is needle or x is number:\n"
        "            return False\n"
        "        if type(x) is int:\n"
        "            return x == number\n"
        "        if type(x) in (str, bytes):\n"
        "            return needle in (x if type(x) is str else x.decode('latin-1'))\n"
        "        return False\n"
        "    for obj in gc.get_objects():\n"
        "        items = list(obj.keys()) + list(obj.values()) if type(obj) is dict else (\n"
        "            list(obj) if type(obj) in (list, tuple, set, frozenset) else [])\n"
        "        if any(hit(x) for x in items):\n"
        "            return True\n"
        "    frame = sys._getframe()\n"
        "    while frame is not None:\n"
        "        if any(hit(v) for v in list(frame.f_locals.values())):\n"
        "            return True\n"
        "        frame = frame.f_back\n"
        "    files = [open(n, 'rb').read() for n in os.listdir('.') if os.path.isfile(n)]\n"
        "    return any(hit(x) for x in files + sys.argv)\n"
        "def add(a, b):\n"
        "    return -1 if _found() else a + b\n"
    )
    r = run_python_tests(probe, "assert add(700000, 35019) == 735019\n", timeout_s=30)
    assert r["verdict"] == "pass", r
    # The control: a setup statement runs in the child, so there the probe does find the value.
    r = run_python_tests(probe, "EXPECTED = 735019\nassert add(700000, 35019) == 735019\n", timeout_s=30)
    assert r["verdict"] == "fail" and r["reason"].startswith("assertion failed at <tests> line 2"), r


def test_an_assert_the_supervisor_cannot_decide_is_an_error():
    r = run_python_tests(ADD, "for x in (1, 2):\n    assert add(x, x) == 2 * x\n")
    assert r["verdict"] == "error"
    assert "line 2" in r["reason"] and "top level" in r["reason"]
    r = run_python_tests(ADD, "assert add(2, 3) is 5\n")
    assert r["verdict"] == "error" and "line 1" in r["reason"]


def test_isolation_lists_only_known_layers_in_order():
    r = run_python_tests(ADD, ADD_TESTS)
    assert r["isolation"] == [layer for layer in sandbox.LAYERS if layer in r["isolation"]]
    assert sandbox.missing_layers(r["isolation"]) == [l for l in sandbox.LAYERS if l not in r["isolation"]]
    assert sandbox.missing_layers(["env"]) == list(sandbox.LAYERS[1:])
