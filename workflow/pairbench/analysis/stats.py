"""Comparing arms: descriptive statistics, paired comparisons, verdicts and disclosures, for one or
several candidates against one baseline (:func:`summarize_all`; :func:`summarize` is one pair).

This is the *comparing* module of pairbench (measuring lives in ``measure``, reporting in ``publish``;
the split is pyperf's). It reads one row per steady request (``tables/measurements.csv``, see
docs/contracts.md §2) and returns the JSON-able body of ``stats/summary.json``. docs/statistics.md
explains every method and rule; the short version:

- Only rows with ``selected == True`` enter the statistics (:mod:`~pairbench.analysis.measurements`);
  every other row is listed, with its reason, under ``disclosures.excluded``.
- Per arm × condition × metric: n, full-N median, min, max and a trimmed mean over the requests
  (:mod:`~pairbench.analysis.describe`).
- The paired unit is the *visit*, pairs are matched by round (:mod:`~pairbench.analysis.pairing`).
- Primary metrics (``metrics``: one per question, see :data:`QUESTIONS`) are tested: the
  Hodges–Lehmann interval of log(candidate/baseline) that inverts the exact Wilcoxon signed-rank
  test (:mod:`~pairbench.analysis.signrank`), at the level Holm assigns across candidates × primary
  metrics × conditions (:mod:`~pairbench.analysis.verdicts`), and a verdict read from it. Secondary
  metrics are shown with their unadjusted interval, never tested. Memory metrics are compared per
  condition (:mod:`~pairbench.analysis.compare`).

The code names no condition factor: it iterates the table's condition ids.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable

import numpy as np
import pandas as pd

from pairbench.analysis import compare as pb_compare
from pairbench.analysis import describe as pb_describe
from pairbench.analysis import loadstats as pb_loadstats
from pairbench.analysis import verdicts as pb_verdicts
from pairbench.analysis.compare import Family, MemoryCell, Options, PairInput
from pairbench.analysis.measurements import (StatsInputError, check_metric_lists, check_table, condition_order,
                                              measured_conditions, selected)
from pairbench.analysis.pairing import pair, paired_differences
from pairbench.core.metrics import DEFAULT_MEMORY, DEFAULT_METRICS, DEFAULT_SECONDARY, METRICS, QUESTIONS

VERDICTS = ("faster", "slower", "equivalent", "inconclusive")
MEMORY_VERDICTS = ("smaller", "larger", "equivalent", "inconclusive")

__all__ = ["METRICS", "QUESTIONS", "VERDICTS", "MEMORY_VERDICTS", "StatsInputError", "options", "summarize",
           "summarize_all", "paired_differences"]


def options(df: Any, metrics: Iterable[str] = DEFAULT_METRICS, secondary: Iterable[str] | None = None,
            memory: Iterable[str] | None = None, trim: int | None = None, alpha: float = 0.05,
            noise: float = 0.01, seed: int = 0, multiplicity: str = "holm") -> Options:
    """The checked statistics options; each error names its config key (``stats.<key>``).

    *secondary* defaults to the speed metrics of :data:`DEFAULT_SECONDARY` not already primary and
    present in the table; *memory* to :data:`DEFAULT_MEMORY` where present.
    """
    if trim is not None and (not isinstance(trim, (int, np.integer)) or trim < 0):
        raise StatsInputError(f"stats.trim: must be a non-negative integer or null, got {trim!r}")
    if not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise StatsInputError(f"stats.alpha: must lie in (0, 1), got {alpha!r}")
    if not isinstance(noise, (int, float)) or not 0 <= noise < 1:
        raise StatsInputError(f"stats.noise: must lie in [0, 1), got {noise!r}")
    if multiplicity not in pb_verdicts.MULTIPLICITY:
        raise StatsInputError(f"stats.multiplicity: {multiplicity!r} is not one of "
                              f"{', '.join(pb_verdicts.MULTIPLICITY)}")
    metrics = tuple(metrics)
    columns = set(getattr(df, "columns", ()))
    sec = tuple(secondary) if secondary is not None else tuple(
        m for m in DEFAULT_SECONDARY if m not in metrics and m in columns)
    mem = tuple(memory) if memory is not None else tuple(m for m in DEFAULT_MEMORY if m in columns)
    metrics, sec, mem = check_metric_lists(metrics, sec, mem)
    return Options(metrics=metrics, secondary=sec, memory=mem, explicit_memory=memory is not None,
                   trim=trim, alpha=float(alpha), noise=float(noise), seed=int(seed), multiplicity=multiplicity)


def _memory_cells(sel: pd.DataFrame, arms: dict, baseline: str, candidate: str, conds: list[str],
                  metrics: tuple[str, ...]) -> dict:
    out = {}
    for cond in conds:
        for metric in metrics:
            values = tuple(v[np.isfinite(v) & (v > 0)] for v in (
                sel[(sel["arm"] == a) & (sel["condition"] == cond)][metric].to_numpy(dtype=float)
                for a in (baseline, candidate)))
            exact = all(v.size > 0 and float(v.min()) == float(v.max()) for v in values)
            out[(cond, metric)] = MemoryCell(exact=exact, baseline=arms[baseline][cond][metric],
                                             candidate=arms[candidate][cond][metric], values=values)
    return out


def prepare(df: pd.DataFrame, baseline: str, candidate: str, opts: Options) -> PairInput:
    """One pair's checked table, per-arm statistics, paired data and its two families (untested yet)."""
    if baseline == candidate:
        raise StatsInputError(f"baseline and candidate are the same arm {baseline!r}")
    df = check_table(df, [baseline, candidate], opts.shown, opts.memory)
    missing_memory = [m for m in opts.memory if m not in df.columns]
    if missing_memory and opts.explicit_memory:
        raise StatsInputError(f"stats.memory: measurements table lacks column(s): {', '.join(missing_memory)}")
    sel = selected(df, [baseline, candidate])
    conds = measured_conditions(df, [baseline, candidate])
    arms, slow = pb_describe.per_arm(sel, (baseline, candidate), conds, opts.shown, opts.memory, opts.trim)
    pairs = {(c, m): pair(sel, baseline, candidate, c, m) for c in conds for m in (*opts.shown, *opts.memory)}
    cells = _memory_cells(sel, arms, baseline, candidate, conds, opts.memory)
    family = tuple(pb_verdicts.Comparison((c, m), pairs[(c, m)].d, METRICS[m].higher_is_better,
                                          pb_verdicts.SPEED_WORDS) for c in conds for m in opts.metrics)
    # memory is its own question ("what does it cost"), so its own family: only what varies is tested
    memory_family = tuple(pb_verdicts.Comparison(key, pairs[key].d, False, pb_verdicts.MEMORY_WORDS)
                          for key, cell in cells.items() if not cell.exact and all(v.size for v in cell.values))
    return PairInput(baseline=baseline, candidate=candidate, df=df, sel=sel, conditions=tuple(conds), arms=arms,
                     slow=tuple(slow), pairs=pairs, memory_cells=cells, family=family, memory_family=memory_family)


