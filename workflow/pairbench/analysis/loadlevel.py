"""One load level's metrics and validity, from the raw times its measure record keeps.

Input: a level record of a measure artifact (:mod:`pairbench.measure.loadvisit`): its condition, its
gates, the idle wait before it, and under ``client`` what the load client saw (the level's wall and
client CPU time, the schedule's offered rate, and per request when it was due, sent and ended, in s
since the level started, and each token's arrival in s since its request was sent). Output: a frozen
:class:`LevelMetrics` (flat JSON via ``to_dict``, units in the key names) and a :class:`Validity`
naming every check the level failed; :func:`judged` puts both into a visit's level records, as the
stages that read a visit (validation, statistics, adaptive rounds, the report) see them. Nothing here
sends a request, and nothing of it is stored by the measurement: a change to a definition below
reruns ``stats``, never a visit.

Definitions (``measured`` = the level's requests after its ``warmup`` first ones; ``ok`` = completed
with ``[DONE]``):

- **window**: from the first measured request's send to the last measured request's end. With no
  warm-up that is vLLM's benchmark duration (first send → last completion).
- ``output_tok_s``: output tokens of the whole system per second: every completed request's tokens
  whose arrival falls inside the window, over the window (with no warm-up: all output tokens over
  the duration, vLLM's ``output_throughput``). ``requests_s``: measured ok requests / window.
- Per request: ``ttft`` = its first token's arrival, ``itl`` = the gaps between consecutive tokens'
  arrivals, ``e2e`` = end − send, ``tpot`` (:func:`pairbench.core.slo.tpot_ms`), the schedule lag =
  send − due. Latency percentiles over the measured ok requests: ``ttft``, ``e2e``, ``tpot``, and
  ``itl`` over every inter-token gap of those requests pooled (as vLLM pools them). **Percentile method**: numpy's ``"linear"`` (Hyndman & Fan type 7, numpy's
  and vLLM's default): the q-th percentile of n sorted values x₀…xₙ₋₁ is x at rank h = (n − 1)·q/100,
  linearly interpolated between x⌊h⌋ and x⌈h⌉.
- ``slo_attainment``: the share of measured requests that are *good* (:class:`pairbench.core.slo.SLO`,
  vLLM's ``--goodput`` rule; a failed request counts, and is not good). ``goodput_rps``: measured
  good requests / window, vLLM's ``request_goodput``.
- Achieved load. Closed loop: ``achieved_concurrency``, the time-averaged number of requests in
  flight from the first send to the last send (while every stream still has work; the drain after
  the last send is left out, since no client could keep N streams busy then). Open loop:
  ``achieved_rate_rps`` = (n − 1) / (last send − first send), beside the schedule's
  ``offered_rate_rps``. Schedule lag: p99 and max of every request's ``lag_ms`` (open loop: send −
  scheduled; closed loop: send − the moment its stream became free).
- Client CPU: ``client_cpu_s`` over the level, ``client_cpu_share`` = that / wall time (1.0 = one whole
  core busy), ``client_cpu_ms_per_request``.

Validity (:func:`check`): a level fails, with a message naming it, when requests failed, when too few
measured requests completed for the percentiles asked (:func:`pairbench.core.slo.min_requests`), when
the p99 schedule lag passes its bound, when the client's CPU share nears a whole core, or when the
achieved load falls short of the target. A failed level is never drawn as the engine's curve nor
paired; only the SLO capacity reads a level where the engine itself failed requests, as the SLO
failing there (:func:`pairbench.analysis.tables.engine_failed`). A level that may have started on a
busy server (:func:`started_busy`) is flagged and not ok either.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Mapping

import numpy as np

from pairbench.core import loadconfig
from pairbench.core.conditions import parse_id
from pairbench.core.metrics import LEVEL_LATENCIES, NAMES as N, latency_metric
from pairbench.core.slo import SLO, min_requests, tpot_ms

PERCENTILE_METHOD = "linear"  # numpy's default, Hyndman & Fan (1996) type 7; vLLM's np.percentile
DEFAULT_PERCENTILES = (50, 99)


def percentile(values, q: float) -> float | None:
    """The q-th percentile (0–100) by :data:`PERCENTILE_METHOD`; None for no values."""
    values = np.asarray(values, dtype=float)
    return float(np.percentile(values, q, method=PERCENTILE_METHOD)) if values.size else None


def pkey(q: float) -> str:
    """``p50``, ``p99``, ``p99_9``: a percentile's name (in a message)."""
    return "p" + f"{q:g}".replace(".", "_")


