"""Cross-check of the cold-cache claim against what the engine cannot fake: the client's own clock.

The cold-cache gate trusts the engine's counters (``timings.prompt_n`` = every prompt token
evaluated, ``tokens_cached`` = 0). An engine that reused a cached prefix while reporting a full
evaluation would still have to answer sooner, and the time to first token is measured by the
harness, not reported by the engine. Two checks per arm, over the records that entered the
statistics (or every gated record when no ``selected`` column exists):

- **scaling**: the median TTFT must grow with the number of evaluated tokens across lengths
  (prefill work is at least proportional to the tokens evaluated); the fitted marginal cost per
  1,000 tokens is stated;
- **no shortcut**: no record's TTFT may be below a quarter of the median TTFT of its arm × prompt length.
  A reused prefix of most of the prompt answers many times sooner (the salt at the start of every
  round's prompt leaves a repeat of the same prompt as the only thing to reuse, and that is all of
  it), while the machine's own speed moved TTFT by at most ~2.3× from its median even at a load
  average of 6 on 2 cores (the contended A/A run in tests/data/stats/aa_contended.csv: 0.43×).

The result is disclosed in the report, never silently passed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pairbench.core.metrics import NAMES

TTFT = NAMES.ttft_ms  # the client's time to first token

SHORTCUT = 0.25


def cross_check(df: pd.DataFrame) -> list[dict]:
    """``[{"arm", "ok", "scaling_ok", "shortcuts", "ms_per_1k_tokens", "detail"}]``, one per arm."""
    need = {"arm", TTFT, "prompt_tokens"}
    if df.empty or not need <= set(df.columns):
        return []
    d = df.copy()
    if "selected" in d.columns:
        d = d[d["selected"].astype(str).str.lower().isin(["true", "1"])]
    d = d[pd.to_numeric(d[TTFT], errors="coerce") > 0]
    out = []
    for arm, g in d.groupby("arm", sort=True):
        ttft = pd.to_numeric(g[TTFT], errors="coerce")
        tokens = pd.to_numeric(g["prompt_tokens"], errors="coerce")
        med = ttft.groupby(tokens).median().sort_index()
        shortcuts = int(sum((ttft[tokens == n] < SHORTCUT * m).sum() for n, m in med.items()))
        scaling_ok, per_k = None, None
        if len(med) >= 2:
            x, y = med.index.to_numpy(dtype=float), med.to_numpy(dtype=float)
            per_k = float(np.polyfit(x, y, 1)[0] * 1000.0)
            scaling_ok = bool(np.all(np.diff(y) > 0))
        ok = shortcuts == 0 and scaling_ok is not False
        parts = []
        if len(med) >= 2:
            ladder = ", ".join(f"{m:.0f} ms at {int(n)}" for n, m in med.items())
            parts.append(f"median time to first token {ladder} tokens ({per_k:+.0f} ms per 1,000 evaluated tokens): "
                         + ("it grows with the tokens evaluated" if scaling_ok else
                            "it does NOT grow with the tokens evaluated, which a full evaluation would cause"))
        parts.append(f"{shortcuts} of {len(g)} records answered in under {SHORTCUT:g}× their arm × prompt length median"
                     + ("" if shortcuts == 0 else ", as a reused prefix would"))
        out.append({"arm": str(arm), "ok": bool(ok), "scaling_ok": scaling_ok, "shortcuts": shortcuts,
                    "ms_per_1k_tokens": per_k,
                    "detail": ("consistent with a cold cache: " if ok else "INCONSISTENT with a cold cache: ")
                    + "; ".join(parts) + "."})
    return out
