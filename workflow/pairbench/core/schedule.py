"""Open-loop arrival schedules: seeded Poisson or gamma request offsets for one load level.

A schedule is the list of send offsets (seconds after the level starts) of an open-loop level at a
request rate. Both arms of a round get the same schedule, so the plan fixes it: a schedule is a pure
function of ``(rate, count or duration, burstiness, seed)``, and :func:`derive_seed` turns the
run's seed plus the round and level into that seed, stably across processes and machines.

Inter-arrival gaps follow vLLM's ``--burstiness`` (``vllm bench serve``): gamma with shape
``burstiness`` and scale ``1 / (rate · burstiness)``, so their mean is ``1 / rate`` and their
coefficient of variation ``1 / sqrt(burstiness)``. ``burstiness = 1`` is a Poisson process
(exponential gaps); below 1 arrivals come in bursts; above 1 they are more even; ``math.inf`` gives
constant gaps.

Two choices, both stated:

- **Inverse-CDF sampling from seeded uniforms** (``numpy.random.default_rng(seed).random``, then
  the gamma quantile via ``scipy.special.gammaincinv``), not ``Generator.gamma``: the same seed
  draws the same uniforms at every rate and burstiness, so the schedules of one round's levels are
  *common random numbers* (at burstiness 1 the schedule at rate r is exactly the rate-1 schedule
  divided by r), and the values do not hang on numpy's gamma algorithm.
- **The first request goes at offset 0**, and with a request count the ``n − 1`` gaps are by
  default rescaled so the last offset is exactly ``(n − 1) / rate`` (``normalize``; vLLM rescales
  the same way "to stabilize the throughput data from different random seeds"). The offered rate
  of every round is then the nominal rate, and the arrival *pattern* (bursts and lulls) still varies
  with the seed. ``normalize=False`` keeps the raw renewal process. A duration-based schedule is
  never rescaled: its count is random (the arrivals of the process in ``[0, duration)``).

Closed-loop (concurrency) levels have no schedule: each stream sends its next request when its last
one finishes.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaincinv

_BLOCK = 256  # uniforms drawn per step while filling a duration


def derive_seed(seed: int, *parts: object) -> int:
    """A 63-bit seed from a base seed and labels (round, level id, ...): sha256 of their ``repr``,
    so the same inputs give the same seed in every process (``hash()`` is salted per process)."""
    h = hashlib.sha256(repr((int(seed),) + tuple(parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") >> 1


@dataclass(frozen=True)
class Schedule:
    """One open-loop level's send offsets (seconds after the level starts, non-decreasing, first 0)."""

    rate_rps: float
    burstiness: float
    seed: int
    normalized: bool
    offsets_s: tuple[float, ...]

    @property
    def n_requests(self) -> int:
        return len(self.offsets_s)

    @property
    def process(self) -> str:
        """``poisson`` (burstiness 1), ``uniform`` (inf) or ``gamma``."""
        return "poisson" if self.burstiness == 1 else ("uniform" if math.isinf(self.burstiness) else "gamma")

    @property
    def offered_rate_rps(self) -> float | None:
        """(n − 1) / (last offset − first offset): the rate this schedule offers (None below 2 sends)."""
        span = self.offsets_s[-1] - self.offsets_s[0] if self.offsets_s else 0.0
        return (len(self.offsets_s) - 1) / span if span > 0 else None

    def to_dict(self) -> dict:
        return {"rate_rps": self.rate_rps, "burstiness": None if math.isinf(self.burstiness) else self.burstiness,
                "process": self.process, "seed": self.seed, "normalized": self.normalized,
                "n_requests": self.n_requests, "offered_rate_rps": self.offered_rate_rps,
                "offsets_s": list(self.offsets_s)}

    @classmethod
    def from_dict(cls, d: dict) -> "Schedule":
        b = d.get("burstiness")
        return cls(rate_rps=float(d["rate_rps"]), burstiness=math.inf if b is None else float(b),
                   seed=int(d["seed"]), normalized=bool(d["normalized"]),
                   offsets_s=tuple(float(x) for x in d["offsets_s"]))


def gaps_from_uniforms(u: np.ndarray, rate_rps: float, burstiness: float) -> np.ndarray:
    """Inter-arrival gaps (s) for uniforms *u* in [0, 1): the gamma(burstiness, 1/(rate·burstiness))
    quantile of each (exponential at burstiness 1, the constant 1/rate at inf)."""
    u = np.asarray(u, dtype=float)
    if math.isinf(burstiness):
        return np.full(u.shape, 1.0 / rate_rps)
    if burstiness == 1:
        return -np.log1p(-u) / rate_rps  # the exponential quantile, exact
    return gammaincinv(burstiness, u) / (rate_rps * burstiness)


def _check(rate_rps: float, burstiness: float, where: str) -> None:
    if not (isinstance(rate_rps, (int, float)) and math.isfinite(rate_rps) and rate_rps > 0):
        raise ValueError(f"{where}.rate: a request rate must be a positive number of requests/s, got {rate_rps!r}")
    if not (isinstance(burstiness, (int, float)) and burstiness > 0 and not math.isnan(burstiness)):
        raise ValueError(f"{where}.burstiness: must be > 0 (1 = Poisson), got {burstiness!r}")


def arrivals(rate_rps: float, *, seed: int, n_requests: int | None = None, duration_s: float | None = None,
             burstiness: float = 1.0, normalize: bool = True, where: str = "load") -> Schedule:
    """The schedule of one open-loop level: exactly one of *n_requests* (a count) or *duration_s*.

    A ``ValueError`` names the config key under *where* (``load.rate``, ``load.requests``, ...).
    """
    _check(rate_rps, burstiness, where)
    if (n_requests is None) == (duration_s is None):
        raise ValueError(f"{where}: give exactly one of requests per level or a duration")
    rng = np.random.default_rng(int(seed))
    if n_requests is not None:
        if isinstance(n_requests, bool) or not isinstance(n_requests, int) or n_requests < 1:
            raise ValueError(f"{where}.requests: must be a positive integer, got {n_requests!r}")
        gaps = gaps_from_uniforms(rng.random(n_requests - 1), rate_rps, burstiness)
        offsets = np.concatenate([[0.0], np.cumsum(gaps)])
        if normalize and n_requests > 1 and offsets[-1] > 0:
            offsets *= ((n_requests - 1) / rate_rps) / offsets[-1]
        return Schedule(float(rate_rps), float(burstiness), int(seed), bool(normalize and n_requests > 1),
                        tuple(float(x) for x in offsets))
    if not (isinstance(duration_s, (int, float)) and math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"{where}.duration_s: must be a positive number of seconds, got {duration_s!r}")
    offsets, t = [0.0], 0.0
    while True:  # the same uniform stream as the count form, drawn in blocks until past the end
        for g in gaps_from_uniforms(rng.random(_BLOCK), rate_rps, burstiness):
            t += float(g)
            if t >= duration_s:
                return Schedule(float(rate_rps), float(burstiness), int(seed), False, tuple(offsets))
            offsets.append(t)
