"""How a server serves a load run: its slots, the single-stream caps a load run drops, its idle probe.

A profile's optional ``load`` section (config/engines/*.yaml, workflow/schemas/engine_profile.schema.json):

- ``slots: {flag, default, context}``: how many requests the server serves at once. The value after
  the *last* ``flag`` of the rendered command line (an arm's ``args`` come after the profile's own,
  and llama.cpp's and the embedded engine's parsers keep the last), else ``default`` (None: unknown).
  ``context: shared`` says the server divides its ``{ctx}`` among its slots (llama-server's ``-c``
  without ``--kv-unified``), so a load run hands it ``ctx × slots`` and every slot still holds the
  longest request; ``per_slot`` (the embedded engine's ``--max-context``) needs nothing.
- ``single_stream_flags``: the items that cap a server at one sequence for single-stream runs
  (vLLM ``--max-num-seqs 1``, SGLang ``--max-running-requests 1``); a load run drops them.
- ``idle: {path, format, gauges}``: how the harness sees the server is idle before a level:
  ``prometheus`` (every listed gauge 0: requests running and waiting), or ``llama-slots``
  (llama-server's ``/slots``: no slot ``is_processing``). Without it, idleness is unverified and the
  level record says so.

Nothing here judges a config: :func:`pairbench.engines.policy.check_slots` does, with these.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from pairbench.engines.profiles import EngineError, EngineProfile


@dataclass(frozen=True)
class LoadSpec:
    """A profile's ``load`` section, typed (defaults: one slot per server, nothing dropped, no probe)."""

    slots_flag: str | None = None
    slots_default: int | None = 1
    shared_context: bool = False
    single_stream_flags: tuple[str, ...] = ()
    idle_path: str | None = None
    idle_format: str | None = None
    idle_gauges: tuple[str, ...] = ()


def load_spec(profile: EngineProfile) -> LoadSpec:
    d = profile.data.get("load") or {}
    slots, idle = d.get("slots") or {}, d.get("idle") or {}
    return LoadSpec(slots_flag=slots.get("flag"), slots_default=slots.get("default", 1) if slots else 1,
                    shared_context=slots.get("context") == "shared",
                    single_stream_flags=tuple(d.get("single_stream_flags") or ()),
                    idle_path=idle.get("path"), idle_format=idle.get("format"),
                    idle_gauges=tuple(idle.get("gauges") or ()))


def slots_in(spec: LoadSpec, argv: list[str]) -> int | None:
    """The slots a command line gives: the value after its last slots flag (``--parallel 4`` or
    ``--parallel=4``), else the profile's default (None: unknown). A value that is not a positive
    integer is an :class:`EngineError` naming the flag."""
    if not spec.slots_flag:
        return spec.slots_default
    value = None
    for i, item in enumerate(argv):
        if item == spec.slots_flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif item.startswith(spec.slots_flag + "="):
            value = item.split("=", 1)[1]
    if value is None:
        return spec.slots_default
    if not re.fullmatch(r"[1-9][0-9]*", str(value)):
        raise EngineError(f"{spec.slots_flag} {value!r}: the server's slots must be a positive integer")
    return int(value)


def without_single_stream_flags(spec: LoadSpec, argv: list[str]) -> list[str]:
    """*argv* with the profile's single-stream cap (a contiguous run of items) removed, wherever it is."""
    run = list(spec.single_stream_flags)
    if not run:
        return list(argv)
    out, i = [], 0
    while i < len(argv):
        if argv[i:i + len(run)] == run:
            i += len(run)
            continue
        out.append(argv[i])
        i += 1
    return out


def _prometheus(text: str, gauges: tuple[str, ...]) -> dict[str, float]:
    """The sum over labels of each named gauge in a Prometheus text exposition (absent: not listed)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m and m.group(1) in gauges:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def busy(spec: LoadSpec, http, url: str) -> dict | None:
    """What the server says it is doing now: ``{gauge or "processing": count}``; None when the
    profile names no probe. An unreadable reply is an :class:`EngineError`."""
    if not spec.idle_path:
        return None
    resp = http.get(url + spec.idle_path, timeout=10.0)
    if resp.status_code != 200:
        raise EngineError(f"idle probe GET {spec.idle_path}: HTTP {resp.status_code}: {resp.text[:200]}")
    if spec.idle_format == "llama-slots":
        slots = resp.json()
        if not isinstance(slots, list):
            raise EngineError(f"idle probe GET {spec.idle_path}: not a list of slots: {resp.text[:200]}")
        return {"processing": sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing"))}
    found = _prometheus(resp.text, spec.idle_gauges)
    missing = [g for g in spec.idle_gauges if g not in found]
    if missing:
        raise EngineError(f"idle probe GET {spec.idle_path}: no gauge {', '.join(missing)}")
    return found


def wait_idle(spec: LoadSpec, http, url: str, *, timeout_s: float, interval_s: float = 0.05) -> dict:
    """Wait until the server reports nothing running or waiting: ``{"verified", "waited_s", "busy"}``
    (``verified`` False without a probe; ``busy`` what it last reported). Past *timeout_s* it stops
    waiting and returns ``verified`` False with the last report: the level record discloses it."""
    t0 = time.monotonic()
    while True:
        state = busy(spec, http, url)
        waited = time.monotonic() - t0
        if state is None:
            return {"verified": False, "waited_s": 0.0, "busy": None, "how": "no idle probe in the engine's profile"}
        if not any(state.values()):
            return {"verified": True, "waited_s": waited, "busy": state, "how": f"GET {spec.idle_path}"}
        if waited > timeout_s:
            return {"verified": False, "waited_s": waited, "busy": state,
                    "how": f"GET {spec.idle_path}: still busy after {timeout_s:g} s"}
        time.sleep(interval_s)  # a handful of polls after the last request finished
