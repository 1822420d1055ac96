"""A load run's config (``load:``): its defaults and the checks a JSON Schema cannot express.

A config with a ``load`` section is a *load run*: every condition is a load level, a closed-loop
concurrency (``load.concurrency``, N streams each sending its next request when its last one
finished) or an open-loop request rate (``load.rate``, seeded Poisson or gamma arrivals), crossed
with the input and output lengths (:mod:`pairbench.core.conditions`). Every key is in
workflow/schemas/config.schema.yaml and config/README.md; docs/load.md says what a level measures.

What is caught here, before anything runs, each error naming its key: both or neither of
``concurrency`` and ``rate``; levels out of order; too few requests for the percentiles
(:func:`pairbench.core.slo.min_requests`) or to hold the streams busy; a rate the client cannot
sustain (its measured cost, :data:`CLIENT_CPU_MS_PER_REQUEST`); repeats; an SLO that cannot be read;
primary metrics of the wrong scope (``stats.metrics``). More streams than an arm's slots needs the
arm's engine profile, so :mod:`pairbench.engines.slots` checks it.
"""

from __future__ import annotations

import copy
import re
from typing import Iterator

from pairbench.core.metrics import NOT_TESTABLE, load_defaults
from pairbench.core.slo import BOUNDS, SLO, min_requests

LOAD_DEFAULTS = {
    "concurrency": None,
    "rate": None,
    "requests": 100,
    "warmup": 4,
    "burstiness": 1.0,
    "slo": {"ttft_ms": None, "itl_ms": None, "e2e_ms": None, "attainment": 0.9},
    "percentiles": [50, 99],
    "prefix": "distinct",
    "timeout_s": 120,
    "allow_queueing": False,
    "validity": {"lag_p99_ms": 20.0, "client_cpu_share": 0.8, "load_tolerance": 0.05},
}

# The client's CPU per streamed request, from bench/load_client.py (docs/load.md, measured under the
# exclusive CPU lock): 2.4-2.6 ms per 64-token request in closed loop, 4.1-5.2 ms in open loop (each
# request pays its own wake-ups there). The highest open-loop figure, rounded up, per 64 output
# tokens; a rate whose predicted client CPU share reaches load.validity.client_cpu_share would fail
# every level's client_cpu check, so it is refused before anything runs.
CLIENT_CPU_MS_PER_REQUEST = 5.3
CLIENT_CPU_TOKENS = 64


class LoadConfigError(ValueError):
    """A load section that cannot run; the message starts with the config key."""


def normalized_load(given: dict) -> dict:
    """The ``load`` section with every default filled (the nested ``slo`` and ``validity`` too)."""
    out = {**copy.deepcopy(LOAD_DEFAULTS), **copy.deepcopy(given)}
    for key in ("slo", "validity"):
        out[key] = {**LOAD_DEFAULTS[key], **(given.get(key) or {})}
    return out


def section(config: dict) -> dict | None:
    """The normalized ``load`` section of *config*, or None when it says nothing beyond the defaults
    (absent, null, ``{}``, or the defaults the schema fills in): then the run is not a load run."""
    given = config.get("load")
    if not isinstance(given, dict):
        return None
    out = normalized_load(given)
    return None if out == normalized_load({}) else out


def is_load(config: dict) -> bool:
    """Whether *config* is a load run (its ``load`` section says something)."""
    return section(config) is not None


def stats_defaults(config: dict) -> dict:
    """The defaults of ``stats.metrics``, ``secondary`` and ``memory`` for *config*: a load run's
    (:func:`pairbench.core.metrics.load_defaults`) or {} (the single-stream defaults stand)."""
    load = section(config)
    if load is None:
        return {}
    pct = load["percentiles"] or LOAD_DEFAULTS["percentiles"]
    try:
        return {k: list(v) for k, v in load_defaults(pct, slo=_has_slo(load)).items()}
    except (TypeError, ValueError):  # bad percentiles: the schema names them
        return {}


def with_stats_defaults(config: dict) -> dict:
    """*config* with a load run's ``stats`` defaults written in where the user gave none, before the
    schema fills the single-stream ones (``snakemake.utils.validate`` fills nested defaults)."""
    defaults = stats_defaults(config)
    if not defaults:
        return config
    out = dict(config)
    stats = dict(out.get("stats") or {})
    for key, value in defaults.items():
        stats.setdefault(key, value)
    out["stats"] = stats
    return out


def _has_slo(load: dict) -> bool:
    d = load.get("slo") or {}
    return isinstance(d, dict) and any(d.get(b) is not None for b in BOUNDS)


def slo(load: dict) -> SLO | None:
    """The run's SLO, or None when ``load.slo`` gives no bound (then no goodput and no capacity)."""
    d = load.get("slo") or {}
    if all(d.get(b) is None for b in BOUNDS):
        return None
    return SLO.from_dict(d)


def mode(load: dict) -> str:
    """``concurrency`` (closed loop) or ``rate`` (open loop)."""
    return "rate" if load.get("rate") else "concurrency"


