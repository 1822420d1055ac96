"""Run untrusted, model-written Python (a function plus its unit tests) in a contained subprocess.

The validation stage executes code that a language model wrote. It never runs in the harness
process: :func:`run_python_tests` starts a fresh ``python -I -S`` child and layers these limits,
each applied where the platform allows it (the result's ``isolation`` list says which applied):

- ``env``: an environment built from nothing (PATH, LANG, HOME/TMPDIR = the temp dir). Nothing of
  the harness's environment is inherited, so no secrets; ``-I`` also makes Python ignore
  ``PYTHON*`` variables, the user site and the current directory.
- ``tmpdir``: a fresh temporary working directory, removed afterwards.
- ``rlimit``: RLIMIT_CPU (CPU seconds), RLIMIT_AS (address space), RLIMIT_FSIZE (largest file it may
  write), RLIMIT_NPROC (no new processes; not enforced by Linux for root), RLIMIT_CORE = 0.
- ``wall``: a wall-clock timeout; the child runs in its own session and the whole process group is
  SIGKILLed when the timeout expires.
- ``netns``: ``unshare -n`` (``-rn`` when not root) gives the child an empty network namespace.
- ``landlock-fs``: Linux Landlock (kernel >= 5.13) restricts the child to *reading* its Python
  installation and system libraries and to reading/writing its temp dir; everything else (the
  harness's files, ``/proc/<pid>/environ`` of other processes, the repo) is denied by the kernel.
  ``landlock-net`` (ABI >= 4) denies TCP bind/connect; ``landlock-scope`` (ABI >= 6) denies signals
  and abstract unix sockets outside the sandbox.
- ``audit``: a Python audit hook (PEP 578) and a patched ``socket`` module refuse network calls,
  subprocesses, ``ctypes``, writes outside the temp dir and reads under ``/proc``. It is the
  portable fallback and defence in depth; on its own it stops accidents, not a determined attacker.
- ``output``: stdout/stderr are drained through pipes into bounded buffers (``max_output_bytes``
  each); the rest is counted and dropped, never buffered.

Threat model: generated code that misbehaves by accident (loops forever, prints too much, touches
files or the network). For hostile code, run the whole pipeline in a VM or container.

Landlock is called through ``ctypes`` here because the child must apply it to itself after Python
has started and before the candidate runs; the syscall interface is small and stable
(https://docs.kernel.org/userspace-api/landlock.html).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

VERDICTS = ("pass", "fail", "timeout", "error")

#: Largest file the child may write (RLIMIT_FSIZE); a bigger write kills it with SIGXFSZ.
FILE_SIZE_LIMIT_BYTES = 16 << 20

# The code that runs inside the child, before the candidate. It reads its settings from argv:
#   runner.py <tmpdir> <result_fd> <candidate.py> <tests.py>
_RUNNER = r'''
import os, sys

TMP = os.path.realpath(sys.argv[1])
RESULT_FD = int(sys.argv[2])
CANDIDATE, TESTS = sys.argv[3], sys.argv[4]
applied = []


def _landlock():
    """Restrict this process with Landlock: read-only Python + system libs, read-write TMP."""
    import ctypes, sysconfig
    libc = ctypes.CDLL(None, use_errno=True)
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    abi = syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # CREATE_RULESET_VERSION
    if abi < 1:
        return []
    fs_all = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}.get(abi, (1 << 16) - 1)
    net = 3 if abi >= 4 else 0          # BIND_TCP | CONNECT_TCP: handled, never granted
    scoped = 3 if abi >= 6 else 0       # ABSTRACT_UNIX_SOCKET | SIGNAL
    attr = (ctypes.c_uint64 * 3)(fs_all, net, scoped)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    rfd = syscall(444, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if rfd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    READ_FILE, READ_DIR = 1 << 2, 1 << 3
    FILE_ONLY = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)  # rights valid on a file

    def allow(path, rights):
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if not os.path.isdir(path):
                rights &= FILE_ONLY
            rule = PathBeneath(rights & fs_all, fd)
            if syscall(445, rfd, 1, ctypes.byref(rule), 0) != 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
        finally:
            os.close(fd)

    ro = {sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix,
          "/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/share/zoneinfo", "/dev/urandom"}
    for key in ("stdlib", "platstdlib"):
        ro.add(sysconfig.get_paths().get(key, "/nonexistent"))
    for path in sorted(ro):
        allow(path, READ_FILE | READ_DIR)
    allow("/dev/null", (1 << 1) | READ_FILE)
    allow(TMP, fs_all)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if syscall(446, rfd, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    os.close(rfd)
    return ["landlock-fs"] + (["landlock-net"] if net else []) + (["landlock-scope"] if scoped else [])


if os.environ.get("PAIRBENCH_SANDBOX_LANDLOCK") == "1" and sys.platform == "linux":
    try:
        applied += _landlock()
    except (OSError, AttributeError) as exc:
        sys.stderr.write(f"pairbench sandbox: landlock not applied: {exc}\n")

import socket

def _refuse(*args, **kwargs):
    raise PermissionError("network access is disabled in the pairbench sandbox")

for _name in ("connect", "connect_ex", "bind", "sendto", "sendmsg"):
    setattr(socket.socket, _name, _refuse)
socket.create_connection = socket.getaddrinfo = socket.gethostbyname = _refuse

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_BLOCKED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
            "os.fork", "os.forkpty", "pty.", "ctypes.", "os.kill", "os.killpg", "signal.pthread_kill")
_PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
                "os.symlink", "os.link", "os.truncate", "os.utime", "shutil.rmtree", "shutil.move",
                "shutil.copyfile", "os.mkfifo", "os.mknod")


def _inside(path):
    try:
        real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return real == TMP or real.startswith(TMP + os.sep)


def _hook(event, args):
    if event.startswith(_BLOCKED):
        raise PermissionError(f"{event} is disabled in the pairbench sandbox")
    if event == "open":
        path, mode, flags = args
        if isinstance(path, int):
            return
        text = os.fsdecode(path)
        if os.path.realpath(text).startswith("/proc"):
            raise PermissionError(f"reading {text} is disabled in the pairbench sandbox")
        writing = (mode is not None and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
        if writing and not _inside(text):
            raise PermissionError(f"writing {text} (outside the sandbox temp dir) is disabled")
    elif event.startswith(_PATH_EVENTS):
        for arg in args:
            if isinstance(arg, (str, bytes, os.PathLike)) and not _inside(arg):
                raise PermissionError(f"{event} outside the sandbox temp dir is disabled")


if os.environ.get("PAIRBENCH_SANDBOX_AUDIT") == "1":
    sys.addaudithook(_hook)
    applied.append("audit")
result = os.fdopen(RESULT_FD, "w")
result.write(__import__("json").dumps({"phase": "ready", "isolation": applied}) + "\n")
result.flush()


def _finish(verdict, reason):
    result.write(__import__("json").dumps({"phase": "done", "verdict": verdict, "reason": reason}) + "\n")
    result.flush()
    os._exit(0)


def _where(exc):
    import traceback
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename in ("<candidate>", "<tests>")]
    if not frames:
        return ""
    f = frames[-1]
    if f.filename == "<candidate>" or not f.lineno:  # never quote the model's text (privacy)
        return f" at {f.filename} line {f.lineno}"
    line = (SOURCES[f.filename].splitlines() or [""])[f.lineno - 1].strip()
    return f" at {f.filename} line {f.lineno}: {line}"


SOURCES = {}
with open(CANDIDATE, encoding="utf-8") as fh:
    SOURCES["<candidate>"] = fh.read()
with open(TESTS, encoding="utf-8") as fh:
    SOURCES["<tests>"] = fh.read()
try:
    code = compile(SOURCES["<candidate>"], "<candidate>", "exec", dont_inherit=True)
except (SyntaxError, ValueError) as exc:
    _finish("fail", f"candidate does not compile: {type(exc).__name__}: {exc}")
try:
    tests = compile(SOURCES["<tests>"], "<tests>", "exec", dont_inherit=True)
except (SyntaxError, ValueError) as exc:
    _finish("error", f"the task's tests do not compile: {exc}")
namespace = {"__name__": "__candidate__", "__builtins__": __builtins__}
try:
    exec(code, namespace)
    exec(tests, namespace)
except AssertionError as exc:
    _finish("fail", "assertion failed" + _where(exc))
except MemoryError as exc:
    _finish("fail", "MemoryError (memory limit)" + _where(exc))
except SystemExit as exc:
    _finish("fail", f"candidate called exit({exc.code!r}) before the tests finished")
except BaseException as exc:
    _finish("fail", f"{type(exc).__name__}: {str(exc)[:120]}" + _where(exc))
_finish("pass", "all tests passed")
'''


@functools.lru_cache(maxsize=None)
def _unshare_prefix() -> tuple[str, ...]:
    """``unshare -n`` (or ``-rn`` for non-root) if this machine lets us make a network namespace."""
    exe = shutil.which("unshare")
    if exe is None or sys.platform != "linux":
        return ()
    prefix = (exe, "-n") if os.geteuid() == 0 else (exe, "-rn")
    try:
        # Probe under the same rlimits as a real run (RLIMIT_NPROC=0 must not break unshare).
        ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=10,
                            preexec_fn=_limits(5, 512 << 20)).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return prefix if ok else ()


@functools.lru_cache(maxsize=None)
def _landlock_abi() -> int:
    """The Landlock ABI version of this kernel (0 where there is none)."""
    if sys.platform != "linux":
        return 0
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        abi = libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except (OSError, AttributeError):
        return 0
    return max(int(abi), 0)


def _drain(stream, limit: int, sink: dict) -> None:
    """Read *stream* to EOF, keeping at most *limit* bytes and counting the rest."""
    kept = bytearray()
    total = 0
    while True:
        chunk = stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16)
        if not chunk:
            break
        total += len(chunk)
        room = limit - len(kept)
        if room > 0:
            kept += chunk[:room]
    sink["data"] = bytes(kept)
    sink["total"] = total


def _limits(cpu_s: int, mem_bytes: int):
    def apply() -> None:
        import resource

        def setlimit(name: str, soft: int, hard: int | None = None) -> None:
            which = getattr(resource, name, None)
            if which is None:
                return
            hard = soft if hard is None else hard
            _, cur_hard = resource.getrlimit(which)
            if cur_hard != resource.RLIM_INFINITY:  # an unprivileged process cannot raise it
                soft, hard = min(soft, cur_hard), min(hard, cur_hard)
            resource.setrlimit(which, (soft, hard))

        setlimit("RLIMIT_CPU", cpu_s, cpu_s + 1)  # SIGXCPU first, SIGKILL a second later
        setlimit("RLIMIT_AS", mem_bytes)
        setlimit("RLIMIT_FSIZE", FILE_SIZE_LIMIT_BYTES)
        setlimit("RLIMIT_CORE", 0)
        setlimit("RLIMIT_NPROC", 0)

    return apply


def run_python_tests(
    code: str,
    tests: str,
    *,
    timeout_s: float = 5.0,
    cpu_s: int = 5,
    mem_bytes: int = 512 << 20,
    max_output_bytes: int = 64 << 10,
    _audit: bool = True,
) -> dict:
    """Run *code* and then *tests* (plain asserts) in a contained child Python.

    Returns ``{"verdict": "pass"|"fail"|"timeout"|"error", "reason": str, "duration_s": float,
    "isolation": [str], "output_bytes": int, "output_truncated": bool}``. ``fail`` means the
    candidate did not compile, raised, failed an assertion or hit a resource limit other than
    time; ``timeout`` means the wall-clock or CPU-time limit; ``error`` means the sandbox itself
    could not run (never the candidate's fault). Never raises for anything the candidate does.
    """
    if not isinstance(code, str) or not isinstance(tests, str):
        raise TypeError("code and tests must be str")
    if timeout_s <= 0 or cpu_s <= 0 or mem_bytes <= 0 or max_output_bytes <= 0:
        raise ValueError("timeout_s, cpu_s, mem_bytes and max_output_bytes must be positive")

    tmp = tempfile.mkdtemp(prefix="pairbench-sandbox-")
    start = time.monotonic()
    proc = None
    try:
        tmp_path = Path(tmp)
        (tmp_path / "runner.py").write_text(_RUNNER)
        (tmp_path / "candidate.py").write_text(code)
        (tmp_path / "tests.py").write_text(tests)
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "HOME": tmp,
            "TMPDIR": tmp,
            "PAIRBENCH_SANDBOX_LANDLOCK": "1",
            # Tests switch the audit layer off to show that the kernel layer holds on its own.
            "PAIRBENCH_SANDBOX_AUDIT": "1" if _audit else "0",
        }
        result_r, result_w = os.pipe()
        prefix = _unshare_prefix()
        argv = [*prefix, sys.executable, "-I", "-S", str(tmp_path / "runner.py"), tmp,
                str(result_w), str(tmp_path / "candidate.py"), str(tmp_path / "tests.py")]
        try:
            proc = subprocess.Popen(
                argv, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, pass_fds=(result_w,), start_new_session=True,
                preexec_fn=_limits(cpu_s, mem_bytes),
            )
        except OSError as exc:
            os.close(result_r)
            os.close(result_w)
            return _result("error", f"could not start the sandbox: {exc}", start)
        os.close(result_w)
        sinks = {"out": {}, "err": {}, "res": {}}
        result_stream = os.fdopen(result_r, "rb")
        threads = [
            threading.Thread(target=_drain, args=(proc.stdout, max_output_bytes, sinks["out"]), daemon=True),
            threading.Thread(target=_drain, args=(proc.stderr, max_output_bytes, sinks["err"]), daemon=True),
            threading.Thread(target=_drain, args=(result_stream, 64 << 10, sinks["res"]), daemon=True),
        ]
        for t in threads:
            t.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_group(proc)
        proc.wait()
        for t in threads:
            t.join(timeout=5)
        for stream in (proc.stdout, proc.stderr, result_stream):
            stream.close()
        duration = time.monotonic() - start

        out_total = sinks["out"].get("total", 0) + sinks["err"].get("total", 0)
        truncated = (sinks["out"].get("total", 0) > max_output_bytes
                     or sinks["err"].get("total", 0) > max_output_bytes)
        messages = _parse_result(sinks["res"].get("data", b""))
        ready = next((m for m in messages if m.get("phase") == "ready"), None)
        done = next((m for m in messages if m.get("phase") == "done"), None)
        extra = {"isolation": (["env", "tmpdir", "rlimit", "wall", "output"]
                               + (["netns"] if prefix else [])
                               + (ready or {}).get("isolation", [])),
                 "output_bytes": out_total, "output_truncated": truncated}
        stderr_tail = sinks["err"].get("data", b"")[-300:].decode("utf-8", "replace").strip()

        if timed_out:
            verdict, reason = "timeout", f"wall-clock limit of {timeout_s:g} s exceeded"
        elif done is not None and done.get("verdict") in VERDICTS:
            verdict, reason = done["verdict"], str(done.get("reason", ""))
        elif proc.returncode < 0:
            sig = -proc.returncode
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            if sig in (signal.SIGXCPU, signal.SIGKILL):
                verdict, reason = "timeout", f"CPU-time limit of {cpu_s} s exceeded ({name})"
            elif sig == signal.SIGXFSZ:
                verdict, reason = "fail", f"file size limit of {FILE_SIZE_LIMIT_BYTES} bytes exceeded"
            else:
                verdict, reason = "fail", f"killed by {name}"
        elif ready is None:
            verdict, reason = "error", f"sandbox failed to start (exit {proc.returncode}): {stderr_tail}"
        else:
            verdict, reason = "fail", (f"candidate exited with status {proc.returncode} before the "
                                       "tests finished")
        if truncated:
            reason += f" (output truncated: {out_total} bytes, {max_output_bytes} kept per stream)"
        return {"verdict": verdict, "reason": reason, "duration_s": round(duration, 6), **extra}
    finally:
        if proc is not None and proc.poll() is None:
            _kill_group(proc)
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _parse_result(data: bytes) -> list[dict]:
    messages = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(msg, dict):
            messages.append(msg)
    return messages


def _result(verdict: str, reason: str, start: float) -> dict:
    return {"verdict": verdict, "reason": reason, "duration_s": round(time.monotonic() - start, 6),
            "isolation": [], "output_bytes": 0, "output_truncated": False}
