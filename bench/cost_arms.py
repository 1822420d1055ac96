#!/usr/bin/env python3
"""The cost channel on a finished llama.cpp run's builds, without its wall-clock half (issues 36, 39).

Not a test. Counts each arm's ``llama-bench`` (``results/<label>/src/<arm>/build/bin/llama-bench``)
under callgrind exactly as the pipeline's ``cost`` rule does (:func:`pairbench.measure.cost.run_llama_bench`:
relinked with the wrapper, one thread, instructions and estimated cycles per prompt and per decode
token), keeps each arm's callgrind dumps in ``private/cost-bench/dumps-<arm>/`` (for
``callgrind_annotate``, per function), and prints each candidate's ratio to the baseline with the cost channel's verdict
(:func:`pairbench.analysis.cost`'s rule: an exact ratio against 1 +- noise; identical counts of
arms that differ read "not exercised"). A count does not depend on what else the machine runs, so
this may run beside other work; its own time is printed.

    python3 bench/cost_arms.py results/repro-rms-norm-mul --lengths 256 [--decode-tokens 8]
        [--phases prefill decode] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "workflow"), str(REPO)]

from pairbench.analysis import cost as cost_verdicts  # noqa: E402
from pairbench.core.models import resolve_model  # noqa: E402
from pairbench.measure import cost  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="results/<label> of a finished (or built) llama.cpp run")
    ap.add_argument("--lengths", type=int, nargs="+", default=[256])
    ap.add_argument("--decode-tokens", type=int, default=8)
    ap.add_argument("--phases", nargs="+", default=["prefill", "decode"], choices=["prefill", "decode"])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--noise", type=float, default=0.01)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    plan = json.loads((a.run / "plan.json").read_text())
    arms = list(plan["arms"])
    base, cands = plan["baseline"], plan["candidates"]
    model = resolve_model(a.model, REPO)["path"]
    opts = cost.CostOptions(decode_tokens=a.decode_tokens, phases=tuple(a.phases), timeout_s=3600)
    requests = [{"condition": f"in{n}-out{a.decode_tokens}", "input_tokens": n} for n in a.lengths]
    work = (a.run / "private" / "cost-bench").resolve()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; valgrind {cost.valgrind_version()}")
    counted = {}
    for arm in arms:
        binary = a.run / "src" / arm / "build" / "bin" / "llama-bench"
        t0 = time.monotonic()
        counted[arm] = cost.run_llama_bench(binary=binary, model=model, requests=requests, opts=opts,
                                            collect=cost.LLAMA_COLLECT, work=work, log=work / f"{arm}.log",
                                            cwd=binary.parent)
        print(f"{arm}: counted in {time.monotonic() - t0:.0f} s ({counted[arm].facts.get('counting', 'toggle-collect')})", flush=True)
        keep = work / f"dumps-{arm}"  # each arm's dumps kept apart, for callgrind_annotate per function
        shutil.rmtree(keep, ignore_errors=True)
        keep.mkdir()
        for dump in work.glob("callgrind.*"):
            dump.rename(keep / dump.name)
    rows = []
    print("| candidate | condition | phase | measure | baseline / token | candidate / token | ratio | verdict |")
    print("|---|---|---|---|---:|---:|---:|---|")
    for c in cands:
        for r in requests:
            for phase in a.phases:
                b, k = counted[base].conditions[r["condition"]][phase], counted[c].conditions[r["condition"]][phase]
                for measure in ("instructions", "estimated_cycles"):
                    bv, kv = b.per_token()[measure], k.per_token()[measure]
                    identical = b.counts.instructions == k.counts.instructions
                    j = cost_verdicts.judge(kv / bv, noise=a.noise, identical=identical, same_arms=False)
                    rows.append({"candidate": c, "condition": r["condition"], "phase": phase, "measure": measure,
                                 "baseline": bv, "candidate_value": kv, "ratio": kv / bv, "verdict": j.verdict})
                    print(f"| {c} | {r['condition']} | {phase} | {measure} | {bv:,.0f} | {kv:,.0f} | {kv / bv:.4f} | {j.verdict} |")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
