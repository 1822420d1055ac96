"""Helpers for the recovery tests (used by conftest.py and the test modules): a throwaway copy of
the repository to run Snakemake in, a way to start it as a real subprocess (its own session, so a test can SIGKILL exactly it), waiting on log
lines, and a sweep that guarantees no process a test started outlives it."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
CONFIGS = Path(__file__).resolve().parent / "config"


def repo_files() -> list[str]:
    """Tracked files plus untracked, unignored ones (so uncommitted work is tested too)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    return sorted({p for p in out.split("\0") if p and (REPO / p).is_file() and not p.startswith("resources")})


class Workdir:
    """A copy of the repository in a temporary folder, with results/ for one label."""

    def __init__(self, root: Path, label: str):
        self.root = root
        self.label = label
        self.procs: list[subprocess.Popen] = []

    @property
    def run(self) -> Path:
        return self.root / "results" / self.label

    def config(self, name: str) -> str:
        return str(CONFIGS / name)

    def snakemake(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(["snakemake", *args], cwd=self.root, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n"
                                 f"{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
        return proc

    def start_snakemake(self, *args: str, log_name: str = "snakemake-bg.log") -> subprocess.Popen:
        """Snakemake as a real background process, in its own session; output to a file."""
        log = open(self.root / log_name, "wb")
        proc = subprocess.Popen(["snakemake", *args], cwd=self.root, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.procs.append(proc)
        return proc

    def processes_inside(self) -> list[psutil.Process]:
        """Live processes (other than this test) whose working directory is inside this copy:
        Snakemake, its jobs and every engine server (which runs from src/<arm>/)."""
        root = str(self.root.resolve())
        found = []
        for proc in psutil.process_iter(["pid", "cwd", "status"]):
            try:
                if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                cwd = proc.info["cwd"]
                if cwd and (cwd == root or cwd.startswith(root + os.sep)):
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    def cleanup(self) -> list[int]:
        """SIGKILL whatever this test left running; return the pids that were still alive."""
        left = self.processes_inside()
        for proc in left:
            try:
                proc.kill()
            except psutil.Error:
                pass
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        psutil.wait_procs(left, timeout=5)
        return [p.pid for p in left]


def make_workdir(root) -> Workdir:
    """Copy the repository (tracked and untracked-unignored files) to *root*; resources/ is linked."""
    for rel in repo_files():
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest)
    (root / "resources").symlink_to((REPO / "resources").resolve())
    return Workdir(root, "recovery")


def wait_until(pred, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def file_has(path: Path, needle: str) -> bool:
    try:
        return needle in path.read_text(errors="replace")
    except FileNotFoundError:
        return False


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """{relative path: (sha256, mtime_ns)} of every file under *folder*."""
    return {p.relative_to(folder).as_posix(): (digest(p), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def sigkill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
