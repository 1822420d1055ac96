"""The quiet guard (pairbench.measure.hostload.wait_for_quiet): before a visit, wait a bounded time
for the 1-minute load average, less the run's own, to fall to the threshold; record every wait.

Driven with injected load readers and a fake clock (no sleeping), and once with a real synthetic
load: busy processes this test starts, the load average rising, a visit that waits its bound, is
measured anyway and flagged."""

import time
from pathlib import Path

import pytest

from pairbench.measure import hostload
from pairbench.measure import visit as pb_measure

FAKE_SRC = Path(__file__).resolve().parents[1] / "fakes"


class FakeTime:
    """A clock that moves only when the guard sleeps, and a load reader that plays back *loads*."""

    def __init__(self, loads):
        self.now, self.loads, self.slept, self.reads = 100.0, list(loads), [], 0

    def clock(self):
        return self.now

    def sleep(self, s):
        self.slept.append(s)
        self.now += s

    def read(self):
        self.reads += 1
        return self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]

    def guard(self, threshold=0.5, max_wait_s=30.0, **kw):
        return hostload.wait_for_quiet(threshold, max_wait_s, read_load=self.read, clock=self.clock,
                                       sleep=self.sleep, **kw)


def test_a_quiet_machine_is_not_waited_for():
    t = FakeTime([1.4])  # 1.4 - the run's own 1.0 = 0.4, not above 0.5
    q = t.guard()
    assert q == {"threshold": 0.5, "max_wait_s": 30.0, "waited_s": 0.0, "load1_before": 1.4, "load1_after": 1.4,
                 "timed_out": False}
    assert t.slept == [] and t.reads == 1


def test_waits_until_the_load_falls_to_the_threshold():
    t, told = FakeTime([3.0, 2.2, 1.5]), []
    q = t.guard(on_wait=told.append)
    assert t.slept == [5.0, 5.0] and told == [3.0]  # checked every 5 s; announced once
    assert q == {"threshold": 0.5, "max_wait_s": 30.0, "waited_s": 10.0, "load1_before": 3.0, "load1_after": 1.5,
                 "timed_out": False}


def test_after_the_bound_the_visit_goes_ahead_and_says_so():
    t = FakeTime([3.0])
    q = t.guard(max_wait_s=12.0)
    assert t.slept == [5.0, 5.0, 2.0]  # never past the bound
    assert q["timed_out"] and q["waited_s"] == 12.0 and q["load1_after"] == 3.0
    assert hostload.external_load(q["load1_after"], q["threshold"])  # and the visit is flagged, as before


@pytest.mark.parametrize("threshold, max_wait_s", [(None, 30.0), (0.5, 0), (0.5, None)])
def test_no_threshold_or_no_bound_never_waits(threshold, max_wait_s):
    t = FakeTime([9.0])
    q = t.guard(threshold=threshold, max_wait_s=max_wait_s)
    assert (q["waited_s"], q["timed_out"], q["load1_before"], t.slept) == (0.0, False, 9.0, [])


def test_an_unreadable_load_is_not_waited_for():
    t = FakeTime([None])
    assert t.guard() == {"threshold": 0.5, "max_wait_s": 30.0, "waited_s": 0.0, "load1_before": None,
                         "load1_after": None, "timed_out": False}


def test_a_load_that_becomes_unreadable_ends_the_wait():
    t = FakeTime([3.0, None])
    q = t.guard()
    assert (q["waited_s"], q["load1_after"], q["timed_out"]) == (5.0, None, False)


def wait_for_load(at_least: float, bound_s: float) -> float:
    """Poll the real 1-minute load average until it reaches *at_least*; fail after *bound_s*."""
    deadline = time.monotonic() + bound_s
    while (load := hostload.load1()) < at_least:
        if time.monotonic() > deadline:
            pytest.fail(f"the load average never reached {at_least:.2f} under the synthetic load (now {load:.2f})")
        time.sleep(1.0)
    return load


def test_a_visit_under_synthetic_load_waits_its_bound_then_is_measured_and_flagged(
        tmp_path, embedded_engine, synthetic_load):
    if hostload.load1() is None:
        pytest.skip("this system has no load average")  # not Linux: nothing for the guard to read
    before = hostload.load1()
    synthetic_load(len(hostload.usable_cpus()) + 2)
    # the kernel's damped average climbs toward the busy count: wait (bounded) until it has risen by one
    risen = wait_for_load(max(before, hostload.OWN_LOAD) + 1.0, bound_s=150.0)
    threshold = risen - hostload.OWN_LOAD - 0.5  # the load now is above what the guard accepts
    prompts = {"in120-out6": {"rounds": [{"round": 1, "messages": [{"role": "user", "content": "x" * 101}]}]}}
    fixtures = {"in120-out6": {"rounds": [{"round": 1, "prompt_sha256": "0" * 64}]}}
    body, _ = pb_measure.run_visit(
        visit={"index": 1, "round": 1, "arm": "a", "position": 0, "id": "r01-a"}, engine=embedded_engine(FAKE_SRC),
        plan={"conditions": [{"id": "in120-out6", "input_tokens": 120, "output_tokens": 6}], "seed": 0,
              "max_context": 512, "repeats": 1}, prompts=prompts,
        fixtures=fixtures, server_cfg={"threads": None, "startup_timeout_s": 60, "request_timeout_s": 60,
                                       "stop_timeout_s": 5, "external_load": threshold, "quiet_wait_s": 2.0},
        server_log=tmp_path / "server.log", inputs={})
    q = body["host"]["quiet"]
    assert q["load1_before"] >= risen > before and q["load1_before"] - hostload.OWN_LOAD > threshold
    assert q["timed_out"] and q["waited_s"] >= 2.0 and q["max_wait_s"] == 2.0
    assert body["host"]["external_load"] is True  # measured anyway, and flagged
    assert all(r["ok"] for r in body["records"]) and body["started_unix"] <= body["ended_unix"]
    assert body["ended_unix"] - body["started_unix"] >= q["waited_s"]  # the wait counts in the visit's cost


def test_a_two_thread_server_counts_its_threads_and_the_waiting_client_as_its_own_load():
    # the load a two-thread visit leaves behind on 2 cores (both threads busy, the client runnable
    # and waiting for a core) is the run's own, not another job's: read against one thread, every
    # visit would wait out its bound and be flagged
    assert hostload.own_load(None) == hostload.own_load(1) == hostload.own_load(1, 2) == 1.0
    assert hostload.own_load(2) == 2.0 and hostload.own_load(2, 4) == 2.0 and hostload.own_load(2, 2) == 3.0
    assert hostload.external_load(2.9, 0.5) is True
    assert hostload.external_load(2.9, 0.5, hostload.own_load(2, 2)) is False
    assert hostload.external_load(3.6, 0.5, hostload.own_load(2, 2)) is True
    t = FakeTime([2.9])
    q = t.guard(own=hostload.own_load(2, 2))
    assert q["waited_s"] == 0.0 and not q["timed_out"] and t.slept == []
    t = FakeTime([2.3, 2.3, 1.4])
    q = t.guard()
    assert q["waited_s"] == 10.0 and not q["timed_out"]  # one thread's own load: it waits for 1.4
