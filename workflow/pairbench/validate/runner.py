"""The program that runs inside the sandbox child: it confines itself, loads the candidate and
answers the supervisor's questions. It decides nothing.

:mod:`pairbench.validate.sandbox` starts it as ``unshare --pid --mount --net --ipc --uts -- python
-I -S runner.py <config JSON>`` (:mod:`pairbench.validate.confine`). It uses the standard library
only (``-I -S`` puts nothing else on the path; :mod:`pairbench.validate.jail` is loaded by path) and
is importable, so its pieces can be read and tested as code. It runs as three processes:

- the **keeper** (:func:`keeper`, the process ``unshare`` executes): builds the filesystem view in
  the new mount namespace (:func:`pairbench.validate.jail.enter`), forks the monitor and keeps none
  of the pipes;
- the **monitor** (:func:`monitor`), PID 1 of the new PID namespace: forks the worker, reaps, and
  reports on the status pipe (which only it holds) how the worker ended; its death ends the
  namespace;
- the **worker** (:func:`worker`), which runs the candidate.

What the worker does, in order:

1. **Contain itself**, before any model-written code exists in the process: the unprivileged user,
   no new privileges and the resource limits (:func:`pairbench.validate.jail.drop`, ``limit``),
   then Linux Landlock (:func:`landlock`), a patched ``socket`` module (:func:`refuse_network`) and
   a PEP 578 audit hook (:func:`audit_hook`). The in-process layers that applied go to the
   supervisor in the first message, ``{"phase": "ready", "isolation": [...]}``, so that report is
   written while the process is still the harness's own; the kernel's layers the supervisor reads
   from ``/proc`` itself.
2. **Answer requests**, one JSON line each way, in order (:func:`serve`):

   - ``{"id": 0, "op": "load"}``: compile and run ``candidate.py`` (the model's function);
   - ``{"id": k, "op": "exec", "source": ...}``: run one setup statement of the tests;
   - ``{"id": k, "op": "eval", "source": ...}``: evaluate one operand of one of the tests'
     assertions, e.g. ``add(2, 3)``.

   Replies are ``{"id": k, "ok": true}`` (plus ``"value"``: the value's ``repr`` for ``eval``), or
   ``{"id": k, "ok": false, ...}`` naming what the code raised (:func:`raised`) or why the value
   cannot leave the process (:func:`encode`).

Why it decides nothing: once the candidate has run, everything in this process (this module's
functions, ``builtins``, the reply pipe, whatever it was told) is the candidate's to change. So the
tests' expected values never come here, and the comparison, the verdict and the "all tests passed"
are made by the supervisor, in the harness process, from the plain values it reads back. A candidate
that rewrites this module can only change which values are reported for its own calls, which is
what a function does anyway. See docs/validation.md, "Threat model".

Landlock is called through ``ctypes`` because the child must apply it to itself after Python has
started and before the candidate runs; the syscall interface is small and stable
(https://docs.kernel.org/userspace-api/landlock.html).
"""

from __future__ import annotations

import builtins
import json
import math
import os
import sys

#: A value whose repr is longer than this is not sent back (the supervisor caps a reply, too).
MAX_VALUE_CHARS = 64 << 10
#: How deep a returned container may nest, and how many items it may hold in all.
MAX_DEPTH = 32
MAX_ITEMS = 10_000
#: The exact types a value may be made of to leave the process. Exact: a subclass (an ``int`` whose
#: ``__eq__`` always says True) could run code in the supervisor's comparison; these cannot.
PLAIN_TYPES = (type(None), bool, int, float, complex, str, bytes)
CONTAINER_TYPES = (list, tuple, set, dict)


# --- 1. containment ------------------------------------------------------------------------------


