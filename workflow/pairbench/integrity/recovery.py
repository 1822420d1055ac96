"""Crash hygiene for server-launching jobs: pid files, stale-server sweep, and dying with Snakemake.

A visit (or warmup) launches an engine server in its own process group. Three things make sure no
server outlives the job that started it, whatever kills what: a pid file per running server, the
stale-server sweep before a launch, and the parent-death signal. They live with the server, in
:mod:`pairbench.engines.pidfile` (re-exported here: :func:`record_server`, :func:`kill_stale`,
:func:`die_with_parent`, :func:`pid_file`, :func:`forget_server`).

And the job itself must not outlive Snakemake: when Snakemake is SIGKILLed its running job is
orphaned and would go on measuring (and maybe write its artifact) while the rerun redoes the same
visit. :class:`SnakemakeWatchdog` polls the Snakemake process that started the job and, once it is
gone, runs a cleanup (stop the server) and ends the job without writing anything; the rerun's
``--rerun-incomplete`` redoes the visit.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

import psutil

from pairbench.engines.pidfile import die_with_parent, forget_server, kill_stale, pid_file, record_server

__all__ = ["SnakemakeWatchdog", "die_with_parent", "find_snakemake_ancestor", "forget_server", "kill_stale",
           "pid_file", "record_server", "stray_temporaries"]

log = logging.getLogger(__name__)


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
