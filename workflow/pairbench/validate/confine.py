"""The supervisor's side of the sandbox's kernel layers: which namespaces the child gets, whether
this machine can make them, and what the kernel says the worker became.

The child is started as ``unshare --pid --fork --kill-child --mount --net --ipc --uts -- python -I -S
runner.py`` (with ``--user --map-root-user`` first when the harness is not root): PID 1 of the new
PID namespace is the runner's *monitor*, which builds the filesystem view
(:func:`pairbench.validate.jail.enter`) and forks the *worker* that runs the candidate as an
unprivileged user (:func:`pairbench.validate.jail.drop`).

:func:`observe` then reads, from ``/proc`` of this (the harness's) side, what the worker really is:
its user ids, capabilities, no-new-privileges flag, namespaces and limits. Those facts, not the
child's word, decide the kernel layers of the result; a required one missing refuses the run
before the candidate is loaded (:data:`REQUIRED`). Nothing is decided from state the candidate can
reach.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

#: The kernel layers without which no model-written code runs: an unprivileged user, its own PID
#: namespace (one kill ends everything it started), a private read-only filesystem view, no network.
REQUIRED = ("user", "pidns", "mountns", "netns")

HOW_TO_ENABLE = (
    "the sandbox needs Linux namespaces (PID, mount, network, IPC, UTS) made by util-linux's `unshare`"
    " with --kill-child; as a user other than root it also needs unprivileged user namespaces"
    " (`sysctl -w kernel.unprivileged_userns_clone=1` on Debian kernels, `user.max_user_namespaces` > 0,"
    " and on Ubuntu 24.04 `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`), or run pairbench"
    " as root, which runs the code as `nobody`. Model-written code is never run unconfined"
    " (docs/validation.md, \"Isolation layers\")")


@dataclass(frozen=True)
class Plan:
    """How to start the child: the argv prefix, and which user the worker becomes (None: the user
    namespace's root, i.e. the harness's own user outside, with every capability dropped)."""

    prefix: tuple[str, ...]
    uid: int | None
    gid: int | None


def _nobody() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


@functools.cache
def plan() -> Plan | str:
    """The way to start a confined child on this machine, or why there is none (a sentence that says
    what failed and how to enable it). Probed once per process."""
    exe = shutil.which("unshare")
    if sys.platform != "linux" or exe is None:
        return f"no `unshare` on this machine ({sys.platform}): {HOW_TO_ENABLE}"
    ns = ("--pid", "--mount", "--net", "--ipc", "--uts")
    if os.geteuid() == 0:
        uid, gid = _nobody()
        prefix = (exe, *ns)
    else:
        uid = gid = None
        prefix = (exe, "--user", "--map-root-user", *ns)
    with tempfile.TemporaryDirectory(prefix="pairbench-sandbox-probe-") as tmp:
        try:  # a tmpfs mounted inside, as the jail does, proves the mount namespace is usable
            done = subprocess.run([*prefix, "--", "mount", "-t", "tmpfs", "tmpfs", tmp], capture_output=True,
                                  text=True, timeout=20, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"`unshare` could not run ({exc}): {HOW_TO_ENABLE}"
    if done.returncode != 0:
        return f"`{' '.join(prefix[1:])}` failed here ({done.stderr.strip()[-200:]}): {HOW_TO_ENABLE}"
    return Plan(prefix=(*prefix, "--"), uid=uid, gid=gid)


def children(pid: int) -> list[int]:
    """The child pids of *pid* (every thread's), read from /proc; [] once it is gone."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out += [int(x) for x in fh.read().split()]
    except OSError:
        return []
    return out


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as fh:
        return dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)


def _nproc_limit(pid: int) -> str | None:
    with open(f"/proc/{pid}/limits") as fh:
        for line in fh:
            if line.startswith("Max processes"):
                return line.split()[2]
    return None


def observe(worker: int, sandbox_plan: Plan) -> set[str]:
    """The kernel layers the kernel shows for process *worker* (read from /proc here, never asked of
    it): ``user`` (not root: no uid 0 and no capability, no new privileges), ``pidns``, ``mountns``,
    ``netns`` (namespaces other than this process's), ``rlimit`` (no new process allowed)."""
    layers: set[str] = set()
    try:
        st = _status(worker)
        uids = {int(x) for x in st["Uid"].split()} | {int(x) for x in st["Gid"].split()}
        caps = {int(st[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapAmb")}
        if sandbox_plan.uid is not None:
            unprivileged = uids == {sandbox_plan.uid, sandbox_plan.gid} and 0 not in uids
        else:
            unprivileged = uids == {os.getuid(), os.getgid()} and os.getuid() != 0
        if unprivileged and caps == {0} and st.get("NoNewPrivs", "").strip() == "1":
            layers.add("user")
        for ns, layer in (("pid", "pidns"), ("mnt", "mountns"), ("net", "netns")):
            if os.readlink(f"/proc/{worker}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"):
                layers.add(layer)
        if _nproc_limit(worker) == "0":
            layers.add("rlimit")
    except (OSError, KeyError, ValueError):
        pass  # a worker already gone shows nothing: the caller refuses
    return layers
