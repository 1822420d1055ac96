"""Crash hygiene for servers: a pid file per running server, the stale-server sweep, and the
parent-death signal, so that no server outlives the job that started it, whatever kills what.

1. **Pid file** (:func:`record_server`): ``private/servers/<slot>.json`` holds the server's pid,
   process group, start time and argv while it runs, and is removed when it stops. Visits never
   run two at a time, so they all share the slot ``measure``; each warmup has its own slot.
2. **Stale sweep** (:func:`kill_stale`): before a job launches its server it kills whatever server
   the slot's pid file names, if that exact process (same pid *and* start time, so a recycled pid is
   never hit) is still alive, and removes the file. A server orphaned by a SIGKILLed job is gone by
   the next start at the latest.
3. **Parent-death signal** (:func:`die_with_parent`, a ``preexec_fn``): the kernel SIGKILLs the server
   when the process that launched it dies, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``).

:class:`pairbench.engines.server.ServerProcess` uses all three; the job's own watchdog (that it must not
outlive Snakemake) is :mod:`pairbench.integrity.recovery`'s.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil

from pairbench.core.artifacts import atomic_write_text

__all__ = ["die_with_parent", "forget_server", "kill_stale", "pid_file", "record_server"]

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
