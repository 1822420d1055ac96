"""Host state per visit: load average, CPU frequency and governor, and CPU pinning of server vs client.

Small ``collect`` functions that tolerate missing sources (a container without cpufreq, a system
without ``sched_setaffinity``): a value that cannot be read is None, never an error. Nothing here is
private: load averages, CPU counts, frequencies and CPU numbers name no host or user.

Pinning (``server.pin``): on a machine with at least two usable CPUs, the engine server runs on one
set of CPUs and the harness client (this process) on the disjoint rest, so that the client's
per-token work never competes with the server's decode thread for a core. :func:`pin_sets` decides
the sets; the server's are applied with ``taskset``-free ``preexec_fn`` affinity in
:mod:`pairbench.engines.server`, the client's with :func:`pin_self`.

External load: a visit whose 1-minute load average, minus what this visit itself puts on the machine
(the server's busy threads and the client), exceeds ``external_load_threshold`` was measured while
something else ran; it is flagged per visit and disclosed by the report (it is not excluded: both
arms of a round may share it, and pairing is what protects the comparison).

Quiet guard (``server.quiet_wait_s``): before each visit, :func:`wait_for_quiet` waits, at most a
bound, until that same test would not flag the visit. Every wait is recorded (seconds, the load
before and after, whether it ran out); after the bound the visit is measured anyway, and flagged.
The 1-minute load average is a damped mean (the kernel updates it every 5 s, with a 1-minute time
constant), so the guard sees a burst of other work some seconds after it starts and its tail for a
minute after it ends: it waits out the tail of a build that has just finished, not a load that
stays.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

# The load the measurement itself adds (the server's decode thread and the client): above this
# much more, something else was running. A server of N busy threads adds N (own_load).
OWN_LOAD = 1.0


def own_load(threads: int | None, cpus: int | None = None) -> float:
    """What a visit itself puts on the 1-minute load average: one per busy server thread (an engine
    whose thread count the config does not set counts one), plus the client when the server leaves
    it no core of its own (*threads* >= *cpus*): it then waits, runnable, through every request, and
    a runnable task counts. A two-thread llama-server on 2 cores leaves a load of about 3 behind: read
    against OWN_LOAD alone, every visit would wait out its bound and be flagged."""
    n = float(threads or 1)
    client = 1.0 if cpus is not None and n >= cpus else 0.0
    return max(OWN_LOAD, n + client)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def usable_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpufreq() -> dict:
    """Current frequency (MHz) of each usable CPU and the governor, where /sys exposes them."""
    freqs, governors = {}, set()
    for cpu in usable_cpus():
        base = f"/sys/devices/system/cpu/cpu{cpu}/cpufreq"
        khz = _read(f"{base}/scaling_cur_freq")
        if khz and khz.isdigit():
            freqs[str(cpu)] = int(khz) / 1000.0
        gov = _read(f"{base}/scaling_governor")
        if gov:
            governors.add(gov)
    return {"cpu_mhz": freqs or None, "governor": ",".join(sorted(governors)) or None}


def snapshot() -> dict:
    """``{"load1", "load5", "load15", "cpus", "cpu_mhz", "governor"}``, None where unreadable."""
    try:
        load1, load5, load15 = os.getloadavg()
    except (AttributeError, OSError):
        load1 = load5 = load15 = None
    return {"load1": load1, "load5": load5, "load15": load15, "cpus": len(usable_cpus()), **cpufreq()}


def pin_sets(mode: str | bool | None, cpus: list[int] | None = None) -> tuple[list[int] | None, list[int] | None]:
    """``(server_cpus, client_cpus)`` for ``server.pin``: ``auto``/true pins when at least two CPUs
    are usable (the server gets all but the first, the client the first); false/None never pins."""
    cpus = usable_cpus() if cpus is None else sorted(cpus)
    if mode in (None, False, "false", "off") or len(cpus) < 2:
        return None, None
    if mode not in (True, "true", "auto"):
        raise ValueError(f"server.pin: unknown mode {mode!r} (auto, true or false)")
    return cpus[1:], cpus[:1]


def pin_self(cpus: list[int] | None) -> list[int] | None:
    """Pin this process to *cpus*; returns the previous set (to restore), or None if not pinned."""
    if not cpus:
        return None
    try:
        before = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cpus)
        return before
    except (AttributeError, OSError):
        return None


def external_load(load1: float | None, threshold: float, own: float = OWN_LOAD) -> bool | None:
    """Whether a 1-minute load average says something besides this visit (*own*: :func:`own_load`)
    ran (None: unreadable)."""
    if load1 is None:
        return None
    return load1 - own > threshold


def load1() -> float | None:
    """The 1-minute load average; None where unreadable."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


POLL_S = 5.0  # how often the kernel updates the load average


def wait_for_quiet(threshold: float | None, max_wait_s: float | None, *,
                   read_load: Callable[[], float | None] = load1, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep, poll_s: float = POLL_S,
                   on_wait: Callable[[float], None] | None = None, own: float = OWN_LOAD) -> dict:
    """Wait, at most *max_wait_s*, until the 1-minute load average less the run's own (*own*) is at
    most *threshold* (until :func:`external_load` would not flag it), checking every *poll_s*.

    Returns ``{"threshold", "max_wait_s", "waited_s", "load1_before", "load1_after", "timed_out"}``.
    No threshold, no bound (0 or None) or an unreadable load: no wait. *read_load*, *clock* and
    *sleep* are injectable (tests drive the guard without sleeping); *on_wait(load)* is called once
    when a wait begins.
    """
    start = clock()
    before = load = read_load()
    timed_out, waited_s = False, 0.0
    if threshold is not None and max_wait_s and external_load(load, threshold, own):
        if on_wait:
            on_wait(load)
        while load is not None and external_load(load, threshold, own):
            left = max_wait_s - (clock() - start)
            if left <= 0:
                timed_out = True
                break
            sleep(min(poll_s, left))
            load = read_load()
        waited_s = clock() - start
    return {"threshold": threshold, "max_wait_s": max_wait_s, "waited_s": waited_s,
            "load1_before": before, "load1_after": load, "timed_out": timed_out}