def landlock(tmp: str) -> list[str]:
    """Restrict this process with Landlock: read-only Python + system libs, read-write *tmp*.

    Returns the layers that applied (``landlock-fs``, and ``landlock-net`` / ``landlock-scope`` on
    kernels whose ABI has them); ``[]`` where the kernel has no Landlock. Raises OSError when a
    syscall that exists fails.
    """
    import ctypes
    import sysconfig

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

    read_file, read_dir = 1 << 2, 1 << 3
    file_only = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)  # rights valid on a file

    def allow(path: str, rights: int) -> None:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if not os.path.isdir(path):
                rights &= file_only
            rule = PathBeneath(rights & fs_all, fd)
            if syscall(445, rfd, 1, ctypes.byref(rule), 0) != 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
        finally:
            os.close(fd)

    ro = {sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix, "/usr/lib", "/usr/lib64", "/lib",
          "/lib64", "/usr/share/zoneinfo", "/etc/ld.so.cache", "/etc/localtime", "/dev/urandom", "/dev/zero"}
    for key in ("stdlib", "platstdlib"):
        ro.add(sysconfig.get_paths().get(key, "/nonexistent"))
    for path in sorted(ro):
        allow(path, read_file | read_dir)
    allow("/dev/null", (1 << 1) | read_file)
    allow(tmp, fs_all)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if syscall(446, rfd, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    os.close(rfd)
    return ["landlock-fs"] + (["landlock-net"] if net else []) + (["landlock-scope"] if scoped else [])


def refuse_network() -> None:
    """Make the ``socket`` module's connecting calls raise PermissionError (the audit hook also
    refuses ``socket.*`` events; the kernel layers hold without either)."""
    import socket

    def refuse(*args, **kwargs):
        raise PermissionError("network access is disabled in the pairbench sandbox")

    for name in ("connect", "connect_ex", "bind", "sendto", "sendmsg"):
        setattr(socket.socket, name, refuse)
    socket.create_connection = socket.getaddrinfo = socket.gethostbyname = refuse


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_BLOCKED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
            "os.fork", "os.forkpty", "pty.", "ctypes.", "os.kill", "os.killpg", "signal.pthread_kill")
_PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
                "os.symlink", "os.link", "os.truncate", "os.utime", "shutil.rmtree", "shutil.move",
                "shutil.copyfile", "os.mkfifo", "os.mknod")


def audit_hook(tmp: str):
    """A PEP 578 hook refusing network, subprocesses, ``ctypes``, signals to others, writes and
    removals outside *tmp* and reads under ``/proc``. Defence in depth: on its own it stops
    accidents, not a determined attacker (audit hooks are bypassable from inside the process). What
    it reads is bound into the closure when it is made, so rebinding this module's globals or
    ``os.path.realpath`` later changes nothing; the kernel's layers are the boundary."""
    blocked, path_events, write_flags = _BLOCKED, _PATH_EVENTS, _WRITE_FLAGS
    realpath, fsdecode, sep = os.path.realpath, os.fsdecode, os.sep

    def inside(path) -> bool:
        try:
            real = realpath(fsdecode(path))
        except (TypeError, ValueError):
            return False
        return real == tmp or real.startswith(tmp + sep)

    def hook(event: str, args: tuple) -> None:
        if event.startswith(blocked):
            raise PermissionError(f"{event} is disabled in the pairbench sandbox")
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int):
                return
            text = fsdecode(path)
            if realpath(text).startswith("/proc"):
                raise PermissionError(f"reading {text} is disabled in the pairbench sandbox")
            writing = (mode is not None and any(c in mode for c in "wax+")) or bool((flags or 0) & write_flags)
            if writing and not inside(text):
                raise PermissionError(f"writing {text} (outside the sandbox temp dir) is disabled")
        elif event.startswith(path_events):
            for arg in args:
                if isinstance(arg, (str, bytes, os.PathLike)) and not inside(arg):
                    raise PermissionError(f"{event} outside the sandbox temp dir is disabled")

    return hook


def contain(tmp: str, *, use_landlock: bool, use_audit: bool) -> list[str]:
    """Apply the in-process layers; returns the names of those that applied."""
    applied: list[str] = []
    if use_landlock and sys.platform == "linux":
        try:
            applied += landlock(tmp)
        except (OSError, AttributeError) as exc:
            sys.stderr.write(f"pairbench sandbox: landlock not applied: {exc}\n")
    refuse_network()
    if use_audit:
        sys.addaudithook(audit_hook(tmp))
        applied.append("audit")
    return applied


