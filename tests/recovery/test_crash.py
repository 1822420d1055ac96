"""Crash recovery with real signals sent to real processes (docs/recovery.md).

One throwaway copy of the repository runs the pipeline's measurement on the fake engine, slowed to
80 ms a token (tests/recovery/config/recovery.yaml) so a test can act in the middle of a visit:

1. SIGKILL the Snakemake process while the third visit streams. The orphaned job must stop its
   server and die without writing its artifact; the next plain run is refused for the stale lock;
   ``snakemake --unlock`` then ``snakemake --cores 1 --rerun-incomplete`` redoes only the visit in
   flight (and the one after it), leaving the finished visits byte-identical, and a stale server
   recorded in the pid file is killed at the next visit's start.
2. SIGKILL the engine server in the middle of the last visit (``retries: 0``). The visit fails
   naming the arm, round and condition; ``snakemake --cores 1 --rerun-incomplete`` (no --unlock:
   Snakemake exited by itself) completes it, leaving the visits before it byte-identical.

Each test measures in its own copy of the repository: it can run alone and in any order.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import psutil
import pytest

from pairbench.integrity import recovery
from pairbench.core.artifacts import read_artifact

from tests.recovery._helpers import file_has, make_workdir, snapshot, wait_until

pytestmark = pytest.mark.slow

CFG = ["--configfile=tests/recovery/config/recovery.yaml"]  # "=": --configfile takes several values
VISITS = ["r01-baseline", "r01-candidate", "r02-candidate", "r02-baseline"]  # the plan's ABBA order


def job_counts(stdout: str) -> dict[str, int]:
    """Snakemake's 'Job stats' table as {rule: count}."""
    m = re.search(r"Job stats:\njob\s+count\n[-\s]+\n(.*?)\n\n", stdout, re.S)
    assert m, f"no Job stats table in:\n{stdout[-2000:]}"
    counts = {}
    for line in m.group(1).splitlines():
        name, n = line.split()
        if name != "total":
            counts[name] = int(n)
    return counts


@pytest.fixture
def fresh(tmp_path):
    """A copy of the repository in which nothing was measured yet."""
    wd = make_workdir(tmp_path / "repo")
    yield wd
    left = wd.cleanup()
    assert not left, f"processes left running after the crash tests: {left}"


def measure_path(wd, visit):
    return wd.run / "measure" / f"{visit}.json"


def test_sigkill_snakemake_mid_visit_then_resume(fresh):
    wd = fresh
    target = str(measure_path(wd, VISITS[-1]).relative_to(wd.root))
    smk = wd.start_snakemake("--cores", "1", *CFG, target, log_name="run1.log")
    console = wd.root / "run1.log"
    wait_until(lambda: file_has(console, "[measure] r02-candidate arm=candidate round=2 condition=in400-out12: 1/12 tokens"),
               timeout=400, what="the third visit to stream its first tokens")
    pidfile = recovery.pid_file(wd.run / "private", "measure")
    server_pid = json.loads(pidfile.read_text())["pid"]
    done = {v: measure_path(wd, v) for v in VISITS[:2]}
    before = {v: snapshot(p.parent)[p.name] for v, p in done.items()}

    smk.send_signal(signal.SIGKILL)
    smk.wait(timeout=10)
    # The orphaned job notices (watchdog), kills its server and exits without an artifact.
    wait_until(lambda: not wd.processes_inside(), timeout=20,
               what="the orphaned measure job and its server to exit")
    assert not psutil.pid_exists(server_pid) or psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE
    assert not measure_path(wd, "r02-candidate").exists(), "the killed visit wrote its artifact"
    assert not list(recovery.stray_temporaries(wd.run / "measure"))
    for v in VISITS[:2]:
        read_artifact(measure_path(wd, v), "measure")

    # A stale server left behind (as if the job itself had been SIGKILLed) is killed at the next start.
    stale = subprocess.Popen(["sleep", "600"], start_new_session=True, cwd=wd.run)
    wd.procs.append(stale)
    recovery.record_server(pidfile, stale.pid, ["sleep", "600"], owner="measure r02-candidate")

    refused = wd.snakemake("--cores", "1", *CFG, "--rerun-incomplete", target, check=False)
    assert refused.returncode != 0 and "LockException" in refused.stdout + refused.stderr, \
        "after a SIGKILL the stale lock should have to be removed with --unlock"
    wd.snakemake("--unlock", *CFG, target)
    resumed = wd.snakemake("--cores", "1", *CFG, "--rerun-incomplete", target)
    assert job_counts(resumed.stdout + resumed.stderr) == {"measure": 2}, resumed.stderr[-3000:]
    assert stale.wait(timeout=5) == -signal.SIGKILL
    assert file_has(wd.root / "logs" / "recovery" / "measure" / "r02-candidate.log", "killed stale server pid")
    for v, p in done.items():
        assert snapshot(p.parent)[p.name] == before[v], f"{v} was rewritten by the resume"
    for v in VISITS:
        assert read_artifact(measure_path(wd, v), "measure")["attempt"] == 1
    assert not wd.processes_inside()


def test_sigkill_engine_server_mid_visit_fails_visit_then_rerun_incomplete(fresh):
    wd = fresh
    victim = VISITS[-1]
    target = str(measure_path(wd, victim).relative_to(wd.root))
    smk = wd.start_snakemake("--cores", "1", *CFG, target, log_name="run2.log")
    console = wd.root / "run2.log"
    wait_until(lambda: file_has(console, f"[measure] {victim} arm=baseline round=2 condition=in400-out12: 1/12 tokens"),
               timeout=400, what=f"{victim} to stream")
    info = json.loads(recovery.pid_file(wd.run / "private", "measure").read_text())
    assert info["owner"] == f"measure {victim}"
    os.kill(info["pid"], signal.SIGKILL)

    assert smk.wait(timeout=120) != 0, "the visit whose server was killed must fail"
    text = console.read_text()
    assert re.search(rf"measure {victim} FAILED: visit {victim} \(arm baseline, round 2, condition in4[04]0-out12, "
                     r"attempt 1\): engine fault: ", text), text[-3000:]
    assert not measure_path(wd, victim).exists()
    assert not wd.processes_inside()
    # the visits before it ran to the end, one at a time in the plan's order
    others = {v: snapshot(measure_path(wd, v).parent)[f"{v}.json"] for v in VISITS[:-1]}

    resumed = wd.snakemake("--cores", "1", *CFG, "--rerun-incomplete", target)
    assert job_counts(resumed.stdout + resumed.stderr) == {"measure": 1}
    assert read_artifact(measure_path(wd, victim), "measure")["attempt"] == 1
    for v, snap in others.items():
        assert snapshot(measure_path(wd, v).parent)[f"{v}.json"] == snap, f"{v} was rewritten"
