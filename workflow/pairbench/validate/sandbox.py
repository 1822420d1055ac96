"""Run untrusted, model-written Python (a function plus its tests) in a contained child process,
and decide the verdict outside it.

The validation stage executes code that a language model wrote. It never runs in the harness
process. :func:`run_python_tests` is a *supervisor*: it starts a fresh, confined ``python -I -S`` child
running :mod:`pairbench.validate.runner`, asks it to load the candidate and to evaluate, one by one, the
operands of the tests' assertions (``add(2, 3)``), and compares what comes back with the expected
values (``5``) itself (:mod:`pairbench.validate.assertions`). The expected values never enter the
child; the child's replies are plain data read with ``ast.literal_eval``; only the supervisor
says ``pass``.

The child gets these layers; the result's ``isolation`` lists those that applied, in the order of
:data:`LAYERS`. The kernel's come first and are required: a machine that cannot give them refuses
to run model-written code (verdict ``error``, saying how to enable them), never runs it unconfined.

- ``env``: an environment built from nothing (PATH, LANG; HOME/TMPDIR = /sandbox). Nothing of the
  harness's environment is inherited, so no secrets; ``-I`` also makes Python ignore ``PYTHON*``
  variables, the user site and the current directory.
- ``tmpdir``: a fresh temporary directory whose ``work/`` (the sandbox's ``/sandbox``) holds only
  ``candidate.py``, removed afterwards.
- ``user``, ``pidns``, ``mountns``, ``netns`` (:mod:`pairbench.validate.confine`,
  :mod:`pairbench.validate.jail`): ``unshare`` gives the child its own PID, mount, network, IPC and
  UTS namespaces; PID 1 there (the *monitor*) builds a read-only root holding only the system's and
  Python's files and ``/sandbox``, then forks the *worker*, which becomes ``nobody`` (when the
  harness runs as root; otherwise the harness's own user in a user namespace, every capability
  dropped), with no new privileges, before the candidate exists. Killing the keeper's process group
  kills PID 1, and with it every process of the namespace, whatever session the candidate moved
  them to. These four are read by the supervisor from ``/proc`` of the worker (uids, capabilities,
  NoNewPrivs, namespace ids), never taken from the child's word.
- ``rlimit``: RLIMIT_CPU (CPU seconds), RLIMIT_AS (address space), RLIMIT_FSIZE (largest file),
  RLIMIT_CORE = 0 and RLIMIT_NPROC = 0 (no process, no thread: enforced, since the worker is not
  root), set by the worker on itself before the candidate exists and read back from ``/proc``.
- ``wall``: a wall-clock deadline over the whole conversation; the namespace is killed at the end,
  whatever happened.
- ``output``: stdout/stderr are drained through pipes into bounded buffers (``max_output_bytes``
  each); the rest is counted and dropped, never buffered. Nothing printed is ever read as a result.
- ``landlock-fs``: Linux Landlock (kernel >= 5.13) restricts the worker further, inside that view,
  to *reading* its Python installation and system libraries and reading/writing /sandbox
  (``landlock-net``, ABI >= 4: no TCP bind/connect; ``landlock-scope``, ABI >= 6: no signals or
  abstract unix sockets outside it). Where the kernel has no Landlock these are missing and the
  report says so; the namespaces hold without them.
- ``audit``: a Python audit hook (PEP 578) and a patched ``socket`` module refuse network calls,
  subprocesses, ``ctypes``, writes outside /sandbox and reads under ``/proc``. Defence in depth:
  on its own it stops accidents, not a determined attacker.

How the child ended comes from the monitor on a status pipe that the worker never holds (its exit
status or signal), so the worker cannot forge it either.

Threat model. The candidate is treated as hostile code that wants a ``pass`` it did not earn.
Anything inside the child is the candidate's: once it has run it can rewrite the runner, builtins
and ``sys.exit``, write anything to any descriptor it holds (the reply pipe included), print "OK",
exit 0 or return an object whose ``__eq__`` always says True. None of that decides the verdict: the
supervisor reads only replies to its own requests, in order, one per request, of bounded size;
anything else on the pipe, an early exit, a closed pipe or a value that is not plain data is a
``fail`` (a limit is a ``timeout``), and a pass needs every assertion to hold on values compared
here. What stays possible, and what no black-box test can rule out: a candidate that returns the
right answers for the tested inputs only (the task catalogue is public, so it could know them), and
one that makes itself fail or time out (a timeout can earn a re-measurement, never a pass). The
containment layers guard the machine, not the verdict: the harness's files (the catalogue's
expected values among them) are not in the worker's view of the filesystem at all. The kernel, Python itself and the layers above are trusted; a kernel exploit
is out of scope (for that, run the whole pipeline in a VM).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pairbench.validate import assertions, confine, runner

VERDICTS = ("pass", "fail", "timeout", "error")

#: Every isolation layer this sandbox knows, in the order a result lists them.
LAYERS = ("env", "tmpdir", "rlimit", "wall", "output", "user", "pidns", "mountns", "netns", "landlock-fs",
          "landlock-net", "landlock-scope", "audit")

#: What tests may switch off (``_off``) to show that the layers left hold on their own.
TEST_SWITCHES = frozenset({"audit", "landlock", "nproc"})

#: Largest file the child may write (RLIMIT_FSIZE); a bigger write fails (Python ignores SIGXFSZ).
FILE_SIZE_LIMIT_BYTES = 16 << 20

#: Largest reply line the supervisor reads (a value's repr is capped lower, escaped into JSON).
MAX_MESSAGE_BYTES = 256 << 10

RUNNER = Path(runner.__file__)

#: How long a child whose reply pipe closed may take to exit before it counts as having closed it.
_EXIT_GRACE_S = 2.0

PLAIN_DATA = "None, bool, int, float, complex, str, bytes, and tuples, lists, sets and dicts of them"


def missing_layers(applied) -> list[str]:
    """The :data:`LAYERS` not in *applied*, in order."""
    return [layer for layer in LAYERS if layer not in set(applied)]


@functools.cache
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



# --- the conversation with the child ---------------------------------------------------------------


class _Gone(Exception):
    """The child closed its reply pipe (it exited, was killed, or closed the descriptor)."""


class _Deadline(Exception):
    """The wall-clock deadline passed."""


class _Broken(Exception):
    """The child sent something that is not the reply to the request in flight."""


class _Failed(Exception):
    """The candidate failed a step; the message is the reason."""


class _Channel:
    """One JSON line each way with the child, every wait bounded by *deadline* (``time.monotonic``).

    Only the reply to the request in flight is accepted: a line before any request, a second line,
    a reply with another id or of more than :data:`MAX_MESSAGE_BYTES` is :class:`_Broken`.
    """

    def __init__(self, send_fd: int, recv_fd: int, deadline: float):
        self.send_fd, self.recv_fd, self.deadline = send_fd, recv_fd, deadline
        os.set_blocking(send_fd, False)
        os.set_blocking(recv_fd, False)
        self.buffer = b""
        self.next_id = 0

    def _wait(self, read: bool) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Deadline()
        r, w, _ = select.select([self.recv_fd] if read else [], [] if read else [self.send_fd], [], left)
        if not (r or w):
            raise _Deadline()

    def send(self, message: dict) -> None:
        data = json.dumps(message).encode() + b"\n"
        while data:
            self._wait(read=False)
            try:
                data = data[os.write(self.send_fd, data):]
            except BlockingIOError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                raise _Gone() from None

    def recv(self) -> dict:
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_MESSAGE_BYTES:
                raise _Broken(f"a reply longer than {MAX_MESSAGE_BYTES} bytes")
            self._wait(read=True)
            try:
                chunk = os.read(self.recv_fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                raise _Gone()
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        if self.buffer:
            raise _Broken("more than one message at once")
        try:
            message = json.loads(line)
        except (UnicodeDecodeError, ValueError):
            raise _Broken("a line that is not JSON") from None
        if not isinstance(message, dict):
            raise _Broken("a message that is not a JSON object")
        return message

    def call(self, request: dict) -> dict:
        rid, self.next_id = self.next_id, self.next_id + 1
        self.send({"id": rid, **request})
        reply = self.recv()
        if reply.get("id") != rid or type(reply.get("ok")) is not bool:
            raise _Broken(f"a message that is not the reply to request {rid}")
        return reply

    def close(self) -> None:
        """Close both ends, once (a second close could hit a descriptor number reused meanwhile)."""
        for fd in (self.send_fd, self.recv_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.send_fd = self.recv_fd = -1


def _text(value, limit: int) -> str:
    """A child-supplied string, truncated and stripped of control characters (else empty)."""
    if not isinstance(value, str):
        return ""
    return "".join(c if c.isprintable() else " " for c in value[:limit])


def _raised_reason(reply: dict, step: assertions.Step | None) -> str:
    """The reason for a step the child reports as raised: type, message, where (never the candidate's text)."""
    name, message = _text(reply.get("raised"), 80) or "an exception", _text(reply.get("message"), 120)
    line = reply.get("candidate_line")
    if type(line) is int and line > 0:
        where = f" at <candidate> line {line}"
    elif step is not None:
        where = f" at <tests> line {step.line}: {step.text}"
    else:
        where = ""
    if name == "SystemExit":
        return f"candidate called exit({_text(reply.get('exit_code'), 40)}) before the tests finished"
    if name == "AssertionError":
        return "assertion failed" + where
    if name == "MemoryError":
        return "MemoryError (memory limit)" + where
    return f"{name}: {message}{where}"


def _ask(channel: _Channel, node: ast.expr, step: assertions.Step):
    """The plain value of *node*, evaluated by the child; :class:`_Failed` if it raised or sent no
    plain value."""
    source = ast.unparse(node)
    reply = channel.call({"op": "eval", "source": source})
    if not reply["ok"]:
        if "unrepresentable" in reply:
            raise _Failed(f"`{source}` at <tests> line {step.line} gave a {_text(reply['unrepresentable'], 120)}, "
                          f"which cannot be compared outside the sandbox (plain data only: {PLAIN_DATA})")
        raise _Failed(_raised_reason(reply, step))
    try:
        return assertions.decode(reply.get("value"))
    except ValueError as exc:
        raise _Failed(f"the value of `{source}` at <tests> line {step.line} could not be read back: {exc} "
                      f"(plain data only: {PLAIN_DATA})") from None


def _converse(channel: _Channel, steps: list[assertions.Step]) -> tuple[str, str]:
    """Load the candidate, then run every step; the verdict, decided here from the replies."""
    reply = channel.call({"op": "load"})
    if not reply["ok"]:
        if reply.get("compile") is True:
            return "fail", (f"candidate does not compile: {_text(reply.get('raised'), 80)}: "
                            f"{_text(reply.get('message'), 120)}")
        return "fail", _raised_reason(reply, None)
    for step in steps:
        if step.kind == "exec":
            reply = channel.call({"op": "exec", "source": step.source})
            if not reply["ok"]:
                return "fail", _raised_reason(reply, step)
            continue
        try:
            held = assertions.holds(step.test, lambda node, step=step: _ask(channel, node, step))
        except _Failed as exc:
            return "fail", str(exc)
        except TypeError as exc:  # comparing incompatible plain values, as the assert itself would fail
            return "fail", f"TypeError: {_text(str(exc), 120)} at <tests> line {step.line}: {step.text}"
        if not held:
            return "fail", f"assertion failed at <tests> line {step.line}: {step.text}"
    return "pass", "all tests passed"


def _exit_verdict(status: dict, rc: int | None, started: bool, cpu_s: int, stderr_tail: str) -> tuple[str, str]:
    """The verdict for a worker that closed its reply pipe before the conversation ended, from what
    the monitor reported on its status pipe (*status*; the keeper's exit status *rc* when the monitor
    said nothing, e.g. it was killed)."""
    if "error" in status:
        return "error", f"sandbox failed to start: {_text(status['error'], 300)}"
    sig = status.get("signal")
    if sig is None and rc is not None and rc < 0 and "exit" not in status:
        sig = -rc
    if isinstance(sig, int):
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return "timeout", f"CPU-time limit of {cpu_s} s exceeded ({name})"
        if sig == signal.SIGXFSZ:
            return "fail", f"file size limit of {FILE_SIZE_LIMIT_BYTES} bytes exceeded"
        return "fail", f"killed by {name}"
    code = status.get("exit", rc)
    if not started:
        return "error", f"sandbox failed to start (exit {code}): {stderr_tail}"
    return "fail", f"candidate exited with status {code} before the tests finished"


def run_python_tests(
    code: str,
    tests: str,
    *,
    timeout_s: float = 5.0,
    cpu_s: int = 5,
    mem_bytes: int = 512 << 20,
    max_output_bytes: int = 64 << 10,
    _off: frozenset[str] = frozenset(),
) -> dict:
    """Run *code*, then check *tests* (plain asserts; see :mod:`pairbench.validate.assertions`)
    against it in a contained child Python.

    Returns ``{"verdict": "pass"|"fail"|"timeout"|"error", "reason": str, "duration_s": float,
    "isolation": [str], "output_bytes": int, "output_truncated": bool}``. ``pass`` means every
    assertion held, compared here; ``fail`` means the candidate did not compile, raised, failed or
    could not be checked on an assertion, broke the result protocol, exited early or hit a resource
    limit other than time; ``timeout`` means the wall-clock or CPU-time limit; ``error`` means the
    sandbox itself could not run (this machine cannot confine the code: the reason says how to
    enable it; the code never ran) or the tests cannot be checked (never the candidate's doing).
    Never raises for anything the candidate does; TypeError/ValueError for bad arguments.
    *_off* is for tests only: layers (:data:`TEST_SWITCHES`) to leave out, to show the rest hold.
    """
    if not isinstance(code, str) or not isinstance(tests, str):
        raise TypeError("code and tests must be str")
    if timeout_s <= 0 or cpu_s <= 0 or mem_bytes <= 0 or max_output_bytes <= 0:
        raise ValueError("timeout_s, cpu_s, mem_bytes and max_output_bytes must be positive")
    if not set(_off) <= TEST_SWITCHES:
        raise ValueError(f"_off: unknown switches {sorted(set(_off) - TEST_SWITCHES)}")
    start = time.monotonic()
    try:
        steps = assertions.plan(tests)
    except SyntaxError as exc:
        return _result("error", f"the task's tests do not compile: {exc}", start)
    except assertions.TestsError as exc:
        return _result("error", f"the task's tests cannot be checked outside the sandbox: {exc}", start)
    how = confine.plan()
    if isinstance(how, str):
        return _result("error", f"the sandbox refuses to run model-written code: {how}", start)

    tmp = tempfile.mkdtemp(prefix="pairbench-sandbox-")
    try:
        return _supervise(code, steps, tmp, start, how, _Limits(timeout_s, cpu_s, mem_bytes, max_output_bytes),
                          frozenset(_off))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class _Limits:
    timeout_s: float
    cpu_s: int
    mem_bytes: int
    max_output_bytes: int


def _prepare(tmp: str, code: str, how: confine.Plan) -> None:
    """``tmp/work`` (the sandbox's /sandbox, the worker's own) holding candidate.py, and ``tmp/root``
    (where the jail mounts its root)."""
    work = Path(tmp) / "work"
    work.mkdir(mode=0o700)
    (work / "candidate.py").write_text(code)
    (work / "candidate.py").chmod(0o644)
    (Path(tmp) / "root").mkdir(mode=0o755)
    if how.uid is not None:
        os.chown(work, how.uid, how.gid)


def _start(tmp: str, how: confine.Plan, limits: _Limits, off: frozenset[str]):
    """Start the child: the process, and the supervisor's ends of the request, reply and status pipes."""
    request_r, request_w = os.pipe()
    reply_r, reply_w = os.pipe()
    status_r, status_w = os.pipe()
    cfg = {"tmp": tmp, "request_fd": request_r, "reply_fd": reply_w, "status_fd": status_w, "uid": how.uid,
           "gid": how.gid, "cpu_s": limits.cpu_s, "mem_bytes": limits.mem_bytes, "fsize_bytes": FILE_SIZE_LIMIT_BYTES,
           "landlock": "landlock" not in off, "audit": "audit" not in off, "nproc": "nproc" not in off}
    argv = [*how.prefix, sys.executable, "-I", "-S", str(RUNNER), json.dumps(cfg)]
    try:
        proc = subprocess.Popen(argv, cwd=tmp, env=_child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, pass_fds=(request_r, reply_w, status_w), start_new_session=True)
    except (OSError, subprocess.SubprocessError):
        for fd in (request_r, request_w, reply_r, reply_w, status_r, status_w):
            os.close(fd)
        raise
    for fd in (request_r, reply_w, status_w):
        os.close(fd)
    return proc, request_w, reply_r, status_r


def _supervise(code: str, steps: list[assertions.Step], tmp: str, start: float, how: confine.Plan, limits: _Limits,
               off: frozenset[str]) -> dict:
    """Start the child in *tmp* with *code* as its candidate, hold the conversation and return the
    result; the child's whole process group, and with it its PID namespace, is killed on the way out,
    whatever happened."""
    proc = channel = None
    try:
        _prepare(tmp, code, how)
        try:
            proc, request_w, reply_r, status_r = _start(tmp, how, limits, off)
        except (OSError, subprocess.SubprocessError) as exc:
            return _result("error", f"could not start the sandbox: {exc}", start)
        sinks = {"out": {}, "err": {}, "status": {}}
        streams = ((proc.stdout, limits.max_output_bytes, sinks["out"]), (proc.stderr, limits.max_output_bytes,
                   sinks["err"]), (os.fdopen(status_r, "rb"), 4096, sinks["status"]))
        threads = [threading.Thread(target=_drain, args=args, daemon=True) for args in streams]
        for t in threads:
            t.start()
        channel = _Channel(request_w, reply_r, deadline=start + limits.timeout_s)
        verdict, reason, ready, layers = _hold_conversation(channel, steps, proc, how, threads, sinks, limits, off)
        _kill_group(proc)
        proc.wait()
        channel.close()
        for t in threads:  # the PID namespace is gone with its PID 1: every pipe writer has exited
            t.join(timeout=5)
        duration = time.monotonic() - start
        return _outcome(verdict, reason, duration, ready, layers, sinks, limits.max_output_bytes)
    finally:
        if channel is not None:
            channel.close()
        if proc is not None and proc.poll() is None:
            _kill_group(proc)
            proc.wait()


def _child_env() -> dict[str, str]:
    """The child's whole environment, built from nothing (the ``env`` layer); the worker sets HOME
    and TMPDIR to its own directory."""
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def _worker_pid(proc: subprocess.Popen) -> int | None:
    """The worker's pid as this side sees it: the keeper's child (the monitor, PID 1 inside) has one
    child, the worker."""
    for monitor in confine.children(proc.pid):
        for worker in confine.children(monitor):
            return worker
    return None


def _hold_conversation(channel: _Channel, steps: list[assertions.Step], proc: subprocess.Popen, how: confine.Plan,
                       threads: list[threading.Thread], sinks: dict, limits: _Limits,
                       off: frozenset[str]) -> tuple[str, str, dict | None, set[str]]:
    """Wait for the worker's 'ready', check what the kernel shows it became, then converse; the
    verdict, its reason, the first message (None if none came) and the kernel layers observed."""
    ready, layers = None, set()
    try:
        ready = channel.recv()
        if ready.get("phase") != "ready":
            raise _Broken("a first message that is not 'ready'")
        worker = _worker_pid(proc)
        layers = confine.observe(worker, how) if worker is not None else set()
        missing = [x for x in confine.REQUIRED if x not in layers]
        if "nproc" not in off and "rlimit" not in layers:
            missing.append("rlimit")
        if missing:
            return ("error", f"the sandbox refuses to run model-written code: the kernel does not show "
                             f"{', '.join(missing)} for its worker ({confine.HOW_TO_ENABLE})", ready, layers)
        verdict, reason = _converse(channel, steps)
    except _Deadline:
        verdict, reason = "timeout", f"wall-clock limit of {limits.timeout_s:g} s exceeded"
    except _Broken as exc:
        verdict, reason = ("fail", f"the sandboxed code broke the result protocol: it sent {exc}") \
            if ready is not None else ("error", f"sandbox failed to start: it sent {exc}")
    except _Gone:
        verdict, reason = _gone_verdict(proc, ready is not None, channel.deadline, limits.cpu_s, threads, sinks)
    return verdict, reason, ready, layers


def _gone_verdict(proc: subprocess.Popen, started: bool, deadline: float, cpu_s: int,
                  threads: list[threading.Thread], sinks: dict) -> tuple[str, str]:
    """The verdict once the worker's reply pipe closed. Only the worker holds its end, so the pipe
    closes as it exits; a worker whose monitor has not reported it gone a moment later (the
    keeper then exits too) closed the pipe itself."""
    try:
        proc.wait(timeout=min(max(deadline - time.monotonic(), 0.05), _EXIT_GRACE_S))
    except subprocess.TimeoutExpired:
        return "fail", "the sandboxed code closed the result pipe before the tests finished"
    threads[2].join(timeout=1)  # the status pipe: its only writer, the monitor, has exited
    threads[1].join(timeout=1)  # stderr is complete once every process of the namespace is gone
    status = {}
    for line in sinks["status"].get("data", b"").splitlines()[:1]:
        try:
            status = json.loads(line)
        except ValueError:
            status = {}
    tail = sinks["err"].get("data", b"")[-300:].decode("utf-8", "replace").strip()
    return _exit_verdict(status if isinstance(status, dict) else {}, proc.returncode, started, cpu_s, tail)


def _outcome(verdict: str, reason: str, duration: float, ready: dict | None, kernel: set[str], sinks: dict,
             max_output_bytes: int) -> dict:
    """The result of a conversation that took place: the output counts, and the layers that applied
    (the kernel's as observed from here; the in-process ones as the worker reported them in its
    first message, sent before the candidate existed in it)."""
    out_total = sinks["out"].get("total", 0) + sinks["err"].get("total", 0)
    truncated = (sinks["out"].get("total", 0) > max_output_bytes
                 or sinks["err"].get("total", 0) > max_output_bytes)
    child_layers = (ready or {}).get("isolation")
    child_layers = {x for x in child_layers if isinstance(x, str)} if isinstance(child_layers, list) else set()
    applied = {"env", "tmpdir", "wall", "output"} | (kernel & {"user", "pidns", "mountns", "netns", "rlimit"})
    applied |= child_layers & {"landlock-fs", "landlock-net", "landlock-scope", "audit"}
    if truncated:
        reason += f" (output truncated: {out_total} bytes, {max_output_bytes} kept per stream)"
    return {"verdict": verdict, "reason": reason, "duration_s": round(duration, 6),
            "isolation": [layer for layer in LAYERS if layer in applied],
            "output_bytes": out_total, "output_truncated": truncated}


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the keeper's process group: the keeper and the monitor (PID 1 of the sandbox's PID
    namespace, which never leaves the group), so the kernel kills every process in the namespace,
    whichever session or group the candidate moved them to."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _result(verdict: str, reason: str, start: float) -> dict:
    return {"verdict": verdict, "reason": reason, "duration_s": round(time.monotonic() - start, 6),
            "isolation": [], "output_bytes": 0, "output_truncated": False}