@dataclass(frozen=True)
class Bounds:
    """Validity bounds of a level (config ``load.validity``)."""

    lag_p99_ms: float = 20.0           # p99 schedule lag above this: the client set the pace
    client_cpu_share: float = 0.8      # client CPU / wall at or above this: the client nears a core
    load_tolerance: float = 0.05       # achieved concurrency or rate more than this share off target
    max_errors: int = 0                # failed requests allowed (any is a fault by default)
    min_tail: float = 1.0              # values needed at or beyond each percentile


@dataclass(frozen=True)
class LevelMetrics:
    """A level's figures: the registry's level metrics (pairbench.core.metrics, scope ``level``) in
    ``values`` by name (``m[NAMES.output_tok_s]``), and the counts, windows and facts beside them;
    ``to_dict`` is flat JSON with units in the names."""

    level: str
    factor: str                        # the level's load factor: concurrency (closed loop) or rate (open loop)
    target: float                      # its value: streams, or requests/s
    percentiles: tuple[float, ...]
    n_requests: int
    n_measured: int
    n_ok: int
    n_itl: int
    n_errors: int
    values: dict = field(default_factory=dict)   # registry metric name → value (None: cannot be computed)
    errors: dict = field(default_factory=dict)   # kind → count, every request of the level
    first_error: str | None = None
    wall_s: float = 0.0
    window_s: float | None = None
    slo: dict | None = None
    offered_rate_rps: float | None = None
    lag_max_ms: float | None = None
    client_cpu_ms_per_request: float | None = None

    def __getitem__(self, name: str):
        return self.values[name]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["percentiles"] = list(self.percentiles)
        d.update(d.pop("values"))
        return d


@dataclass(frozen=True)
class Validity:
    """Whether a level may stand for the engine: the failed checks and one message each."""

    level: str
    failed: tuple[str, ...] = ()       # check names: errors, too_few_requests, schedule_lag, client_cpu, achieved_load
    messages: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict:
        return {"level": self.level, "ok": self.ok, "failed": list(self.failed), "messages": list(self.messages)}


def first_token_ms(r: Mapping) -> float | None:
    """A request's time to first token: its first token's arrival since its send (None: no token)."""
    return r["token_s"][0] * 1e3 if r["token_s"] else None


def gaps_ms(r: Mapping) -> list[float]:
    """A request's inter-token gaps: between consecutive tokens' arrivals."""
    t = r["token_s"]
    return [(b - a) * 1e3 for a, b in zip(t, t[1:])]


def end_to_end_ms(r: Mapping) -> float:
    """A request's end-to-end time: its end since its send."""
    return (r["end_s"] - r["sent_s"]) * 1e3


def lag_ms(r: Mapping) -> float:
    """A request's schedule lag: its send since it was due (closed loop: since its stream was free)."""
    return (r["sent_s"] - r["scheduled_s"]) * 1e3


def _time_average_in_flight(records, t_from: float, t_to: float) -> float | None:
    """∫ (requests in flight) dt / (t_to − t_from), each request in flight over [sent, end)."""
    if not t_to > t_from:
        return None
    busy = sum(max(0.0, min(r["end_s"], t_to) - max(r["sent_s"], t_from)) for r in records)
    return busy / (t_to - t_from)


