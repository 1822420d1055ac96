"""Launching and stopping an arm's server, whatever the engine: the argv, environment, working
directory and health probe come from its profile (:meth:`pairbench.engines.adapter.ArmEngine.launch`).

The server runs in its own process group (so SIGTERM/SIGKILL reach anything it spawns), on a free
port, with stdout and stderr going to a log file under ``private/``. :class:`ServerProcess` is a context
manager: leaving the block always stops the server (SIGTERM, then SIGKILL after a grace period).

Crash hygiene (see :mod:`pairbench.engines.pidfile`): with a ``pid_path`` the server is recorded in a pid
file while it runs and whatever live server a previous, killed job left in that file is killed
before launching; every server gets a parent-death signal, so it dies with the job that launched it
(launch servers from the main thread: the signal fires when the launching *thread* ends).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from pairbench.engines import pidfile
from pairbench.engines.client import base_url, http

log = logging.getLogger(__name__)


class ServerError(Exception):
    """The server could not be launched, never became healthy, or died."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except FileNotFoundError:
        return ""


class ServerProcess:
    """One running server. ``with ServerProcess(...) as srv: srv.url ...``; facts land in ``srv.facts``."""

    def __init__(self, launch, log_path: str | Path, *, startup_timeout_s: float | None = None,
                 stop_timeout_s: float = 10.0, pid_path: str | Path | None = None, owner: str = "",
                 cpus: list[int] | None = None):
        # ``launch(port) -> pairbench.engines.profiles.LaunchSpec``: argv, env, cwd, health path and
        # the profile's readiness timeout (ArmEngine.launch), which *startup_timeout_s* overrides.
        self.launch = launch
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.pid_path = Path(pid_path) if pid_path is not None else None
        self.owner = owner
        self.cpus = list(cpus) if cpus else None  # CPU affinity of the server (server.pin); None: any
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.facts: dict = {}
        self.health_path = "/health"

    @property
    def url(self) -> str:
        return base_url(self.port)

    def start(self) -> None:
        self.port = free_port()
        spec = self.launch(self.port)
        cmd, cwd, self.health_path = spec.argv, Path(spec.cwd), spec.health_path
        if self.startup_timeout_s is None:
            self.startup_timeout_s = spec.ready_timeout_s
        env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}
        # The engine under test must come from src/<arm>/ (the cwd), never from an installed copy.
        env.pop("PYTHONPATH", None)
        if self.pid_path is not None:
            note = pidfile.kill_stale(self.pid_path)
            if note:
                log.warning("%s", note)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logfile = open(self.log_path, "ab")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=logfile, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=self._preexec)
        logfile.close()
        if self.pid_path is not None:
            pidfile.record_server(self.pid_path, self.proc.pid, cmd, self.owner)
        self.facts = {"argv": spec.public()["argv"], "port_kind": "ephemeral", "cpus": self.cpus}
        self.wait_healthy(t0)

    def _preexec(self) -> None:
        """In the child, before exec: the CPU affinity (inherited by every thread it starts), then
        the parent-death signal."""
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)
        pidfile.die_with_parent()

    def wait_healthy(self, t0: float) -> None:
        deadline = t0 + self.startup_timeout_s
        polls = 0
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerError(f"server exited with status {code} before becoming healthy; "
                                  f"log tail:\n{_tail(self.log_path)}")
            try:
                resp = http().get(self.url + self.health_path, timeout=2.0)
                polls += 1
                if resp.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.perf_counter() > deadline:
                self.stop()
                raise ServerError(f"server not healthy after {self.startup_timeout_s:g} s; log tail:\n"
                                  f"{_tail(self.log_path)}")
            time.sleep(0.05)
        self.facts["ready_s"] = time.perf_counter() - t0
        self.facts["health_polls"] = polls

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> dict:
        """SIGTERM the process group, SIGKILL it after the grace period. Idempotent."""
        if self.proc is None:
            return self.facts
        if self.proc.poll() is not None:
            self.facts.setdefault("exit_code", self.proc.returncode)
            self.facts.setdefault("stop", "already-exited")
            self._reap_group(signal.SIGKILL)
            self._forget()
            return self.facts
        t0 = time.perf_counter()
        self._reap_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=self.stop_timeout_s)
            how = "sigterm"
        except subprocess.TimeoutExpired:
            self._reap_group(signal.SIGKILL)
            self.proc.wait()
            how = "sigkill"
        self._reap_group(signal.SIGKILL)  # stragglers left in the group
        self.facts.update({"exit_code": self.proc.returncode, "stop": how, "stop_s": time.perf_counter() - t0})
        self._forget()
        return self.facts

    def _forget(self) -> None:
        if self.pid_path is not None:
            pidfile.forget_server(self.pid_path)

    def _reap_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> "ServerProcess":
        try:
            self.start()
        except BaseException:
            if self.proc is not None:
                self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
