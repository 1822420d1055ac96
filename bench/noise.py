#!/usr/bin/env python3
"""Where does the noise come from? A variance split of the real engine's timings on this machine.

Not a test: it launches the embedded engine (``engine/`` of this checkout) on the default model
several times, sends several identical-shape steady requests per length to each launch (greedy,
exact output length, prefix cache off, a fresh salt per request so nothing can be reused), and
splits the variance of every metric's *log* into three parts (issue 13):

- **within a visit**: between requests to one launch (pooled within-launch variance);
- **between launches**: what launch-to-launch means vary beyond what the within part explains
  (a one-way random-effects ANOVA: var(launch means) − within / requests, after the drift);
- **drift**: a linear trend of the launch means over the run's wall time (its fitted variance).

It also prints, per metric and length, what follows for a paired run: the SD of one pair's log
difference when the paired unit is the median/mean of ``r`` repeats per visit (drift cancels in an
adjacent pair): sqrt(2 · (between + within / r)), and the rounds needed for a 95% half-width of
2.5% (n ≈ (1.96 · sd_pair / 0.025)², the Hodges–Lehmann interval is ~95% as efficient as a t
interval under normal noise).

Load: the 1-minute load average is recorded before every request.

A CPU-speed covariate (issue 25, ``--probe``): is the request's decode rate explained by how fast
the CPU is at the time, measured outside the engine so that no patch can change it? Just before and
just after every request, this client process times two fixed probes, each on the server's CPU and
on the client's: a cache-resident compute loop (pure Python) and a memory-bound sweep (the sum of a
32 MB array). The server's CPU is the one that matters: on these VMs the speed state is per virtual
CPU (probes on one CPU slowed together, correlation 0.72; on the two CPUs they hardly correlated,
0.09: ../shared/NOISE.md), and the server's decode thread is what it slows. The probe runs there
only while the server is idle (between requests), so it cannot disturb the request; the price is
that it sees the CPU's state some milliseconds before and after, not during. ``--probe`` therefore
pins the server to the last CPU and this client to the others. Reported per length and probe: the
correlation of log probe rate with log decode rate over requests (pooled; within a launch), and of
their differences between consecutive requests of a launch (what a CUPED adjustment of paired
differences would use: a pair's covariate is the difference of its two probes).

    python3 bench/noise.py [--launches 4] [--requests 4] [--lengths 256 1024] [--output-tokens 64]
        [--threads N] [--pin] [--probe] [--nice N] [--csv out.csv] [--json out.json]

``--pin`` pins the server to the last CPU and this client to the others (``taskset``), as the
pipeline's ``server.pin`` does. Figures from this machine are in docs/statistics.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "workflow"))

from pairbench.core.conditions import Condition
from pairbench.engines.client import get_json, steady_request_body, stream_chat, tokenize_messages  # noqa: E402
from pairbench.engines.server import free_port  # noqa: E402
from pairbench.measure import fixtures as pb_fixtures  # noqa: E402
from pairbench.measure import hostload  # noqa: E402

GGUF = ROOT / "resources" / "SmolLM2-135M-Instruct.Q4_1.gguf"
METRICS = ("decode_tok_s", "engine_decode_tok_s", "prefill_tok_s", "engine_prefill_tok_s", "e2e_ms")
PROBE_LOOP = 200_000  # iterations of the compute probe (~10 ms)
PROBE_BYTES = 32 << 20  # the memory probe's array: larger than the caches, so it streams from memory
PROBES = ("compute", "memory")
PROBE_REPEATS = 3  # the fastest of three: a probe preempted by another process says nothing of the CPU's speed


def _compute_probe() -> float:
    """Seconds for a fixed pure-Python loop: cache-resident integer work."""
    t0 = time.perf_counter()
    x = 0
    for i in range(PROBE_LOOP):
        x += i & 7
    return time.perf_counter() - t0


def _memory_probe(buf: np.ndarray) -> float:
    """Seconds to sum *buf* once (one thread): a memory-bound sweep."""
    t0 = time.perf_counter()
    buf.sum()
    return time.perf_counter() - t0


def probe(cpus: dict[str, int], buf: np.ndarray) -> dict:
    """Probe rates (1/s, the fastest of :data:`PROBE_REPEATS`) on each named CPU: this thread moves
    there, runs the probes, and moves back."""
    home = os.sched_getaffinity(0)
    out = {}
    try:
        for where, cpu in cpus.items():
            os.sched_setaffinity(0, {cpu})
            out[f"{where}_compute"] = 1.0 / min(_compute_probe() for _ in range(PROBE_REPEATS))
            out[f"{where}_memory"] = 1.0 / min(_memory_probe(buf) for _ in range(PROBE_REPEATS))
    finally:
        os.sched_setaffinity(0, home)
    return out


def converted_model(gguf: Path, cache: Path) -> Path:
    """Convert the GGUF once (the engine's fast-loading directory), cached under *cache*."""
    out = cache / f"bench-{gguf.stem}"
    if not (out / "config.json").exists():
        subprocess.run([sys.executable, "-m", "engine", "convert", str(gguf), str(out)], cwd=ROOT, check=True)
    return out


def launch(model: Path, threads: int | None, server_cpus: list[int] | None, log, nice: int | None = None):
    port = free_port()
    argv = [sys.executable, "-m", "engine", "serve", "--model", str(model), "--port", str(port)]
    if threads:
        argv += ["--threads", str(threads)]
    if server_cpus:
        argv = ["taskset", "-c", ",".join(map(str, server_cpus)), *argv]
    if nice is not None:  # a negative niceness (root) keeps other processes on the machine from preempting it
        argv = ["nice", "-n", str(nice), *argv]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            get_json(url, "/health", timeout=1.0)
            return proc, url
        except Exception:  # noqa: BLE001 - not up yet
            if proc.poll() is not None:
                raise SystemExit(f"the engine exited with status {proc.returncode} before it was healthy")
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the engine did not become healthy within 120 s")


def one_request(url: str, messages: list[dict], output_tokens: int, length: int) -> dict:
    body = steady_request_body(messages, output_tokens, 0)
    r = stream_chat(url, body, 600.0)
    t = r.token_times
    timings = r.timings or {}
    n = timings.get("predicted_n")
    return {
        "ttft_ms": t[0] * 1e3, "e2e_ms": r.e2e_s * 1e3, "prefill_tok_s": length / t[0],
        "decode_tok_s": (len(t) - 1) / (t[-1] - t[0]),
        "engine_prefill_tok_s": timings["prompt_n"] / timings["prompt_ms"] * 1e3,
        "engine_decode_tok_s": (n - 1) / timings["predicted_ms"] * 1e3,
        "prompt_n": timings.get("prompt_n"), "completion_tokens": len(t),
    }


def measure(args) -> pd.DataFrame:
    model = converted_model(Path(args.gguf), ROOT / "resources" / "cache")
    ncpu = os.cpu_count() or 1
    server_cpus = client_cpus = None
    if args.probe and ncpu < 2:
        raise SystemExit("--probe needs two CPUs: the server's, where the probe matters, and the client's")
    if (args.pin or args.probe) and ncpu >= 2:
        server_cpus, client_cpus = [ncpu - 1], list(range(ncpu - 1))
        os.sched_setaffinity(0, client_cpus)
    probe_cpus = {"server": server_cpus[0], "client": client_cpus[0]} if args.probe else None
    buf = np.ones(PROBE_BYTES // 4, dtype=np.float32)
    rows, t0 = [], time.perf_counter()
    n_salts = args.launches * (args.requests + 1)
    salts = {str(i): f"nz{i:06d}" for i in range(1, n_salts + 1)}
    with tempfile.TemporaryDirectory(prefix="pairbench-noise-") as tmp, open(Path(tmp) / "server.log", "wb") as log:
        prompts = {}
        proc, url = launch(model, args.threads, server_cpus, log, args.nice)
        try:  # exact-length prompts, one per (launch, request), fitted once with the engine's tokenizer
            tok = lambda messages: tokenize_messages(url, messages)  # noqa: E731
            for length in args.lengths:
                cond = Condition.of(input_tokens=length, output_tokens=args.output_tokens)
                _, body = pb_fixtures.build_fixture(cond, 0, salts, "bench", tok)
                prompts[length] = {r["round"]: r["messages"] for r in body["rounds"]}
        finally:
            proc.terminate()
            proc.wait(30)
        k = 0
        for i in range(1, args.launches + 1):
            proc, url = launch(model, args.threads, server_cpus, log, args.nice)
            try:
                k += 1
                one_request(url, prompts[args.lengths[0]][k], 8, args.lengths[0])  # first request: never a sample
                for j in range(1, args.requests + 1):
                    k += 1
                    for length in args.lengths:
                        load = hostload.snapshot()
                        pre = probe(probe_cpus, buf) if probe_cpus else {}
                        t_start = time.perf_counter() - t0
                        rec = one_request(url, prompts[length][k], args.output_tokens, length)
                        post = probe(probe_cpus, buf) if probe_cpus else {}
                        rows.append({"launch": i, "request": j, "length": length, "t_s": t_start,
                                     "load1": load["load1"], **rec, **{f"pre_{k_}": v for k_, v in pre.items()},
                                     **{f"post_{k_}": v for k_, v in post.items()}})
                        print(f"launch {i} request {j} length {length}: decode {rec['decode_tok_s']:.2f} tok/s "
                              f"(engine {rec['engine_decode_tok_s']:.2f}), prefill {rec['prefill_tok_s']:.1f} tok/s, "
                              f"load {load['load1']:.2f}", file=sys.stderr)
            finally:
                proc.terminate()
                proc.wait(30)
    return pd.DataFrame(rows)


def split(df: pd.DataFrame, metric: str, repeats: int) -> dict:
    """Variance split of log(metric) for one length: within, between launches, drift."""
    x = np.log(df[metric].to_numpy(dtype=float))
    launches = df["launch"].to_numpy()
    ids = sorted(set(launches))
    groups = [x[launches == i] for i in ids]
    within = float(np.mean([g.var(ddof=1) for g in groups if g.size > 1])) if any(g.size > 1 for g in groups) else math.nan
    r = float(np.mean([g.size for g in groups]))
    means = np.array([g.mean() for g in groups])
    times = np.array([df.loc[launches == i, "t_s"].mean() for i in ids])
    drift = resid = math.nan
    if len(ids) >= 3:
        slope, icpt = np.polyfit(times, means, 1)
        fitted = icpt + slope * times
        drift = float(fitted.var(ddof=0))
        resid = float((means - fitted).var(ddof=2)) if len(ids) > 2 else math.nan
    elif len(ids) == 2:
        drift, resid = 0.0, float(means.var(ddof=1))
    between = max(0.0, resid - within / r) if np.isfinite(resid) else math.nan
    lag1 = []
    for g in groups:
        if g.size >= 3:
            lag1.append(np.corrcoef(g[:-1], g[1:])[0, 1])
    sd_pair = math.sqrt(2 * (between + within / repeats)) if np.isfinite(between) else math.nan
    return {"metric": metric, "n": int(x.size), "launches": len(ids), "requests_per_launch": r,
            "sd_within_pct": 100 * math.sqrt(within), "sd_between_pct": 100 * math.sqrt(between),
            "sd_drift_pct": 100 * math.sqrt(drift) if np.isfinite(drift) else math.nan,
            "lag1_autocorr": float(np.nanmean(lag1)) if lag1 else math.nan,
            f"sd_pair_pct_r{repeats}": 100 * sd_pair,
            f"rounds_for_2.5pct_r{repeats}": math.ceil((1.96 * sd_pair / 0.025) ** 2 / 0.955) if np.isfinite(sd_pair) else None,
            "median": float(np.exp(np.median(x)))}


def _corr(x: np.ndarray, y: np.ndarray) -> float:
    ok = np.isfinite(x) & np.isfinite(y)
    return float(np.corrcoef(x[ok], y[ok])[0, 1]) if ok.sum() >= 3 and np.std(x[ok]) > 0 and np.std(y[ok]) > 0 \
        else math.nan


def probe_correlations(df: pd.DataFrame) -> pd.DataFrame:
    """Per length, probe (server/client CPU × compute/memory × before/after/both) and the engine-timed
    decode rate: the correlation of the logs over requests (``r``), within a
    launch (launch means removed, ``r_within``), and of the differences between consecutive requests
    of a launch (``r_pairs``: a paired unit's covariate is the difference of its two probes), with
    the share of the paired variance a regression on the probe would remove, r_pairs²."""
    rows = []
    for length, g in df.sort_values(["launch", "request"]).groupby("length"):
        launch = g["launch"].to_numpy()
        same = launch[1:] == launch[:-1]
        for where in ("server", "client"):
            for kind in PROBES:
                pre, post = f"pre_{where}_{kind}", f"post_{where}_{kind}"
                if pre not in g.columns:
                    continue
                probes = {"before": np.log(g[pre].to_numpy(float)), "after": np.log(g[post].to_numpy(float))}
                probes["both"] = (probes["before"] + probes["after"]) / 2
                for when, x in probes.items():
                    for metric in ("engine_decode_tok_s",):  # the client's rate agrees to ~0.1%
                        y = np.log(g[metric].to_numpy(float))
                        xw = x - pd.Series(x).groupby(launch).transform("mean").to_numpy()
                        yw = y - pd.Series(y).groupby(launch).transform("mean").to_numpy()
                        r_pairs = _corr(np.diff(x)[same], np.diff(y)[same])
                        rows.append({"length": int(length), "cpu": where, "probe": kind, "when": when, "metric": metric,
                                     "n": int(len(g)), "r": _corr(x, y), "r_within": _corr(xw, yw),
                                     "r_pairs": r_pairs, "variance_removed": r_pairs ** 2,
                                     "probe_sd_pct": 100 * float(np.std(x, ddof=1))})
    return pd.DataFrame(rows)


def report(df: pd.DataFrame, repeats: int) -> pd.DataFrame:
    rows = []
    for length, g in df.groupby("length"):
        for metric in METRICS:
            rows.append({"length": int(length), **split(g, metric, repeats)})
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=str(GGUF))
    ap.add_argument("--launches", type=int, default=4)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--pin", action="store_true", help="server on the last CPU, this client on the others")
    ap.add_argument("--probe", action="store_true",
                    help="time a CPU-speed probe on the server's and the client's CPU before and after every "
                         "request, and correlate it with the decode rate (implies --pin)")
    ap.add_argument("--nice", type=int, default=None, help="run the server at this niceness (negative: root only)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats per visit assumed for the paired-SD column")
    ap.add_argument("--csv", help="write every request's row here")
    ap.add_argument("--json", help="write the split here")
    ap.add_argument("--from-csv", help="re-analyse an earlier --csv instead of measuring")
    args = ap.parse_args(argv)
    before = hostload.snapshot()
    df = pd.read_csv(args.from_csv) if args.from_csv else measure(args)
    after = hostload.snapshot()
    if args.csv and not args.from_csv:
        df.to_csv(args.csv, index=False)
    out = report(df, args.repeats)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 20)
    print(out.round(3).to_string(index=False))
    corr = probe_correlations(df)
    if len(corr):
        print("\nCPU-speed probe against the decode rate (log; r over requests, r_within a launch, r_pairs of "
              "consecutive requests' differences):")
        print(corr.round(3).to_string(index=False))
    print(f"load average before {before['load1']:.2f}, after {after['load1']:.2f}; "
          f"max during {df['load1'].max():.2f}; cpus {os.cpu_count()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "load_before": before, "load_after": after,
                                               "split": out.to_dict(orient="records"),
                                               "probe": corr.to_dict(orient="records")}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
