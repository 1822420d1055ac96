"""A real single-node Slurm cluster on this machine, for the tests of tests/cluster/.

Debian's ``slurm-wlm`` (22.05) and ``munge`` (``./install.sh --slurm``), run as root: a private
munged (its own socket), slurmctld and slurmd with a slurm.conf written here (one node, this host,
one partition; no slurmdbd, so Snakemake's executor asks ``squeue`` and MinJobAge keeps finished
jobs listed). The config goes to /etc/slurm/ (the executor's job steps drop SLURM_CONF, so ``srun``
inside a job reads the default path); a config already there is moved aside and put back. The
cluster is stopped and its processes are gone after the tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
# what the cluster runs: its daemons and the per-job slurmstepd, stopped at teardown if still alive
PROCESSES = {*DAEMONS, "slurmstepd"}
ETC = Path("/etc/slurm")
MARK = "# written by pairbench's tests/cluster/conftest.py\n"




def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    root: Path
    node: str
    env: dict

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60, check=False)
        if check and proc.returncode:
            raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def jobs(self) -> list[dict]:
        """Every job slurmctld still holds (MinJobAge keeps finished ones), from squeue."""
        out = self.run("squeue", "--states=all", "--noheader", "--format=%i|%k|%N|%T").stdout
        keys = ("id", "comment", "node", "state")
        return [dict(zip(keys, line.split("|"))) for line in out.splitlines() if line.strip()]


def slurm_conf(root: Path, node: str, cpus: int, mem_mb: int) -> str:
    return MARK + textwrap.dedent(f"""\
        ClusterName=pairbench-test
        SlurmctldHost={node}
        SlurmUser=root
        SlurmdUser=root
        SlurmctldPort={free_port()}
        SlurmdPort={free_port()}
        AuthType=auth/munge
        CredType=cred/munge
        AuthInfo=socket={root}/munge/munge.socket
        StateSaveLocation={root}/state
        SlurmdSpoolDir={root}/spool
        SlurmctldPidFile={root}/slurmctld.pid
        SlurmdPidFile={root}/slurmd.pid
        SlurmctldLogFile={root}/slurmctld.log
        SlurmdLogFile={root}/slurmd.log
        SlurmctldDebug=info
        ProctrackType=proctrack/linuxproc
        TaskPlugin=task/none
        SchedulerType=sched/backfill
        SelectType=select/cons_tres
        SelectTypeParameters=CR_CPU
        AccountingStorageType=accounting_storage/none
        JobAcctGatherType=jobacct_gather/none
        JobCompType=jobcomp/none
        # no slurmdbd: finished jobs stay listed by squeue (the executor's status command) this long
        MinJobAge=3600
        ReturnToService=2
        MpiDefault=none
        NodeName={node} CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
        PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP
        """)


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the real-Slurm tests start slurmctld, slurmd and munged, which needs root")
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (./install.sh --slurm)")
    root = tmp_path_factory.mktemp("slurm")
    for sub in ("munge", "state", "spool"):
        (root / sub).mkdir()
    node = socket.gethostname()
    mem_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.9)
    conf = {"slurm.conf": slurm_conf(root, node, os.cpu_count() or 1, mem_mb), "cgroup.conf": MARK + "CgroupPlugin=cgroup/v1\n"}
    _install(conf, root / "saved")
    env = {**os.environ, "SLURM_CONF": str(ETC / "slurm.conf")}
    cluster = Cluster(root, node, env)
    before = {p.pid for p in _cluster_processes()}
    os.chmod(root / "munge", 0o700)
    subprocess.run(["/usr/sbin/munged", "--force", f"--socket={root}/munge/munge.socket",
                    f"--pid-file={root}/munge/munged.pid", f"--log-file={root}/munge/munged.log",
                    f"--seed-file={root}/munge/munged.seed", "--key-file=/etc/munge/munge.key"],
                   check=True, env=env)
    try:
        subprocess.run(["/usr/sbin/slurmctld"], check=True, env=env)
        subprocess.run(["/usr/sbin/slurmd"], check=True, env=env)
        _wait(lambda: cluster.run("sinfo", "--noheader", "--format=%t", check=False).stdout.strip() == "idle",
              60, f"node {node} to be idle (logs in {root})")
        yield cluster
    finally:
        cluster.run("scancel", "--full", f"--nodelist={node}", check=False)
        cluster.run("scontrol", "shutdown", check=False)
        _stop([p for p in _cluster_processes() if p.pid not in before])
        _restore(conf, root / "saved")


def _cluster_processes() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] in PROCESSES]


def _stop(procs: list[psutil.Process]) -> None:
    """SIGTERM *procs* (the cluster's, started by this fixture), then SIGKILL what is left after 20 s."""
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=20)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=10)


def _install(conf: dict[str, str], saved: Path) -> None:
    """Write *conf* into /etc/slurm/, moving a site's own files (not an earlier run's) to *saved* first."""
    ETC.mkdir(exist_ok=True)
    saved.mkdir()
    for name, text in conf.items():
        path = ETC / name
        if path.is_file() and not path.read_text().startswith(MARK):
            shutil.move(path, saved / name)
        path.write_text(text)


def _restore(conf: dict[str, str], saved: Path) -> None:
    for name in conf:
        (ETC / name).unlink(missing_ok=True)
        if (saved / name).is_file():
            shutil.move(saved / name, ETC / name)
