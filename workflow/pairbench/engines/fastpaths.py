"""An engine's native fast paths across the arms of one comparison: what each arm is launched with.

The embedded engine runs parts of its Python model as native code (docs/fidelity.md). It checks,
at load, that the arm's code is the code each fast path was written against, and where it is not,
that fast path steps aside and the arm's own Python code runs. Alone, that would make a comparison
of a patched arm against a stock one measure fast path against slow path, not the patch. So every
arm of a run is launched with what *any* arm's code turned off, from the checks the builds recorded
(``build/<arm>.json``'s ``fast_paths``, the profile's ``fast_paths.check``):

- ``engine_options.fused_decode: auto`` (the default): the arm runs every fast path no arm's code
  turned off; the ones another arm's code turned off are passed as the profile's ``off_flag``
  (those its own code turned off, the engine turns off itself, and says why);
- ``off``: the Python decode path in this arm (``mode_flag off``), whatever the code, and the same
  fast paths off as ``auto``: setting it on one arm alone is a comparison of the paths, on purpose;
- ``on``: every fast path must run; where any arm's code turned one off, the run is refused
  (:class:`FastPathConflict`), naming the arm and the objects whose code differs.

:func:`resolve` decides, :class:`Launch` is one arm's decision; the warmup records it beside the
engine's own facts (``warmup/<arm>.json``: ``fast_paths``, ``engine_facts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pairbench.engines.specs import EngineError

MODES = ("auto", "on", "off")


class FastPathConflict(EngineError):
    """``engine_options.fused_decode: on`` in a run where some arm's code turned a fast path off."""


@dataclass(frozen=True)
class Launch:
    """One arm's fast-path settings: its ``mode``, the fast paths turned ``off`` at launch for the
    sake of the comparison, and ``why`` (per fast path: the arms and objects whose code differs)."""

    mode: str = "auto"
    off: tuple[str, ...] = ()
    why: dict = field(default_factory=dict)

    def record(self) -> dict:
        return {"mode": self.mode, "off": list(self.off), "why": dict(self.why)}


def mode_of(arm_cfg: dict) -> str:
    """The arm's ``engine_options.fused_decode`` (``auto`` where none is given; YAML's bare on/off,
    read as true/false, is ``on``/``off``)."""
    mode = (arm_cfg.get("engine_options") or {}).get("fused_decode")
    return {True: "on", False: "off", None: "auto"}.get(mode, mode) if isinstance(mode, (bool, type(None))) else mode


def turned_off(checks: dict[str, dict | None]) -> dict[str, dict[str, list[str]]]:
    """``{fast path: {arm: [objects whose code differs, or the error]}}`` over every arm's recorded
    check (*checks*: arm -> its build's ``fast_paths``; None: the engine has none, or it could not be
    judged, and turns nothing off)."""
    out: dict[str, dict[str, list[str]]] = {}
    for arm, check in checks.items():
        for name, c in (check or {}).items():
            if not c["matches"]:
                out.setdefault(name, {})[arm] = list(c["differs"]) or [c["error"] or "unverified"]
    return out


def _why(by_arm: dict[str, list[str]]) -> str:
    return "; ".join(f"arm {arm}'s code differs: {', '.join(objs)}" for arm, objs in sorted(by_arm.items()))


def resolve(arm: str, mode: str, checks: dict[str, dict | None]) -> Launch:
    """*arm*'s :class:`Launch` among the arms of one run. *mode*: its ``fused_decode`` setting;
    *checks*: arm -> its build's ``fast_paths`` (every arm of the run). Raises
    :class:`FastPathConflict` where *arm* asks for ``on`` and some arm's code turned a fast path off."""
    if mode not in MODES:
        raise EngineError(f"arms.{arm}.engine_options.fused_decode: {mode!r} is not one of {', '.join(MODES)}")
    if checks.get(arm) is None:
        return Launch(mode=mode)  # an engine without checked fast paths: nothing to turn off
    off = turned_off(checks)
    if mode == "on" and off:
        named = "; ".join(f"{name}: {_why(by_arm)}" for name, by_arm in sorted(off.items()))
        raise FastPathConflict(
            f"arm {arm}: engine_options.fused_decode is on, but these fast paths cannot run in every arm of the "
            f"run ({named}). The arms would compare a fast path against the Python code it stands in for. "
            "Set fused_decode auto (every arm runs the Python code there) or off")
    own = {name for name, by_arm in off.items() if arm in by_arm}  # the engine turns these off itself
    others = {name: by_arm for name, by_arm in off.items() if name not in own}
    return Launch(mode=mode, off=tuple(sorted(others)), why={name: _why(b) for name, b in sorted(others.items())})


def notes(arm: str, facts: dict | None, launch: dict | None) -> list[str]:
    """Lines for a log or a report: each fast path that is off in *arm* where code, not the host,
    turned it off, and why (from its warmup's ``engine_facts`` and ``fast_paths``)."""
    out = []
    launched_off = set((launch or {}).get("off") or [])
    for name, fact in ((facts or {}).get("fast_paths") or {}).items():
        if not isinstance(fact, dict) or fact.get("on", True):
            continue
        if name in launched_off:
            out.append(f"arm {arm}: fast path {name} off for the comparison ({launch['why'].get(name, '')})")
        elif fact.get("differs"):
            out.append(f"arm {arm}: fast path {name} off: its code differs ({', '.join(fact['differs'])}); "
                       "the arm's own Python code runs")
    return out