def checks(cfg: dict) -> Iterator[LoadConfigError]:
    """Every problem of a normalized config's ``load`` section (and what it asks of the rest)."""
    load = cfg.get("load")
    if load is None:
        return
    conc, rate = load.get("concurrency"), load.get("rate")
    if (conc is None) == (rate is None):
        yield LoadConfigError("load: give either load.concurrency (closed loop: streams) or load.rate (open loop: "
                              "requests/s), not " + ("both" if conc is not None else "neither"))
        return
    key, levels = ("load.concurrency", conc) if conc is not None else ("load.rate", rate)
    for i, v in enumerate(levels if key == "load.concurrency" else []):
        if not isinstance(v, int) or isinstance(v, bool):  # JSON Schema counts 2.0 as an integer
            why = (f"streams: a number of streams is a whole number (write {int(v)})"
                   if isinstance(v, float) and v.is_integer() else "is not a whole number of streams")
            yield LoadConfigError(f"load.concurrency[{i}]: {v!r} {why}")
            return
    if any(b <= a for a, b in zip(levels, levels[1:])):
        yield LoadConfigError(f"{key}: levels must increase ({levels}): the load curve and its SLO capacity "
                              "are read from the lowest load to the highest")
    yield from _request_checks(cfg, load, key, levels)
    try:
        slo(load)
    except ValueError as exc:
        yield LoadConfigError(str(exc))
    if rate is not None:
        yield from _client_checks(cfg, load)
    yield from _metric_checks(cfg, load)
    if cfg.get("repeats", 1) != 1:
        yield LoadConfigError(f"repeats: a load run measures each level once per visit, with load.requests "
                              f"requests; repeats must be 1, got {cfg['repeats']}")


def _metric_checks(cfg: dict, load: dict) -> Iterator[LoadConfigError]:
    """The stats lists against the load section: a percentile metric of a percentile not measured,
    an SLO metric without an SLO, or an SLO metric tested (0 when nothing met the SLO: no ratio)."""
    stats = cfg.get("stats") or {}
    pct = load.get("percentiles") or []
    for key in ("metrics", "secondary"):
        for i, name in enumerate(stats.get(key) or []):
            m = re.fullmatch(r"[a-z]+_p(\d+)_ms", str(name))
            if m and int(m.group(1)) not in pct:
                yield LoadConfigError(f"stats.{key}[{i}]: {name} needs p{m.group(1)} in load.percentiles "
                                      f"({', '.join(map(str, pct))}): no other percentile is computed")
            if name in NOT_TESTABLE and not _has_slo(load):
                yield LoadConfigError(f"stats.{key}[{i}]: {name} needs an SLO: give a bound in load.slo")
            elif name in NOT_TESTABLE and key == "metrics":
                yield LoadConfigError(f"stats.metrics[{i}]: {name} cannot be tested: it is 0 in a round where no "
                                      "request met the SLO, and a paired ratio has no value there; list it in "
                                      "stats.secondary (shown) and test the SLO through its capacity")


def _request_checks(cfg: dict, load: dict, key: str, levels: list) -> Iterator[LoadConfigError]:
    pct = load["percentiles"]
    need = min_requests(pct)
    if load["requests"] < need:
        worst = max(pct)
        yield LoadConfigError(f"load.requests: {load['requests']} measured requests per level are too few for "
                              f"the p{worst} latencies (needs {need}: at least one request at or beyond the "
                              f"percentile); raise load.requests or lower load.percentiles")
    if key == "load.concurrency":
        total = load["requests"] + load["warmup"]
        if total <= max(levels):
            yield LoadConfigError(f"load.requests: {load['requests']} + {load['warmup']} warm-up requests cannot "
                                  f"hold {max(levels)} streams busy (every request would go out at once); send "
                                  f"more than {max(levels)} per level")


def _client_checks(cfg: dict, load: dict) -> Iterator[LoadConfigError]:
    """A rate whose predicted client CPU share (:data:`CLIENT_CPU_MS_PER_REQUEST`) reaches the bound."""
    outs = cfg.get("output_tokens")
    longest = max(outs) if isinstance(outs, list) else outs
    per_request_ms = CLIENT_CPU_MS_PER_REQUEST * max(1.0, (longest or 0) / CLIENT_CPU_TOKENS)
    bound = load["validity"]["client_cpu_share"]
    for i, r in enumerate(load["rate"]):
        share = r * per_request_ms / 1e3
        if share >= bound:
            yield LoadConfigError(
                f"load.rate[{i}]: {r:g} requests/s would cost the client about {share:.2f} of a CPU core "
                f"({per_request_ms:.1f} ms per {longest}-token request, measured by bench/load_client.py), at "
                f"or above load.validity.client_cpu_share ({bound:g}): the client, not the engine, would set "
                f"the pace; the highest rate it sustains is about {bound * 1e3 / per_request_ms:.0f} requests/s")


def level_order(conditions: list, round_: int, block: int = 1) -> list:
    """The order a visit of round *round_* measures the levels in: the plan's order in the first
    block of *block* rounds (the visit order's counterbalanced block, e.g. 2 for ABBA with two arms),
    reversed in the next, and so on; both arms of a round share it. Flipping per block, not per
    round, crosses the direction with each arm's position in the round: with ABBA and a flip every
    round, the arm visiting first would always go forward and the other always in reverse, so the
    candidate's lightest level would always follow the baseline's heaviest."""
    return list(conditions) if ((round_ - 1) // block) % 2 == 0 else list(reversed(conditions))
