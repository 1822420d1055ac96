"""One load level's metrics and validity, from the records the load client wrote.

Input: a level as :meth:`pairbench.engines.loadclient.LevelRun.to_dict` writes it (plain JSON: the
level's mode and target, its wall and client CPU time, one record per request). Output: a frozen
:class:`LevelMetrics` (flat JSON via ``to_dict``, units in the key names) and a :class:`Validity`
naming every check the level failed. Nothing here sends a request.

Definitions (``measured`` = the level's requests after its ``warmup`` first ones; ``ok`` = completed
with ``[DONE]``):

- **window**: from the first measured request's send to the last measured request's end. With no
  warm-up that is vLLM's benchmark duration (first send → last completion).
- ``output_tok_s``: output tokens of the whole system per second: every completed request's tokens
  whose arrival falls inside the window, over the window (with no warm-up: all output tokens over
  the duration, vLLM's ``output_throughput``). ``requests_s``: measured ok requests / window.
- Latency percentiles over the measured ok requests: ``ttft``, ``e2e``, ``tpot`` (per request, see
  :func:`pairbench.core.slo.tpot_ms`), and ``itl`` over every inter-token gap of those requests pooled
  (as vLLM pools them). **Percentile method**: numpy's ``"linear"`` (Hyndman & Fan type 7, numpy's
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
failing there (:func:`pairbench.analysis.tables.engine_failed`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Mapping

import numpy as np

from pairbench.core.metrics import METRICS, Metric
from pairbench.core.slo import SLO, min_requests, tpot_ms

PERCENTILE_METHOD = "linear"  # numpy's default, Hyndman & Fan (1996) type 7; vLLM's np.percentile
DEFAULT_PERCENTILES = (50, 99)
LATENCIES = ("ttft", "itl", "tpot", "e2e")
_EPS_S = 1e-9  # token times rebuilt from ms gaps may pass their request's end by float rounding

# The load metrics are the registry's level-scope metrics (pairbench.core.metrics.METRICS, scope
# "level"): each is a key of LevelMetrics.to_dict(), which a level record holds under "metrics".
LOAD_METRICS: dict[str, Metric] = {name: m for name, m in METRICS.items() if m.scope == "level"}


def percentile(values, q: float) -> float | None:
    """The q-th percentile (0–100) by :data:`PERCENTILE_METHOD`; None for no values."""
    values = np.asarray(values, dtype=float)
    return float(np.percentile(values, q, method=PERCENTILE_METHOD)) if values.size else None


def pkey(q: float) -> str:
    """``p50``, ``p99``, ``p99_9``: a percentile's name in a key."""
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
    """A level's figures; ``to_dict`` is flat JSON with units in the names."""

    level: str
    mode: str
    concurrency: int | None
    rate_rps: float | None
    percentiles: tuple[float, ...]
    n_requests: int
    n_measured: int
    n_ok: int
    n_itl: int
    n_errors: int
    errors: dict = field(default_factory=dict)   # kind → count, every request of the level
    first_error: str | None = None
    wall_s: float = 0.0
    window_s: float | None = None
    output_tok_s: float | None = None
    requests_s: float | None = None
    latency_ms: dict = field(default_factory=dict)  # "ttft_p99_ms" → value
    slo: dict | None = None
    slo_attainment: float | None = None
    goodput_rps: float | None = None
    achieved_concurrency: float | None = None
    offered_rate_rps: float | None = None
    achieved_rate_rps: float | None = None
    lag_p99_ms: float | None = None
    lag_max_ms: float | None = None
    client_cpu_s: float = 0.0
    client_cpu_share: float | None = None
    client_cpu_ms_per_request: float | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["percentiles"] = list(self.percentiles)
        d.update(d.pop("latency_ms"))
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


def _token_times(r: Mapping) -> np.ndarray:
    """A completed request's token arrival times (s since the level started)."""
    first = r["sent_s"] + r["ttft_ms"] / 1e3
    return first + np.concatenate([[0.0], np.cumsum(np.asarray(r["itl_ms"], dtype=float))]) / 1e3


def _time_average_in_flight(records, t_from: float, t_to: float) -> float | None:
    """∫ (requests in flight) dt / (t_to − t_from), each request in flight over [sent, end)."""
    if not t_to > t_from:
        return None
    busy = sum(max(0.0, min(r["end_s"], t_to) - max(r["sent_s"], t_from)) for r in records)
    return busy / (t_to - t_from)


