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
arm's engine profile, so :func:`pairbench.engines.policy.check_slots` checks it. Every default is the
schema's (:data:`LOAD_DEFAULTS`, read from it).
"""

from __future__ import annotations

import copy
from typing import Iterator

from pairbench.core import configschema
from pairbench.core.configsource import ConfigError
from pairbench.core.metrics import NAMES, NOT_TESTABLE, load_defaults, percentile_of
from pairbench.core.slo import BOUNDS, SLO, min_requests

LOAD_DEFAULTS = configschema.defaults("load")  # the nested slo and validity maps filled too

# The client's CPU per streamed request, from bench/load_client.py (docs/load.md, measured under the
# exclusive CPU lock): 2.4-2.6 ms per 64-token request in closed loop, 4.1-5.2 ms in open loop (each
# request pays its own wake-ups there). The highest open-loop figure, rounded up, per 64 output
# tokens; a rate whose predicted client CPU share reaches load.validity.client_cpu_share would fail
# every level's client_cpu check, so it is refused before anything runs.
CLIENT_CPU_MS_PER_REQUEST = 5.3
CLIENT_CPU_TOKENS = 64


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


def _has_slo(load: dict) -> bool:
    d = load.get("slo") or {}
    return isinstance(d, dict) and any(d.get(b) is not None for b in BOUNDS)


def slo(load: dict) -> SLO | None:
    """The run's SLO, or None when ``load.slo`` gives no bound (then no goodput and no capacity)."""
    d = load.get("slo") or {}
    if all(d.get(b) is None for b in BOUNDS):
        return None
    return SLO.from_dict(d)


def factor(load: dict) -> str:
    """The run's load factor (:data:`pairbench.core.conditions.LOAD_FACTORS`): ``concurrency``
    (closed loop) or ``rate`` (open loop)."""
    return "rate" if load.get("rate") else "concurrency"


def checks(cfg: dict) -> Iterator[ConfigError]:
    """Every problem of a normalized config's ``load`` section (and what it asks of the rest)."""
    load = cfg.get("load")
    if load is None:
        return
    conc, rate = load.get("concurrency"), load.get("rate")
    if (conc is None) == (rate is None):
        yield ConfigError("load", "give either load.concurrency (closed loop: streams) or load.rate (open loop: "
                          "requests/s), not " + ("both" if conc is not None else "neither"))
        return
    load_factor, levels = ("concurrency", conc) if conc is not None else ("rate", rate)
    for i, v in enumerate(levels if load_factor == "concurrency" else []):
        if not isinstance(v, int) or isinstance(v, bool):  # JSON Schema counts 2.0 as an integer
            why = (f"streams: a number of streams is a whole number (write {int(v)})"
                   if isinstance(v, float) and v.is_integer() else "is not a whole number of streams")
            yield ConfigError(("load", "concurrency", i), f"{v!r} {why}")
            return
    if any(b <= a for a, b in zip(levels, levels[1:])):
        yield ConfigError(("load", load_factor), f"levels must increase ({levels}): the load curve and its SLO capacity "
                          "are read from the lowest load to the highest")
    yield from _request_checks(load, load_factor, levels)
    try:
        slo(load)
    except ConfigError as exc:
        yield exc
    if rate is not None:
        yield from _client_checks(cfg, load)
    yield from _metric_checks(cfg, load)
    if cfg.get("repeats", 1) != 1:
        yield ConfigError("repeats", f"a load run measures each level once per visit, with load.requests "
                          f"requests; repeats must be 1, got {cfg['repeats']}")


def _metric_checks(cfg: dict, load: dict) -> Iterator[ConfigError]:
    """The stats lists against the load section: a percentile metric of a percentile not measured,
    an SLO metric without an SLO, or an SLO metric tested (0 when nothing met the SLO: no ratio)."""
    stats = cfg.get("stats") or {}
    pct = load.get("percentiles") or []
    for key in ("metrics", "secondary"):
        for i, name in enumerate(stats.get(key) or []):
            q = percentile_of(str(name))
            if q is not None and q not in pct:
                yield ConfigError(("stats", key, i), f"{name} needs p{q} in load.percentiles "
                                  f"({', '.join(map(str, pct))}): no other percentile is computed")
            if name in NOT_TESTABLE and not _has_slo(load):
                yield ConfigError(("stats", key, i), f"{name} needs an SLO: give a bound in load.slo")
            elif name in NOT_TESTABLE and key == "metrics":
                yield ConfigError(("stats", "metrics", i), f"{name} cannot be tested: it is 0 in a round where no "
                                  "request met the SLO, and a paired ratio has no value there; list it in "
                                  "stats.secondary (shown) and test the SLO through its capacity")


def _request_checks(load: dict, load_factor: str, levels: list) -> Iterator[ConfigError]:
    pct = load["percentiles"]
    need = min_requests(pct)
    if load["requests"] < need:
        worst = max(pct)
        yield ConfigError(("load", "requests"), f"{load['requests']} measured requests per level are too few for "
                          f"the p{worst} latencies (needs {need}: at least one request at or beyond the "
                          f"percentile); raise load.requests or lower load.percentiles")
    if load_factor == "concurrency":
        total = load["requests"] + load["warmup"]
        if total <= max(levels):
            yield ConfigError(("load", "requests"), f"{load['requests']} + {load['warmup']} warm-up requests cannot "
                              f"hold {max(levels)} streams busy (every request would go out at once); send "
                              f"more than {max(levels)} per level")


def _client_checks(cfg: dict, load: dict) -> Iterator[ConfigError]:
    """A rate whose predicted client CPU share (:data:`CLIENT_CPU_MS_PER_REQUEST`) reaches the bound."""
    outs = cfg.get("output_tokens")
    longest = max(outs) if isinstance(outs, list) else outs
    per_request_ms = CLIENT_CPU_MS_PER_REQUEST * max(1.0, (longest or 0) / CLIENT_CPU_TOKENS)
    bound = load["validity"][NAMES.client_cpu_share]
    for i, r in enumerate(load["rate"]):
        share = r * per_request_ms / 1e3
        if share >= bound:
            yield ConfigError(
                ("load", "rate", i), f"{r:g} requests/s would cost the client about {share:.2f} of a CPU core "
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