# --- 2. answering the supervisor -------------------------------------------------------------------


class Unrepresentable(Exception):
    """A value that cannot be handed to the supervisor as plain data."""


def _check_plain(value, depth: int, budget: list[int]) -> None:
    kind = type(value)
    budget[0] -= 1
    if budget[0] < 0:
        raise Unrepresentable(f"a container of more than {MAX_ITEMS} items")
    if kind in PLAIN_TYPES:
        if kind is float and math.isnan(value):
            raise Unrepresentable("float nan (never equal to anything)")
        return
    if kind not in CONTAINER_TYPES:
        raise Unrepresentable(f"{kind.__module__}.{kind.__qualname__}")
    if depth >= MAX_DEPTH:
        raise Unrepresentable(f"a container nested deeper than {MAX_DEPTH}")
    items = value.items() if kind is dict else ((x, None) for x in value)
    for key, item in items:
        _check_plain(key, depth + 1, budget)
        if kind is dict:
            _check_plain(item, depth + 1, budget)


def encode(value) -> str:
    """The ``repr`` of *value* if it is plain data (:data:`PLAIN_TYPES`, nested in lists, tuples,
    sets and dicts); raises :class:`Unrepresentable` naming the type otherwise. The supervisor reads
    it back with ``ast.literal_eval``, so an object's own ``__eq__``/``__bool__``/``__repr__`` never
    reaches the comparison."""
    _check_plain(value, 0, [MAX_ITEMS])
    text = repr(value)
    if len(text) > MAX_VALUE_CHARS:
        raise Unrepresentable(f"a value of {len(text)} characters (more than {MAX_VALUE_CHARS})")
    return text


def raised(exc: BaseException) -> dict:
    """The reply fields for an exception: its type, a short message, the candidate line it came from.

    Only the line number of ``<candidate>`` is given, never its text (privacy); the supervisor
    names the tests' line itself.
    """
    import traceback

    try:
        message = str(exc)[:120]
    except Exception:  # noqa: BLE001 -- the candidate's own __str__ may raise anything
        message = ""
    reply = {"ok": False, "raised": type(exc).__name__[:80], "message": message}
    if isinstance(exc, SystemExit):
        reply["exit_code"] = repr(exc.code)[:40]
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<candidate>"]
    if frames and frames[-1].lineno:
        reply["candidate_line"] = frames[-1].lineno
    if isinstance(exc, SyntaxError) and exc.filename == "<candidate>":
        reply["candidate_line"] = exc.lineno
    return reply


