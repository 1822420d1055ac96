"""The embedded engine's side of the cost channel: the program valgrind runs.

:mod:`pairbench.measure.cost` starts it under ``valgrind --tool=callgrind --instr-atstart=no`` with
the arm's interpreter, as ``python cost_driver.py <request.json>``. It uses the standard library and
the arm's own ``engine`` package only (the arm's exported tree goes first on ``sys.path``), so it runs
in the arm's environment and counts the arm's code.

What it does, in order:

1. Sets the engine up as ``python -m engine serve <the arm's launch flags>`` does, without the HTTP
   server: the arm's own command line parses the flags (its ``serve`` is captured, not called);
   then glibc's malloc tuning (``engine.server.tune_malloc``) where the flags keep it on, one torch
   thread, the model loaded by ``engine.server.Engine`` with one native decode thread, and its
   ``Scheduler``; the scheduler thread that ``Engine.load`` starts is never started
   (:func:`no_scheduler_thread`), and this program calls ``Scheduler.step`` itself. Threads are one whatever the flags say: valgrind runs
   one thread at a time, and a barrier's spinning would be counted as work.
2. Sends a warm-up request (the first request's prompt cut to ``warmup_tokens``), never counted: a
   visit's first request is a diagnostic too, and the first pass through each path initialises
   buffers and caches that a steady request finds ready.
3. Per request (one per condition: its real prompt's token ids and ``decode_tokens``): submits it
   with prefix reuse off and end-of-sequence ignored, then steps the scheduler until it finishes,
   with callgrind's instrumentation switched on only inside the steps: the steps that read the
   prompt are dumped as ``<condition>:prefill``, the decode steps as ``<condition>:decode``. The
   first generated token comes from the prefill's logits (it is sampled inside the last prefill
   step), so ``decode_tokens`` decode steps need ``max_tokens = decode_tokens + 1``.

Outside valgrind (``RUNNING_ON_VALGRIND`` is 0) the client requests do nothing, so the same program
runs natively, which is how its tests check the request it makes. It prints one JSON line: what ran
(tokens per phase, the generated ids, the engine's ISA path and linear format).

The client requests come from ``libpbcost.so``, a few lines of C over ``<valgrind/callgrind.h>``
compiled by the harness (:func:`pairbench.measure.cost.client_library`), loaded through ctypes.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import json
import sys
import time
import types


class Sink:
    """The scheduler's per-request side: collects the generated ids, records how it ended."""

    def __init__(self):
        self.tokens: list[int] = []
        self.reason: str | None = None
        self.error: BaseException | None = None

    def started(self, reuse: int, limit: int) -> None:
        self.reuse, self.limit = reuse, limit

    def token(self, token: int) -> bool:
        self.tokens.append(int(token))
        return False

    def finished(self, reason: str) -> None:
        self.reason = reason

    def failed(self, exc: BaseException) -> None:
        self.error = exc

    @property
    def done(self) -> bool:
        return self.reason is not None or self.error is not None


class Client:
    """callgrind's client requests (no-ops outside valgrind)."""

    def __init__(self, path: str | None):
        self.lib = ctypes.CDLL(path) if path else None
        if self.lib is not None:
            self.lib.pb_dump.argtypes = [ctypes.c_char_p]

    def on_valgrind(self) -> int:
        return int(self.lib.pb_running_on_valgrind()) if self.lib else 0

    def start(self) -> None:
        if self.lib:
            self.lib.pb_start()

    def stop(self) -> None:
        if self.lib:
            self.lib.pb_stop()

    def dump(self, label: str) -> None:
        if self.lib:
            self.lib.pb_dump(label.encode())


def serve_arguments(args: list[str]) -> dict:
    """What the arm's own command line makes of ``python -m engine serve <args>``: its ``serve``
    keyword arguments, captured instead of serving (so every launch flag of the arm counts)."""
    from engine import __main__ as cli
    from engine import server

    captured: dict = {}

    def capture(spec, **kw):
        captured.update(kw, spec=spec)
        return 0

    saved, server.serve = server.serve, capture
    try:
        code = cli.main(["serve", *args])
    finally:
        server.serve = saved
    if not captured:
        raise RuntimeError(f"`python -m engine serve {' '.join(args)}` exited {code} without serving")
    return captured


class _Unstarted:
    """A ``threading.Thread`` that is never started."""

    def __init__(self, *args, **kwargs):
        pass

    def start(self) -> None:
        pass


