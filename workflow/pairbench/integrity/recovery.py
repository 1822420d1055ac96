"""Crash hygiene for server-launching jobs: pid files, stale-server sweep, and dying with Snakemake.

A visit (or warmup) launches an engine server in its own process group. Three things make sure no
server outlives the job that started it, whatever kills what:

1. **Pid file** (:func:`record_server`): ``private/servers/<slot>.json`` holds the server's pid,
   process group, start time and argv while it runs, and is removed when it stops. Visits never
   run two at a time, so they all share the slot ``measure``; each warmup has its own slot.
2. **Stale sweep** (:func:`kill_stale`): before a job launches its server it kills whatever server
   the slot's pid file names, if that exact process (same pid *and* start time, so a recycled pid is
   never hit) is still alive, and removes the file. A server orphaned by a SIGKILLed job is gone by
   the next start at the latest.
3. **Parent-death signal** (:func:`die_with_parent`, a ``preexec_fn``): the kernel SIGKILLs the server
   when the process that launched it dies, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``).

And the job itself must not outlive Snakemake: when Snakemake is SIGKILLed its running job is
orphaned and would go on measuring (and maybe write its artifact) while the rerun redoes the same
visit. :class:`SnakemakeWatchdog` polls the Snakemake process that started the job and, once it is
gone, runs a cleanup (stop the server) and ends the job without writing anything; the rerun's
``--rerun-incomplete`` redoes the visit.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import psutil

from pairbench.core.artifacts import atomic_write_text

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` for a server: SIGKILL it when its parent dies (Linux; a no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def pid_file(private_dir: str | Path, slot: str) -> Path:
    return Path(private_dir) / "servers" / f"{slot}.json"


def record_server(path: str | Path, pid: int, argv: list[str], owner: str) -> None:
    """Atomically write the pid file of a just-launched server (its own process group leader)."""
    proc = psutil.Process(pid)
    atomic_write_text(path, json.dumps({
        "pid": pid, "pgid": os.getpgid(pid), "create_time": proc.create_time(),
        "argv": list(argv), "owner": owner, "owner_pid": os.getpid(),
    }, sort_keys=True) + "\n")


def forget_server(path: str | Path) -> None:
    try:
        Path(path).unlink()
    except FileNotFoundError:
        pass


def _same_process(info: dict) -> psutil.Process | None:
    try:
        proc = psutil.Process(int(info["pid"]))
        if abs(proc.create_time() - float(info["create_time"])) > 0.5:
            return None  # the pid was recycled by an unrelated process
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, ValueError, TypeError):
        return None


def _wait_gone(proc: psutil.Process, timeout_s: float) -> bool:
    """Wait until *proc* has exited. A zombie counts as gone: its parent (init, for an orphaned
    server) reaps it, and only that parent can."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def kill_stale(path: str | Path, timeout_s: float = 10.0) -> str | None:
    """Kill the server a leftover pid file names (its whole process group), remove the file, and
    say what was done (None when there was nothing to do)."""
    path = Path(path)
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError):
        forget_server(path)
        return f"removed unreadable pid file {path.name}"
    proc = _same_process(info)
    if proc is None:
        forget_server(path)
        return f"removed pid file {path.name}: server pid {info.get('pid')} is no longer running"
    try:
        os.killpg(int(info.get("pgid", info["pid"])), signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    if not _wait_gone(proc, timeout_s):
        raise RuntimeError(f"stale server pid {proc.pid} from {path} survives SIGKILL")
    forget_server(path)
    return (f"killed stale server pid {info['pid']} (process group {info.get('pgid')}) left by "
            f"{info.get('owner', '?')} (pid {info.get('owner_pid', '?')})")


def find_snakemake_ancestor() -> psutil.Process | None:
    """The Snakemake process that (indirectly) started this one, or None outside Snakemake."""
    try:
        parents = psutil.Process().parents()
    except psutil.Error:
        return None
    for proc in parents:
        try:
            argv = proc.cmdline()
        except psutil.Error:
            continue
        head = [os.path.basename(a) for a in argv[:2]]
        if "snakemake" in head or argv[1:3] == ["-m", "snakemake"]:
            return proc
    return None


class SnakemakeWatchdog:
    """Poll the Snakemake ancestor; when it is gone, run *on_orphaned* and ``os._exit(exit_code)``.

    Use as a context manager around the work of one job. Outside Snakemake it does nothing.
    """

    def __init__(self, on_orphaned: Callable[[], None] = lambda: None, poll_s: float = 0.5,
                 exit_code: int = 75, ancestor: psutil.Process | None = None):
        self.on_orphaned = on_orphaned
        self.poll_s = poll_s
        self.exit_code = exit_code
        self.ancestor = ancestor if ancestor is not None else find_snakemake_ancestor()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _gone(self) -> bool:
        try:
            return not self.ancestor.is_running() or self.ancestor.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self._gone():
                log.error("snakemake (pid %d) is gone: stopping the server and abandoning this job "
                          "(rerun with --rerun-incomplete redoes it)", self.ancestor.pid)
                try:
                    self.on_orphaned()
                finally:
                    logging.shutdown()
                    os._exit(self.exit_code)

    def __enter__(self) -> "SnakemakeWatchdog":
        if self.ancestor is not None:
            self._thread = threading.Thread(target=self._run, name="snakemake-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def stray_temporaries(folder: str | Path, older_than_s: float = 0.0) -> list[Path]:
    """Temporary files left by interrupted atomic writes (``.<name>.<random>.tmp``) under *folder*."""
    now = time.time()
    out = []
    for path in Path(folder).rglob(".*.tmp"):
        try:
            if path.is_file() and now - path.stat().st_mtime >= older_than_s:
                out.append(path)
        except FileNotFoundError:
            continue
    return sorted(out)