def answer(request: dict, namespace: dict, candidate_path: str) -> dict:
    """The reply to one request (``id`` added by the caller)."""
    op = request.get("op")
    try:
        if op == "load":
            with open(candidate_path, encoding="utf-8") as fh:
                source = fh.read()
            try:
                code = compile(source, "<candidate>", "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as exc:
                return {**raised(exc), "compile": True}
            exec(code, namespace)  # noqa: S102 -- running the candidate is this program's job
            return {"ok": True}
        source = request.get("source")
        if op not in ("exec", "eval") or not isinstance(source, str):
            return {"ok": False, "raised": "ProtocolError", "message": f"unknown request {op!r}"}
        value = eval(compile(source, "<tests>", op, dont_inherit=True), namespace)
        if op == "exec":
            return {"ok": True}
        try:
            return {"ok": True, "value": encode(value)}
        except Unrepresentable as exc:
            return {"ok": False, "unrepresentable": str(exc)}
    except BaseException as exc:  # noqa: BLE001 -- SystemExit and KeyboardInterrupt too: reported, never obeyed
        return raised(exc)


def serve(requests, replies, namespace: dict, candidate_path: str) -> None:
    """Answer each request line from *requests* on *replies* until the supervisor closes the pipe."""
    while True:
        line = requests.readline()
        if not line:
            return
        try:
            request = json.loads(line)
            rid = request["id"]
        except (ValueError, KeyError, TypeError):
            return
        reply = {"id": rid, **answer(request, namespace, candidate_path)}
        replies.write(json.dumps(reply).encode() + b"\n")
        replies.flush()


def _load_jail():
    """:mod:`pairbench.validate.jail`, loaded by path: ``-I -S`` puts nothing of pairbench on the path."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("pairbench_sandbox_jail", os.path.join(here, "jail.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _report(fd: int, message: dict) -> None:
    """One JSON line on the monitor's status pipe (the worker never holds it)."""
    try:
        os.write(fd, json.dumps(message).encode() + b"\n")
    except OSError:
        pass


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def keeper(cfg: dict) -> None:
    """The process ``unshare`` started, in the new mount (and network, IPC, UTS) namespace but not
    itself in the new PID namespace: enter the jail, then fork the namespace's PID 1 (the
    monitor) and keep none of the conversation's descriptors, so that the worker alone holds its
    end of each pipe (a worker that closes its reply pipe is seen at once)."""
    status = cfg["status_fd"]
    jail = _load_jail()
    try:
        jail.enter(cfg["tmp"])
    except OSError as exc:
        _report(status, {"error": f"could not build the sandbox's filesystem view: {exc}"})
        os._exit(70)
    pid = os.fork()
    if pid == 0:
        monitor(cfg, jail)  # never returns
    _close(status, cfg["request_fd"], cfg["reply_fd"], 0, 1, 2)
    os.waitpid(pid, 0)
    os._exit(0)


def monitor(cfg: dict, jail) -> None:
    """PID 1 of the sandbox's PID namespace: start the worker, reap until it is done, and tell the
    supervisor how it ended on the status pipe, which the worker never holds. Runs no code of the
    candidate's; when it exits, the kernel kills every process left in the namespace."""
    status = cfg["status_fd"]
    if os.getpid() != 1:
        _report(status, {"error": "the sandbox's monitor is not PID 1 of its own PID namespace"})
        os._exit(70)
    if jail._c().prctl(jail.PR_SET_PDEATHSIG, 9, 0, 0, 0) != 0:  # the keeper killed: this namespace ends
        _report(status, {"error": "prctl(PR_SET_PDEATHSIG) failed"})
        os._exit(70)
    worker_pid = os.fork()
    if worker_pid == 0:
        os.close(status)
        worker(cfg, jail)  # never returns
    _close(cfg["request_fd"], cfg["reply_fd"], 0, 1, 2)
    while True:  # reap everything (orphans are re-parented here) until the worker itself is done
        try:
            pid, wstatus = os.wait()
        except ChildProcessError:
            os._exit(70)
        if pid == worker_pid:
            break
    if os.WIFSIGNALED(wstatus):
        _report(status, {"signal": os.WTERMSIG(wstatus)})
    else:
        _report(status, {"exit": os.WEXITSTATUS(wstatus)})
    os._exit(0)


def worker(cfg: dict, jail) -> None:
    """Drop to the unprivileged user, set the limits, contain the interpreter, say ready, serve."""
    try:
        jail.drop(cfg["uid"], cfg["gid"])
        # nproc False (tests only) lets the candidate fork, to show that the PID namespace ends it all
        jail.limit(cfg["cpu_s"], cfg["mem_bytes"], cfg["fsize_bytes"], nproc=cfg["nproc"])
    except OSError as exc:
        sys.stderr.write(f"pairbench sandbox: could not drop privileges: {exc}\n")
        os._exit(70)
    tmp = jail.SANDBOX_DIR
    os.environ.update({"HOME": tmp, "TMPDIR": tmp})
    applied = contain(tmp, use_landlock=cfg["landlock"], use_audit=cfg["audit"])
    requests = os.fdopen(cfg["request_fd"], "rb")
    replies = os.fdopen(cfg["reply_fd"], "wb")
    replies.write(json.dumps({"phase": "ready", "isolation": applied}).encode() + b"\n")
    replies.flush()
    namespace = {"__name__": "__candidate__", "__builtins__": builtins}
    serve(requests, replies, namespace, os.path.join(tmp, "candidate.py"))
    os._exit(0)  # no interpreter teardown: nothing the candidate registered (atexit, __del__) runs


def main(argv: list[str]) -> None:
    keeper(json.loads(argv[1]))


if __name__ == "__main__":
    main(sys.argv)