def _across(families: dict[str, tuple], opts: Options) -> dict[str, dict]:
    """Alphas assigned over one family spanning every candidate: ``{candidate: {key: assigned entry}}``."""
    keyed = [replace(c, key=(cand, *c.key)) for cand, comps in families.items() for c in comps]
    assigned = pb_verdicts.assign(keyed, opts.alpha, opts.noise, opts.multiplicity)
    return {cand: {k[1:]: v for k, v in assigned.items() if k[0] == cand} for cand in families}


def summarize_all(df: pd.DataFrame, *, baseline: str, candidates: Iterable[str],
                  metrics: Iterable[str] = DEFAULT_METRICS, trim: int | None = None,
                  alpha: float = 0.05, noise: float = 0.01, seed: int = 0,
                  secondary: Iterable[str] | None = None, memory: Iterable[str] | None = None,
                  multiplicity: str = "holm", load: dict | None = None) -> dict:
    """Every candidate against the baseline: the body of ``stats/summary.json`` (the caller adds
    ``schema``, ``run`` and ``inputs``): ``{"baseline", "candidates", "conditions", "comparisons":
    {candidate: the pair body of :func:`summarize`}, "params"}``.

    One multiplicity family spans every candidate × primary metric × condition (and one for the
    tested memory comparisons of every candidate), so the family-wise error of every claim of the
    run, over all its candidates, is at most *alpha*; each pair body records the levels and ranks
    its comparisons were given in that family, and its ``params.family_size`` is the whole family's.

    Raises :class:`StatsInputError` (naming the key, column, arm or rows) for input that cannot be
    summarised; a statistic that cannot be computed is never an exception but an ``inconclusive``
    verdict with its reason. *seed* is recorded (the exact interval draws no random numbers).

    *load* (a load run: the plan's load parameters, ``factor``, ``slo``, ``prefix``) adds the summary's
    ``load`` block (:func:`pairbench.analysis.loadstats.load_summary`): the per-level facts and, with
    an SLO, the SLO capacity of every candidate compared, in a multiplicity family of its own.
    """
    candidates = list(candidates)
    if not candidates:
        raise StatsInputError("candidates: no candidate arm to compare with the baseline")
    dup = next((c for i, c in enumerate(candidates) if c in candidates[:i]), None)
    if dup is not None:
        raise StatsInputError(f"candidates: arm {dup!r} is listed twice")
    opts = options(df, metrics, secondary, memory, trim, alpha, noise, seed, multiplicity)
    parts = {c: prepare(df, baseline, c, opts) for c in candidates}
    speed = _across({c: p.family for c, p in parts.items()}, opts)
    mem = _across({c: p.memory_family for c, p in parts.items()}, opts)
    m = sum(len(p.family) for p in parts.values())
    m_memory = sum(len(p.memory_family) for p in parts.values())
    others = tuple(sorted(set(parts[candidates[0]].df["arm"]) - {baseline, *candidates}))
    comparisons = {c: pb_compare.pair_body(parts[c], opts, Family(assigned={**speed[c], **mem[c]}, size=m,
                                                                  memory_size=m_memory, others=others))
                   for c in candidates}
    conds = condition_order({c for p in parts.values() for c in p.conditions})
    out = {"baseline": baseline, "candidates": candidates,
            "conditions": _conditions(comparisons, conds),
            "comparisons": comparisons,
            "params": {"alpha": opts.alpha, "noise": opts.noise, "seed": opts.seed,
                       "trim": None if opts.trim is None else int(opts.trim), "multiplicity": opts.multiplicity,
                       "family": "candidates × primary metrics × conditions",
                       "family_size": m, "memory_family_size": m_memory,
                       "width_level": pb_verdicts.width_level(m, opts.alpha, opts.multiplicity),
                       "primary": list(opts.metrics), "secondary": list(opts.secondary),
                       "memory": list(opts.memory)}}
    if load is not None:
        table = parts[candidates[0]].df
        out["load"] = pb_loadstats.load_summary(
            table, baseline=baseline, candidates=candidates,
            conds=condition_order(table["condition"].unique()), load=load, alpha=opts.alpha, noise=opts.noise,
            multiplicity=opts.multiplicity)
        out["params"]["load"] = dict(load)
    return out


def _conditions(comparisons: dict, order: list[str]) -> list[dict]:
    """Every condition any comparison has, in plan order."""
    seen = {c["id"]: c for body in comparisons.values() for c in body["conditions"]}
    return [seen[i] for i in order]


def summarize(df: pd.DataFrame, *, baseline: str, candidate: str, **kwargs) -> dict:
    """One candidate against the baseline: the pair body that ``stats/summary.json`` holds per
    candidate under ``comparisons``; :func:`summarize_all` of that one candidate (its keywords)."""
    return summarize_all(df, baseline=baseline, candidates=[candidate], **kwargs)["comparisons"][candidate]