def level_metrics(client: Mapping, *, level: str, slo: SLO | None = None,
                  percentiles=DEFAULT_PERCENTILES) -> LevelMetrics:
    """The metrics of one level (*client*: a level record's ``client``), named *level* (its condition id,
    whose load factor says closed or open loop)."""
    records = list(client["requests"])
    if not records:
        raise ValueError(f"level {level}: no request records")
    factor, target = parse_id(level).load or (None, None)
    if factor is None:
        raise ValueError(f"level {level}: its condition has no load factor (concurrency or rate)")
    measured = [r for r in records if not r["warmup"]]
    ok = [r for r in measured if r["error"] is None]
    errors = [r for r in records if r["error"] is not None]
    series = _series(ok)
    values = {latency_metric(name, q): percentile([v for v in series[name] if v is not None], q)
              for name in LEVEL_LATENCIES for q in percentiles}
    t0 = min(r["sent_s"] for r in measured)
    t1 = max(r["end_s"] for r in measured)
    window = t1 - t0 if t1 > t0 else None
    values[N.output_tok_s] = values[N.requests_s] = values[N.goodput_rps] = values[N.slo_attainment] = None
    if window:
        n_tok = sum(int(np.count_nonzero((t >= t0) & (t <= t1)))
                    for t in (r["sent_s"] + np.asarray(r["token_s"], dtype=float) for r in records if r["error"] is None))
        values[N.output_tok_s], values[N.requests_s] = n_tok / window, len(ok) / window
    if slo is not None:
        good = sum(slo.good(ttft_ms=a, tpot_ms=t, e2e_ms=e) for a, t, e in zip(series["ttft"], series["tpot"],
                                                                               series["e2e"]))
        values[N.slo_attainment] = good / len(measured)
        values[N.goodput_rps] = good / window if window else None
    values[N.achieved_concurrency], values[N.achieved_rate_rps] = _achieved(records, factor, target)
    lags = [lag_ms(r) for r in records]
    wall, cpu = float(client["wall_s"]), float(client["cpu_s"])
    values.update({N.lag_p99_ms: percentile(lags, 99), N.client_cpu_s: cpu,
                   N.client_cpu_share: cpu / wall if wall > 0 else None})
    return LevelMetrics(
        level=level, factor=factor, target=target, percentiles=tuple(percentiles), n_requests=len(records),
        n_measured=len(measured), n_ok=len(ok), n_itl=len(series["itl"]), n_errors=len(errors), values=values,
        errors=dict(Counter(r["error_kind"] for r in errors)), first_error=errors[0]["error"] if errors else None,
        wall_s=wall, window_s=window, slo=slo.to_dict() if slo else None,
        offered_rate_rps=client.get("offered_rate_rps"), lag_max_ms=max(lags),
        client_cpu_ms_per_request=cpu * 1e3 / len(records))


def _series(ok: list[Mapping]) -> dict[str, list]:
    """Per latency (:data:`pairbench.core.metrics.LEVEL_LATENCIES`), the values of the measured
    requests that completed (``itl``: every gap, pooled)."""
    ttft = [first_token_ms(r) for r in ok]
    e2e = [end_to_end_ms(r) for r in ok]
    tpot = [tpot_ms(ttft_ms=a, e2e_ms=e, output_tokens=_out_tokens(r)) for r, a, e in zip(ok, ttft, e2e)]
    series = dict(zip(LEVEL_LATENCIES, (ttft, [g for r in ok for g in gaps_ms(r)], tpot, e2e)))
    return series


def _achieved(records: list[Mapping], factor: str, target) -> tuple[float | None, float | None]:
    """``(achieved concurrency, achieved rate)``: the one the level's factor asks, the other None."""
    sends = sorted(r["sent_s"] for r in records)
    if factor == "concurrency":
        if len(records) > (target or 0):  # else every request went out at once
            return _time_average_in_flight(records, sends[0], sends[-1]), None
        return None, None
    return None, ((len(sends) - 1) / (sends[-1] - sends[0]) if sends[-1] > sends[0] else None)


def _out_tokens(r: Mapping) -> int:
    """Output tokens of a request: the engine's completion count, else the tokens streamed (vLLM)."""
    return r["completion_tokens"] if r.get("completion_tokens") is not None else len(r["token_s"])


# The checks of :func:`check` that say the client, not the engine, set the pace
CLIENT_CHECKS = frozenset({"schedule_lag", "client_cpu"})