def level_metrics(run: Mapping, *, level: str, slo: SLO | None = None,
                  percentiles=DEFAULT_PERCENTILES) -> LevelMetrics:
    """The metrics of one level (*run*: a ``LevelRun.to_dict()``), named *level* (its condition id)."""
    records = list(run["records"])
    if not records:
        raise ValueError(f"level {level}: no request records")
    measured = [r for r in records if not r["warmup"]]
    ok = [r for r in measured if r["error"] is None]
    errors = [r for r in records if r["error"] is not None]
    lat: dict[str, float | None] = {}
    series = {
        "ttft": [r["ttft_ms"] for r in ok],
        "itl": [g for r in ok for g in r["itl_ms"]],
        "tpot": [tpot_ms(ttft_ms=r["ttft_ms"], e2e_ms=r["e2e_ms"], output_tokens=_out_tokens(r)) for r in ok],
        "e2e": [r["e2e_ms"] for r in ok],
    }
    for name in LATENCIES:
        for q in percentiles:
            lat[f"{name}_{pkey(q)}_ms"] = percentile([v for v in series[name] if v is not None], q)
    t0 = min(r["sent_s"] for r in measured)
    t1 = max(r["end_s"] for r in measured)
    window = t1 - t0 if t1 > t0 else None
    out_tok = req_s = good_rps = attain = None
    if window:
        n_tok = 0
        for r in records:
            if r["error"] is None and r["ttft_ms"] is not None:
                t = _token_times(r)
                n_tok += int(np.count_nonzero((t >= t0 - _EPS_S) & (t <= t1 + _EPS_S)))
        out_tok, req_s = n_tok / window, len(ok) / window
    if slo is not None:
        good = sum(slo.good(ttft_ms=r["ttft_ms"], tpot_ms=t, e2e_ms=r["e2e_ms"]) for r, t in zip(ok, series["tpot"]))
        attain = good / len(measured)
        good_rps = good / window if window else None
    sends = sorted(r["sent_s"] for r in records)
    achieved_c = achieved_r = None
    if run["mode"] == "concurrency":
        if len(records) > (run.get("concurrency") or 0):  # else every request went out at once
            achieved_c = _time_average_in_flight(records, sends[0], sends[-1])
    elif sends[-1] > sends[0]:
        achieved_r = (len(sends) - 1) / (sends[-1] - sends[0])
    lags = [r["lag_ms"] for r in records]
    wall, cpu = float(run["wall_s"]), float(run["client_cpu_s"])
    return LevelMetrics(
        level=level, mode=run["mode"], concurrency=run.get("concurrency"), rate_rps=run.get("rate_rps"),
        percentiles=tuple(percentiles), n_requests=len(records), n_measured=len(measured), n_ok=len(ok),
        n_itl=len(series["itl"]), n_errors=len(errors), errors=dict(Counter(r["error_kind"] for r in errors)),
        first_error=errors[0]["error"] if errors else None, wall_s=wall, window_s=window, output_tok_s=out_tok,
        requests_s=req_s, latency_ms=lat, slo=slo.to_dict() if slo else None, slo_attainment=attain,
        goodput_rps=good_rps, achieved_concurrency=achieved_c, offered_rate_rps=run.get("offered_rate_rps"),
        achieved_rate_rps=achieved_r, lag_p99_ms=percentile(lags, 99), lag_max_ms=max(lags), client_cpu_s=cpu,
        client_cpu_share=cpu / wall if wall > 0 else None, client_cpu_ms_per_request=cpu * 1e3 / len(records))


def _out_tokens(r: Mapping) -> int:
    """Output tokens of a request: the engine's completion count, else the tokens streamed (vLLM)."""
    return r["completion_tokens"] if r.get("completion_tokens") is not None else r["streamed_tokens"]


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
    if m.lag_p99_ms is not None and m.lag_p99_ms > bounds.lag_p99_ms:
        what = "schedule lag" if m.mode == "rate" else "client turnaround (send after a stream became free)"
        fail("schedule_lag", f"p99 {what} {m.lag_p99_ms:.1f} ms exceeds {bounds.lag_p99_ms:g} ms: the client, "
                             f"not the engine, set the pace")
    if m.client_cpu_share is not None and m.client_cpu_share >= bounds.client_cpu_share:
        fail("client_cpu", f"the client used {m.client_cpu_share:.2f} of a CPU core (bound {bounds.client_cpu_share:g}):"
                           f" the client may be the bottleneck")
    tol = bounds.load_tolerance
    if m.mode == "concurrency":
        if m.achieved_concurrency is None:
            fail("achieved_load", f"{m.n_requests} requests for {m.concurrency} streams all went out at once: "
                                  f"too few to hold the streams busy")
        elif m.achieved_concurrency < (1 - tol) * m.concurrency:
            fail("achieved_load", f"achieved concurrency {m.achieved_concurrency:.2f} of {m.concurrency} streams "
                                  f"(below {1 - tol:.0%} of the target)")
    elif m.offered_rate_rps and m.achieved_rate_rps is not None:
        if abs(m.achieved_rate_rps / m.offered_rate_rps - 1) > tol:
            fail("achieved_load", f"achieved rate {m.achieved_rate_rps:.3g} req/s against the schedule's "
                                  f"{m.offered_rate_rps:.3g} (more than {tol:.0%} off)")
    elif m.n_requests >= 2:
        fail("achieved_load", "the schedule offers no rate (its sends are all at one instant)")
    return Validity(level=m.level, failed=tuple(failed), messages=tuple(msgs))

