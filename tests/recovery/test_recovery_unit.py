"""Unit tests of pairbench.integrity.recovery with real processes and real signals: pid files, the stale-server
sweep (whole process group, never a recycled pid), the parent-death signal, and the watchdog that
ends a job whose Snakemake was SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from pairbench.integrity import recovery

WORKFLOW = Path(__file__).resolve().parents[2] / "workflow"


def wait_for(pred, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_kill_stale_kills_the_whole_group(tmp_path):
    # A "server" in its own session that spawns a grandchild in the same group.
    server = subprocess.Popen(
        [sys.executable, "-c", "import subprocess,time; subprocess.Popen(['sleep','60']); time.sleep(60)"],
        start_new_session=True)
    try:
        wait_for(lambda: psutil.Process(server.pid).children(), what="grandchild")
        grandchild = psutil.Process(server.pid).children()[0].pid
        pf = recovery.pid_file(tmp_path, "measure")
        recovery.record_server(pf, server.pid, ["python", "-c", "..."], owner="test")
        assert json.loads(pf.read_text())["pgid"] == server.pid
        msg = recovery.kill_stale(pf)
        assert msg and f"pid {server.pid}" in msg
        server.wait(timeout=5)
        wait_for(lambda: gone(grandchild), what="grandchild to die")
        assert not pf.exists()
        assert recovery.kill_stale(pf) is None
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)


def test_kill_stale_never_hits_a_recycled_pid(tmp_path):
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        pf = recovery.pid_file(tmp_path, "measure")
        recovery.record_server(pf, bystander.pid, ["sleep"], owner="test")
        info = json.loads(pf.read_text())
        info["create_time"] -= 1000  # the recorded server started long ago: this pid is someone else
        pf.write_text(json.dumps(info))
        msg = recovery.kill_stale(pf)
        assert "no longer running" in msg
        assert bystander.poll() is None and not pf.exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_server_dies_with_the_job_that_launched_it(tmp_path):
    """SIGKILL the launching process: the server (own session, PR_SET_PDEATHSIG) dies too."""
    pidfile = tmp_path / "server.pid"
    launcher = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import subprocess, sys, time
        sys.path.insert(0, {str(WORKFLOW)!r})
        from pairbench.integrity.recovery import die_with_parent
        p = subprocess.Popen(['sleep', '60'], start_new_session=True, preexec_fn=die_with_parent)
        open({str(pidfile)!r}, 'w').write(str(p.pid))
        time.sleep(60)
    """)])
    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text(), what="server pid")
        server = int(pidfile.read_text())
        assert not gone(server)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=5)
        wait_for(lambda: gone(server), what="server to die with its launcher")
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_watchdog_ends_an_orphaned_job(tmp_path):
    """The 'snakemake' ancestor is SIGKILLed: the job runs its cleanup and exits 75, no artifact."""
    marker, artifact, ready = tmp_path / "cleaned", tmp_path / "artifact.json", tmp_path / "ready"
    ancestor = subprocess.Popen(["sleep", "60"])
    job = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import pathlib, psutil, sys, time
        sys.path.insert(0, {str(WORKFLOW)!r})
        from pairbench.integrity.recovery import SnakemakeWatchdog
        cleanup = lambda: pathlib.Path({str(marker)!r}).write_text('stopped server')
        with SnakemakeWatchdog(cleanup, poll_s=0.05, ancestor=psutil.Process({ancestor.pid})):
            pathlib.Path({str(ready)!r}).write_text('watching')
            time.sleep(30)
            pathlib.Path({str(artifact)!r}).write_text('{{}}')
    """)], stderr=subprocess.PIPE, text=True)
    try:
        wait_for(ready.exists, timeout=30, what="the job's watchdog to start")
        assert job.poll() is None
        ancestor.send_signal(signal.SIGKILL)
        ancestor.wait()
        assert job.wait(timeout=10) == 75
        assert marker.read_text() == "stopped server"
        assert not artifact.exists()
        assert "snakemake (pid" in job.stderr.read()
    finally:
        for p in (job, ancestor):
            if p.poll() is None:
                p.kill()


class FakeProcess:
    """One process of an injected process tree: its command line and its ancestors, nearest first."""

    def __init__(self, *argv: str, parents=()):
        self.argv, self._parents = list(argv), list(parents)

    def cmdline(self) -> list[str]:
        if self.argv == ["<denied>"]:
            raise psutil.AccessDenied(1)
        return self.argv

    def parents(self) -> list["FakeProcess"]:
        return self._parents

    def is_running(self) -> bool:
        return True

    def status(self) -> str:
        return psutil.STATUS_SLEEPING


@pytest.mark.parametrize("tree, found", [
    ([["bash"], ["sshd: ci"], ["/sbin/init"]], None),
    ([["bash", "-c", "python3 job.py"], ["/usr/bin/python3", "-m", "snakemake", "--cores", "1"], ["/sbin/init"]], 1),
    ([["<denied>"], ["/opt/venv/bin/snakemake", "--cores", "1"]], 1),
    ([["/usr/bin/python3", "/opt/venv/bin/snakemake", "-c1"], ["bash"]], 0),
    ([["grep", "-r", "snakemake"], ["bash"]], None),
], ids=["outside", "python-m", "past-a-denied-one", "script", "named-in-an-argument"])
def test_watchdog_watches_exactly_a_snakemake_ancestor(monkeypatch, tree, found):
    """The tree is injected, so both cases are asserted wherever the test runs (even under Snakemake)."""
    ancestors = [FakeProcess(*argv) for argv in tree]
    monkeypatch.setattr(psutil, "Process", lambda pid=None: FakeProcess("python3", "job.py", parents=ancestors))
    want = None if found is None else ancestors[found]
    assert recovery.find_snakemake_ancestor() is want
    with recovery.SnakemakeWatchdog(poll_s=60) as wd:
        assert wd.ancestor is want
        assert (wd._thread is not None and wd._thread.is_alive()) == (want is not None)
    assert wd._thread is None or not wd._thread.is_alive()


def test_stray_temporaries(tmp_path):
    (tmp_path / "measure").mkdir()
    (tmp_path / "measure" / ".r01-a.json.x1y2.tmp").write_text("{")
    (tmp_path / "measure" / "r01-a.json").write_text("{}")
    assert [p.name for p in recovery.stray_temporaries(tmp_path)] == [".r01-a.json.x1y2.tmp"]