def check(m: LevelMetrics, bounds: Bounds = Bounds()) -> Validity:
    """Every validity check of a level; each failure's message names the level and the bound."""
    failed, msgs = [], []

    def fail(name: str, text: str) -> None:
        failed.append(name)
        msgs.append(f"level {m.level}: {text}")

    if m.n_errors > bounds.max_errors:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(m.errors.items()))
        fail("errors", f"{m.n_errors} of {m.n_requests} requests failed ({kinds}); a failed request is never a "
                       f"sample (first: {m.first_error})")
    need = min_requests(m.percentiles, bounds.min_tail)
    worst = pkey(max(m.percentiles)) if m.percentiles else "p50"
    if m.n_ok < need:
        fail("too_few_requests", f"{m.n_ok} measured requests completed, too few for {worst} (needs {need})")
    elif 0 < m.n_itl < need:  # no gaps at all only when every request has one output token
        fail("too_few_requests", f"{m.n_itl} inter-token gaps, too few for {worst} ITL (needs {need})")
    lag, lag_bound = m[N.lag_p99_ms], bounds.lag_p99_ms
    if lag is not None and lag > lag_bound:
        what = "schedule lag" if m.factor == "rate" else "client turnaround (send after a stream became free)"
        fail("schedule_lag", f"p99 {what} {lag:.1f} ms exceeds {lag_bound:g} ms: the client, not the engine, set "
                             f"the pace")
    share, share_bound = m[N.client_cpu_share], bounds.client_cpu_share
    if share is not None and share >= share_bound:
        fail("client_cpu", f"the client used {share:.2f} of a CPU core (bound {share_bound:g}): the client may be "
                           f"the bottleneck")
    tol, conc, rate = bounds.load_tolerance, m[N.achieved_concurrency], m[N.achieved_rate_rps]
    if m.factor == "concurrency":
        if conc is None:
            fail("achieved_load", f"{m.n_requests} requests for {m.target} streams all went out at once: "
                                  f"too few to hold the streams busy")
        elif conc < (1 - tol) * m.target:
            fail("achieved_load", f"achieved concurrency {conc:.2f} of {m.target} streams "
                                  f"(below {1 - tol:.0%} of the target)")
    elif m.offered_rate_rps and rate is not None:
        if abs(rate / m.offered_rate_rps - 1) > tol:
            fail("achieved_load", f"achieved rate {rate:.3g} req/s against the schedule's "
                                  f"{m.offered_rate_rps:.3g} (more than {tol:.0%} off)")
    elif m.n_requests >= 2:
        fail("achieved_load", "the schedule offers no rate (its sends are all at one instant)")
    return Validity(level=m.level, failed=tuple(failed), messages=tuple(msgs))



@dataclass(frozen=True)
class LevelParams:
    """How a load run's levels are judged: the plan's SLO, latency percentiles and validity bounds."""

    slo: SLO | None
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    bounds: Bounds = Bounds()

    @classmethod
    def of_plan(cls, plan: Mapping) -> "LevelParams | None":
        """The parameters of *plan*'s load run (None for a single-stream run)."""
        load = plan.get("load")
        if not load:
            return None
        return cls(slo=loadconfig.slo(load), percentiles=tuple(load["percentiles"]), bounds=Bounds(**load["validity"]))


def started_busy(idle: Mapping) -> bool:
    """Whether a level may have started on a busy server (*idle*: its record's ``idle``): still busy
    when the idle wait gave up, or its probe unreadable. An engine without a probe cannot tell: its
    levels count, and the report says how many were verified idle."""
    return not (idle.get("verified") or str(idle.get("how", "")).startswith("no idle probe"))


def judge(rec: Mapping, params: LevelParams) -> dict:
    """A level record (as its visit measured it) with its ``metrics`` and ``validity``: its flags gain
    one message per failed check (and one if it may have started on a busy server), and it is ``ok``
    only when every gate and check passed and it started on a server shown idle."""
    m = level_metrics(rec["client"], level=rec["condition"], slo=params.slo, percentiles=params.percentiles)
    v = check(m, params.bounds)
    busy = None
    if started_busy(rec["idle"]):
        busy = (f"validity idle: level {rec['condition']} started on a server that was not shown idle "
                f"({rec['idle'].get('how')}; last report {rec['idle'].get('busy')})")[:300]
    return {**rec, "metrics": m.to_dict(), "validity": {k: v.to_dict()[k] for k in ("ok", "failed", "messages")},
            "flags": [*rec["flags"], *v.messages, *([busy] if busy else [])],
            "ok": bool(rec["ok"] and v.ok and not busy)}


def judged(measure: Mapping, plan: Mapping) -> dict:
    """A visit's measure body as the stages after it read it: every level record judged
    (:func:`judge`) by *plan*'s load parameters; a single-stream visit's body as it is."""
    params = LevelParams.of_plan(plan)
    if params is None or not any(r.get("kind") == "level" for r in measure["records"]):
        return dict(measure)
    return {**measure, "records": [judge(r, params) if r.get("kind") == "level" else r for r in measure["records"]]}
