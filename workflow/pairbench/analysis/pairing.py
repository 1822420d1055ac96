"""Pairing by round: the paired unit is the *visit*, and a pair is the two arms' visits of one round.

Per round, arm and condition, a visit's summary is the median of its selected repeats (one request
per visit without repeats). Pairs are matched by round; the statistic of a pair is
log(candidate / baseline). A pair with a side measured by a validation retry is dropped (the retry
ran after every visit, not next to its partner) and disclosed; a round with one side only is
unpaired and disclosed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import pandas as pd

from pairbench.analysis.describe import num
from pairbench.analysis.measurements import check_table, measured_conditions, selected

VISIT_SUMMARY = "median"  # of a visit's repeats: the paired unit


@dataclass(frozen=True)
class Pairs:
    """The paired rounds of one condition × metric."""

    pairs: tuple[dict, ...]  # per common round: values, ratio, validity, repeats per side
    d: np.ndarray  # log(candidate / baseline) per valid pair
    dropped: tuple[dict, ...]  # {"round", "arm"}: the side a validation retry measured
    unpaired_rounds: dict  # {"baseline": [round, ...], "candidate": [...]}

    @property
    def n_invalid(self) -> int:
        return sum(1 for p in self.pairs if not p["valid"]) - len(self.dropped)


def _visits(sel: pd.DataFrame, arm: str, condition: str, metric: str) -> tuple[pd.Series, pd.Series, pd.Series]:
    """Per round: the visit summary (median of the selected repeats with a positive finite value),
    the number of repeats it summarises, and whether any of them came from a validation retry."""
    cell = sel[(sel["arm"] == arm) & (sel["condition"] == condition)]
    vals = cell[metric]
    good = cell[np.isfinite(vals) & (vals > 0)]
    rounds = sorted(int(r) for r in cell["round"].unique())
    g = good.groupby("round")[metric]
    summary = g.median().reindex(rounds)
    n = g.size().reindex(rounds).fillna(0).astype(int)
    retried = (cell.groupby("round")["retry"].max() > 0).reindex(rounds) if "retry" in cell.columns \
        else pd.Series(False, index=rounds)
    return summary, n, retried.fillna(False).astype(bool)


def pair(sel: pd.DataFrame, baseline: str, candidate: str, condition: str, metric: str) -> Pairs:
    """The paired rounds of one condition × metric of the selected rows *sel*."""
    bs, bn, br = _visits(sel, baseline, condition, metric)
    cs, cn, cr = _visits(sel, candidate, condition, metric)
    pairs, d, dropped = [], [], []
    for r in sorted(set(bs.index) & set(cs.index)):
        b, c = bs.get(r), cs.get(r)
        counts = {"n_baseline": int(bn.get(r, 0)), "n_candidate": int(cn.get(r, 0))}
        if br.get(r, False) or cr.get(r, False):
            dropped.append({"round": int(r), "arm": baseline if br.get(r, False) else candidate})
            pairs.append({"round": int(r), "baseline": num(b), "candidate": num(c), "ratio": None,
                          "valid": False, **counts})
            continue
        valid = b is not None and c is not None and np.isfinite(b) and np.isfinite(c) and b > 0 and c > 0
        pairs.append({"round": int(r), "baseline": num(b), "candidate": num(c),
                      "ratio": num(c / b) if valid else None, "valid": bool(valid), **counts})
        if valid:
            d.append(math.log(c) - math.log(b))
    return Pairs(pairs=tuple(pairs), d=np.asarray(d, dtype=float), dropped=tuple(dropped),
                 unpaired_rounds={"baseline": sorted(int(r) for r in set(bs.index) - set(cs.index)),
                                  "candidate": sorted(int(r) for r in set(cs.index) - set(bs.index))})


def paired_differences(df: pd.DataFrame, *, baseline: str, candidate: str, metrics: Iterable[str]) -> dict:
    """``{(condition, metric): log(candidate/baseline) per valid pair}`` of the selected rows,
    paired as the statistics pair them (visit medians, retried pairs dropped)."""
    metrics = tuple(metrics)
    df = check_table(df, [baseline, candidate], metrics)
    sel = selected(df, [baseline, candidate])
    conds = measured_conditions(df, [baseline, candidate])
    return {(c, m): pair(sel, baseline, candidate, c, m).d for c in conds for m in metrics}
