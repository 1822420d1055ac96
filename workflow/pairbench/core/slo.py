"""A load run's service-level objective and the request-count rule for its percentiles.

**The SLO** (config ``load.slo``): per-request latency bounds, any subset of

- ``ttft_ms``: time to first token;
- ``itl_ms``: the request's mean inter-token latency, which is vLLM's *TPOT*:
  ``(e2e − TTFT) / (output tokens − 1)``, and 0 for a request of at most one output token;
- ``e2e_ms``: end-to-end latency, request sent → stream finished;

plus ``attainment``, the fraction of a level's requests that must meet every bound for the SLO to
*hold* at that level (default 0.9, the attainment target of DistServe-style goodput studies).

A request is *good* when it completed and meets every bound given, each inclusive (``value ≤
bound``). That is exactly vLLM's ``--goodput`` rule (``vllm bench serve --goodput ttft:X tpot:Y
e2el:Z``: ``calculate_metrics`` counts a request good when ``slo >= value`` for every key given),
with vLLM's ``tpot`` under our name ``itl_ms``. A failed request is never good.

**Percentiles need requests.** The q-th percentile of n values is only *estimated* from data when at
least ``min_tail`` values lie at or beyond it, i.e. ``n · (1 − q/100) ≥ min_tail``; with fewer it is
an extrapolation of the largest value (p99 of 20 requests is a weighted mean of the two largest).
:func:`min_requests` gives the smallest such n (p99 → 100, p90 → 10, p50 → 2 at ``min_tail=1``); the
config check and the level validity check both use it, so a level too small for its percentiles is
caught before anything is measured, and again if errors leave too few.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from fractions import Fraction

from pairbench.core import configschema
from pairbench.core.configsource import ConfigError

# The bounds an SLO may state, by the per-request latency each bounds: the one list of them (the
# schema's load.slo keys, the summary's, the report's; tests/pairbench/test_registries.py checks the
# schema against it). The attainment target's default is the schema's.
BOUNDS = ("ttft_ms", "itl_ms", "e2e_ms")
BOUND_WORDS = {"ttft_ms": "time to first token", "itl_ms": "mean inter-token latency (TPOT)",
               "e2e_ms": "end-to-end latency"}
DEFAULT_ATTAINMENT = configschema.defaults("load", "slo")["attainment"]


@dataclass(frozen=True)
class SLO:
    """Latency bounds in ms (None = no bound) and the attainment target in (0, 1]."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None
    attainment: float = DEFAULT_ATTAINMENT

    def __post_init__(self):
        for name in BOUNDS:
            v = getattr(self, name)
            if v is not None and not (_number(v) and math.isfinite(v) and v > 0):
                raise ConfigError(("load", "slo", name), f"a latency bound must be a positive number of ms, got {v!r}")
        if not (_number(self.attainment) and 0 < self.attainment <= 1):
            raise ConfigError(("load", "slo", "attainment"), f"must lie in (0, 1], got {self.attainment!r}")
        if all(getattr(self, name) is None for name in BOUNDS):
            raise ConfigError(("load", "slo"), f"give at least one bound ({', '.join(BOUNDS)})")

    @classmethod
    def from_dict(cls, d: dict, where: str = "load.slo") -> "SLO":
        if not isinstance(d, dict):
            raise ConfigError(where, f"must be a mapping of {', '.join(BOUNDS)} and attainment")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(where, f"unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        return cls(**d)

    def to_dict(self) -> dict:
        return {"ttft_ms": self.ttft_ms, "itl_ms": self.itl_ms, "e2e_ms": self.e2e_ms, "attainment": self.attainment}

    def good(self, *, ttft_ms: float | None, tpot_ms: float | None, e2e_ms: float | None) -> bool:
        """Whether one completed request meets every bound given (inclusive). A bound on a value the
        request lacks (None: e.g. no token arrived) is not met."""
        for bound, value in ((self.ttft_ms, ttft_ms), (self.itl_ms, tpot_ms), (self.e2e_ms, e2e_ms)):
            if bound is not None and (value is None or not value <= bound):
                return False
        return True


def tpot_ms(*, ttft_ms: float | None, e2e_ms: float | None, output_tokens: int | None) -> float | None:
    """vLLM's time per output token: (e2e − TTFT) / (tokens − 1); 0 at ≤ 1 token; None if unknown."""
    if output_tokens is None or e2e_ms is None:
        return None
    if output_tokens <= 1:
        return 0.0
    if ttft_ms is None:
        return None
    return (e2e_ms - ttft_ms) / (output_tokens - 1)


def min_requests(percentiles, min_tail: float = 1.0) -> int:
    """The fewest values for which every percentile in *percentiles* (0–100) has at least *min_tail*
    values at or beyond it: ``max ceil(min_tail / (1 − q/100))``, computed in exact fractions (so p99
    gives 100, not 101)."""
    need = 1
    for q in percentiles:
        if not (_number(q) and 0 <= q < 100):
            raise ConfigError(("load", "percentiles"), f"each must lie in [0, 100), got {q!r}")
        tail = 1 - Fraction(str(q)) / 100
        need = max(need, math.ceil(Fraction(str(min_tail)) / tail))
    return need


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
