"""A two-comparison study through Snakemake's Slurm executor on a real single-node Slurm (conftest.py).

- every job went through sbatch: slurmctld lists each job id Snakemake reported, COMPLETED on the
  node, and each comparison's measuring jobs were one Slurm job (its job group);
- every comparison's visits ran on one node (one pseudonym in the measure artifacts, the node's real
  name only in the private outputs), one at a time in the plan's order;
- the audit passed and every bundle verifies; the index page links both reports;
- ``scancel`` of the Slurm job running a visit fails that visit cleanly (no artifact, no server
  left, the finished visits kept byte for byte) and ``--rerun-incomplete`` recovers it.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime

import psutil
import pytest
from pairbench.core.artifacts import read_artifact
from pairbench.integrity import recovery

from tests.recovery._helpers import make_workdir, snapshot, wait_until

# the first test starts the cluster and runs a two-comparison study through sbatch
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

# The plugin's status command without slurmdbd, and a first status check soon after submission
# (its default, 40 s, is for a busy site; the test's jobs take seconds).
SLURM = ["--workflow-profile", "profiles/slurm", "--slurm-status-command", "squeue",
         "--slurm-init-seconds-before-status-checks", "1"]
LABELS = ["tiny-a", "tiny-b"]


def snakemake(wd, cluster, *args, check=True, timeout=900):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "snakemake", *SLURM, *args], cwd=wd.root, env=cluster.env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    proc.wall_s = time.monotonic() - start
    if check and proc.returncode:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-8000:]}")
    return proc


def log_span(path) -> tuple[datetime, datetime]:
    """The first and last timestamp of a job log (pairbench.stages.script: asctime first)."""
    stamps = [datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f") for line in path.read_text().splitlines()
              if re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", line)]
    return stamps[0], stamps[-1]


def submitted(proc) -> list[str]:
    """The Slurm job ids Snakemake reported submitting."""
    return re.findall(r"submitted with SLURM jobid (\d+)", proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def study(slurm_cluster, tmp_path_factory):
    wd = make_workdir(tmp_path_factory.mktemp("cluster") / "repo")
    proc = snakemake(wd, slurm_cluster, "--configfile=tests/cluster/study.yaml")
    print(f"\nthe study through Slurm: {proc.wall_s:.1f} s, {len(submitted(proc))} Slurm jobs")
    yield wd, proc
    wd.cleanup()


def test_every_job_went_through_sbatch_and_completed(study, slurm_cluster):
    _, proc = study
    ids = submitted(proc)
    held = {j["id"]: j for j in slurm_cluster.jobs()}
    assert ids and all(held[i]["state"] == "COMPLETED" and held[i]["node"] == slurm_cluster.node for i in ids), \
        [held.get(i) for i in ids]
    comments = [held[i]["comment"] for i in ids]
    # 20 jobs per comparison (plan, 2 source, 2 build, fixtures, 2 warmup, the measuring group of
    # its 4 visits, 4 validations, retire, stats, landing, plots, provenance, publish, audit); the
    # index is a local rule (no job)
    assert len(ids) == 2 * 20, comments
    for label in LABELS:  # a group job's comment: rule_<group>_<its rules>
        assert sum(c.startswith(f"rule_measure_{label}_") for c in comments) == 1, comments


def test_each_comparisons_visits_ran_on_one_node_in_plan_order(study, slurm_cluster):
    wd, _ = study
    for label in LABELS:
        res = wd.root / "results" / label
        plan = read_artifact(res / "plan.json", "plan")
        visits = [read_artifact(res / "measure" / f"{v['id']}.json", "measure") for v in plan["visits"]]
        assert len({m["host"]["node"] for m in visits}) == 1, [m["host"]["node"] for m in visits]
        for out in (res / "private" / "outputs").glob("*.json"):
            assert json.loads(out.read_text())["node"] == slurm_cluster.node, out
        # the visits' own logs, written on the node (Snakemake re-touches a group's outputs in order
        # afterwards, so an artifact's mtime is not when it was written)
        spans = [log_span(wd.root / "logs" / label / "measure" / f"{v['id']}.log") for v in plan["visits"]]
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans


def test_the_audit_passes_and_every_bundle_verifies(study):
    wd, _ = study
    for label in LABELS:
        assert read_artifact(wd.root / "results" / label / "audit.json", "audit")["ok"]
        # this copy's pairbench, not whichever checkout an installed one points at
        verify = subprocess.run([sys.executable, "-m", "pairbench", "verify", f"results/{label}/publish"],
                                cwd=wd.root, capture_output=True, text=True, check=False,
                                env={**os.environ, "PYTHONPATH": str(wd.root / "workflow")})
        assert verify.returncode == 0, verify.stdout + verify.stderr
    index = (wd.root / "results" / "tiny-study" / "index.md").read_text()
    for label in LABELS:
        assert f"[{label}](../{label}/publish/README.md)" in index


CANCEL = "--configfile=tests/cluster/study-cancel.yaml"
VISITS = ["r01-baseline", "r01-candidate", "r02-candidate", "r02-baseline"]  # the plan's ABBA order


def test_scancel_of_a_running_visit_fails_it_cleanly_and_rerun_incomplete_recovers(slurm_cluster,
                                                                                    tmp_path_factory):
    wd = make_workdir(tmp_path_factory.mktemp("cancel") / "repo")
    run = wd.root / "results" / "slow"
    with open(wd.root / "run1.log", "wb") as log:
        smk = subprocess.Popen([sys.executable, "-m", "snakemake", *SLURM, CANCEL], cwd=wd.root,
                               env=slurm_cluster.env, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    wd.procs.append(smk)
    try:
        pidfile = recovery.pid_file(run / "private", "measure")
        victim = VISITS[2]
        # the handshake: the third visit's server is up (the visit records it before its first request)
        wait_until(lambda: pidfile.is_file() and json.loads(pidfile.read_text())["owner"] == f"measure {victim}",
                   timeout=600, what=f"{victim}'s server to start")
        server_pid = json.loads(pidfile.read_text())["pid"]
        done = {v: snapshot(run / "measure")[f"{v}.json"] for v in VISITS[:2]}
        group = [j for j in slurm_cluster.jobs() if j["comment"].startswith("rule_measure_slow_")
                 and j["state"] == "RUNNING"]
        assert len(group) == 1, slurm_cluster.jobs()
        slurm_cluster.run("scancel", group[0]["id"])

        assert smk.wait(timeout=300) != 0, "a cancelled visit must fail the run"
        state = {j["id"]: j["state"] for j in slurm_cluster.jobs()}[group[0]["id"]]
        assert state == "CANCELLED", state
        wait_until(lambda: not psutil.pid_exists(server_pid) or psutil.Process(server_pid).status() == "zombie",
                   timeout=30, what="the cancelled visit's server to be gone")
        assert not (run / "measure" / f"{victim}.json").exists(), "the cancelled visit wrote its artifact"
        assert not list(recovery.stray_temporaries(run / "measure"))
        for v, snap in done.items():
            assert snapshot(run / "measure")[f"{v}.json"] == snap, f"{v} was lost or rewritten by the cancel"

        resumed = snakemake(wd, slurm_cluster, CANCEL, "--rerun-incomplete")
        print(f"\nresumed after scancel: {resumed.wall_s:.1f} s, {len(submitted(resumed))} Slurm jobs")
        for v, snap in done.items():
            assert snapshot(run / "measure")[f"{v}.json"] == snap, f"{v} was redone by the resume"
        assert read_artifact(run / "measure" / f"{victim}.json", "measure")["attempt"] == 1
        assert read_artifact(run / "audit.json", "audit")["ok"]
    finally:
        wd.cleanup()