@contextlib.contextmanager
def no_scheduler_thread(server):
    """``Engine.load`` as the arm wrote it, minus the scheduler thread it starts: this program steps
    the scheduler itself, and a second thread (even one that only waits and exits) changes what
    malloc hands out later, by ~0.02% of the counted instructions (measured, docs/cost.md)."""
    real = server.threading
    server.threading = types.SimpleNamespace(**{k: getattr(real, k) for k in dir(real) if not k.startswith("__")})
    server.threading.Thread = _Unstarted
    try:
        yield
    finally:
        server.threading = real


def setup(req: dict):
    """The engine as ``serve`` builds it from the arm's launch flags, on one thread (torch's and the
    native pool's), its scheduler stopped."""
    sys.path.insert(0, req["src"])
    import torch
    from engine import native, server

    kw = serve_arguments(req["serve_args"])
    tuned = server.tune_malloc() if kw.get("malloc_tuning", True) else {}
    torch.set_num_threads(1)
    served = getattr(server, "ServedModel", None) or server.Engine  # the class's name before 2026-12-06
    # The arm's fast-path settings as its launch gave them (fused_decode, and the fast paths another
    # arm's code turned off: docs/fidelity.md), so the count runs the code the wall clock measured; an
    # engine from before fast paths takes neither.
    accepted = inspect.signature(served).parameters
    fast = {k: kw[k] for k in ("fused_decode", "fast_paths_off") if k in kw and k in accepted}
    eng = served(kw["spec"], kw.get("max_context"), kw["linear"], 1, kw["kv"], kw.get("parallel", 1),
                 kw.get("batch_tokens"), kw.get("max_queue", 128), **fast)
    with no_scheduler_thread(server):
        eng.load()
    return eng, {"malloc": sorted(tuned), "isa": native.isa(), "linear": eng.loaded.linear,
                 "kv": str(eng.loaded.kv_dtype), "torch_threads": torch.get_num_threads(),
                 "native_threads": native.threads(), "slots": eng.parallel, "batch_tokens": eng.batch_tokens,
                 "fast_paths": getattr(eng.loaded, "fast_paths", None)}


def run_request(eng, ids: list[int], decode_tokens: int, client: Client | None, label: str | None,
                phases: tuple[str, ...] = ("prefill", "decode")) -> dict:
    """Submit one request and step the scheduler until it ends, counting the steps of each phase in
    *phases* apart when *client* is given (a phase left out still runs, uncounted)."""
    from engine.scheduler import Sequence

    sink = Sink()
    seq = Sequence(list(ids), decode_tokens + 1, sink, temperature=0.0, ignore_eos=True, cache_prompt=False)
    eng.scheduler.submit(seq)
    steps = {"prefill": 0, "decode": 0}
    phase = "prefill"
    while not sink.done:
        now = "prefill" if seq.slot < 0 or seq.prefilled < len(seq.ids) else "decode"
        if client and now != phase and phase in phases:
            client.dump(f"{label}:{phase}")
        phase = now
        counted = client is not None and now in phases
        if counted:
            client.start()
        eng.scheduler.step()
        if counted:
            client.stop()
        steps[now] += 1
    if client and phase in phases:
        client.dump(f"{label}:{phase}")
    if sink.error is not None:
        raise RuntimeError(f"request {label}: the engine failed: {sink.error!r}")
    return {"prompt_tokens": len(ids), "decode_steps": steps["decode"], "prefill_steps": steps["prefill"],
            "tokens": sink.tokens, "finish": sink.reason}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: cost_driver.py <request.json>", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        req = json.load(f)
    client = Client(req.get("client_library"))
    t0 = time.monotonic()
    eng, facts = setup(req)
    t_load = time.monotonic() - t0
    first = req["requests"][0]["ids"]
    warm = first[: max(1, min(len(first), int(req.get("warmup_tokens", 32))))]
    run_request(eng, warm, int(req.get("warmup_decode", 2)), None, None)
    done = []
    for r in req["requests"]:
        t1 = time.monotonic()
        out = run_request(eng, r["ids"], int(r["decode_tokens"]), client, r["condition"],
                          tuple(r.get("phases", ("prefill", "decode"))))
        done.append({"condition": r["condition"], **out, "seconds": round(time.monotonic() - t1, 3)})
    print(json.dumps({"on_valgrind": client.on_valgrind(), "load_seconds": round(t_load, 3), **facts,
                      "requests": done}, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
