#!/usr/bin/env python3
"""Where does llama-server's spread at two threads come from? Launch variants side by side and split it.

Not a test: issue 36's "precision at two threads". On a 2-core machine, llama-server at ``--threads 2``
spread its per-request times several-fold (config/llama-cpp.yaml runs one thread for that reason).
This script launches one llama-server binary in several *variants* (environment, launch flags,
pinning, priority), in alternating order (A B C A B C ...) so that the machine's drift over minutes
meets every variant alike, sends ``--requests`` identical-shape streamed requests to each launch, and
prints per variant and metric (the server's own prefill and decode rates, ``timings``):

- the mean rate;
- the SD of the log rate *within* a launch (between its requests) and *between* launches (what the
  launch means vary beyond what the within part explains);
- what follows for a paired run whose unit is one launch's median of r requests: the SD of one
  pair's log difference, sqrt(2 (between + within / r)), and the 95% half-width that 12 rounds
  would reach (1.96 sd_pair / sqrt(12), as a share).

Each request is ``--length`` prompt token ids (random, seeded, a new draw per request, so nothing can
be reused; ``cache_prompt: false`` besides) and ``--output-tokens`` generated tokens (``ignore_eos``),
streamed, as the pipeline streams. The client's own CPU time per request is printed too.

A variant is ``name:key=value,key=value`` with keys ``env.VAR`` (an environment variable for the
server), ``args`` (extra launch arguments, space-separated), ``threads``, ``pin`` (``split``: server
on the last CPU, this client on the others; ``none``), ``nice`` (the server's nice value, set with
``os.setpriority`` in the child; negative needs root) and ``client_nice`` (this client's, while that
variant's server runs). llama-server's own ``--prio N`` (``args=--prio 2``) renices the server itself.
``burn=N`` starts N competing processes at nice 0 for the launch's requests, each busy
``burn_busy_ms`` then asleep ``burn_idle_ms`` in a loop (default: always busy): a controlled stand-in for
the client, Snakemake and other people's jobs, so that a variant's robustness is measured, not hoped for. Example, from the repository root:

    python3 bench/llama_threads.py --server results/x/src/baseline/build/bin/llama-server \\
        --variant t1:threads=1 --variant t2:threads=2 --variant t2-passive:threads=2,env.OMP_WAIT_POLICY=passive \\
        --launches 3 --requests 6 --length 512 --output-tokens 64 --json out.json

Figures from this machine are in docs/reproductions.md ("Two threads").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "resources" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CLIENT_NICE = os.getpriority(os.PRIO_PROCESS, 0)  # restored after a variant that renices this client


def parse_variant(text: str) -> dict:
    name, _, spec = text.partition(":")
    v = {"name": name, "env": {}, "args": [], "threads": 2, "pin": "none", "nice": None, "client_nice": None,
         "burn": 0, "burn_busy_ms": 1000, "burn_idle_ms": 0}
    for item in filter(None, spec.split(",")):
        key, _, val = item.partition("=")
        if key.startswith("env."):
            v["env"][key[4:]] = val
        elif key == "args":
            v["args"] = val.split()
        elif key == "threads":
            v["threads"] = int(val)
        elif key == "pin":
            v["pin"] = val
        elif key == "nice":
            v["nice"] = int(val)
        elif key == "client_nice":
            v["client_nice"] = int(val)
        elif key in ("burn", "burn_busy_ms", "burn_idle_ms"):
            v[key] = int(val)
        else:
            raise SystemExit(f"variant {name}: unknown key {key!r}")
    return v


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(server: str, model: str, v: dict, ctx: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [server, "--model", model, "--host", "127.0.0.1", "--port", str(port), "--ctx-size", str(ctx),
            "--threads", str(v["threads"]), "--threads-batch", str(v["threads"]), "--parallel", "1", *v["args"]]
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus = cpus[-1:] if v["pin"] == "split" else None

    def pre():
        os.setsid()
        if server_cpus:
            os.sched_setaffinity(0, server_cpus)
        if v["nice"] is not None:
            os.setpriority(os.PRIO_PROCESS, 0, v["nice"])

    env = {**os.environ, **v["env"]}
    proc = subprocess.Popen(argv, stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env, preexec_fn=pre)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{v['name']}: server exited with {proc.returncode} (log {log})")
        time.sleep(0.1)
    if v["pin"] == "split":
        os.sched_setaffinity(0, cpus[:-1])
    if v["client_nice"] is not None:
        os.setpriority(os.PRIO_PROCESS, 0, v["client_nice"])
    return proc, url


def burners(v: dict) -> list[subprocess.Popen]:
    """*burn* competing processes at nice 0, each busy *burn_busy_ms* then asleep *burn_idle_ms*, in a
    loop: a stand-in for what else wants the CPUs during a visit (the client, Snakemake, other jobs)."""
    code = ("import time\nb, i = %f, %f\nwhile True:\n    t = time.perf_counter() + b\n"
            "    while time.perf_counter() < t: pass\n    time.sleep(i)\n") % (v["burn_busy_ms"] / 1e3, v["burn_idle_ms"] / 1e3)
    return [subprocess.Popen([sys.executable, "-c", code], preexec_fn=lambda: os.setpriority(os.PRIO_PROCESS, 0, 0))
            for _ in range(v["burn"])]


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    os.setpriority(os.PRIO_PROCESS, 0, CLIENT_NICE)


def request(url: str, ids: list[int], n: int) -> dict:
    body = {"prompt": ids, "n_predict": n, "ignore_eos": True, "cache_prompt": False, "stream": True,
            "temperature": 0.0, "top_k": 1}
    timings, tokens = None, 0
    with httpx.stream("POST", url + "/completion", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            msg = json.loads(line[6:])
            tokens += 1
            if msg.get("timings"):
                timings = msg["timings"]
    t = timings
    return {"prefill_tok_s": t["prompt_n"] / t["prompt_ms"] * 1e3,
            "decode_tok_s": (t["predicted_n"] - 1) / t["predicted_ms"] * 1e3,
            "prompt_n": t["prompt_n"], "predicted_n": t["predicted_n"]}


def split(values: dict[int, list[float]]) -> dict:
    """Within- and between-launch variance of the log of *values* (launch -> requests)."""
    logs = {k: [math.log(x) for x in v] for k, v in values.items() if v}
    r = statistics.mean(len(v) for v in logs.values())
    within = statistics.mean(statistics.variance(v) for v in logs.values() if len(v) > 1)
    means = [statistics.median(v) for v in logs.values()]
    var_means = statistics.variance(means) if len(means) > 1 else float("nan")
    between = max(var_means - within / r, 0.0)
    sd_pair = math.sqrt(2 * var_means) if len(means) > 1 else float("nan")
    return {"mean": math.exp(statistics.mean(sum(logs.values(), []))), "sd_within": math.sqrt(within),
            "sd_between": math.sqrt(between), "sd_launch_medians": math.sqrt(var_means),
            "sd_pair": sd_pair, "halfwidth_12_rounds": 1.96 * sd_pair / math.sqrt(12)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", default=str(MODEL))
    ap.add_argument("--variant", action="append", required=True, type=parse_variant)
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--log", default="/tmp/llama_threads.log")
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    rows = []
    print(f"load average at start: {os.getloadavg()}", file=sys.stderr)
    for launch_i in range(a.launches):
        order = a.variant if launch_i % 2 == 0 else a.variant[::-1]
        for v in order:
            proc, url = launch(a.server, a.model, v, a.ctx, Path(a.log))
            burn = burners(v)
            try:
                request(url, [rng.randrange(1000, 40000) for _ in range(16)], 4)  # first request: never counted
                for req_i in range(a.requests):
                    ids = [rng.randrange(1000, 40000) for _ in range(a.length)]
                    c0 = resource.getrusage(resource.RUSAGE_SELF)
                    res = request(url, ids, a.output_tokens)
                    c1 = resource.getrusage(resource.RUSAGE_SELF)
                    res.update(variant=v["name"], launch=launch_i, request=req_i, load1=os.getloadavg()[0],
                               client_cpu_ms=((c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)) * 1e3)
                    rows.append(res)
                    print(f"{v['name']:>16} launch {launch_i} req {req_i}: prefill {res['prefill_tok_s']:8.1f} "
                          f"decode {res['decode_tok_s']:7.2f} tok/s  load {res['load1']:.2f}", file=sys.stderr)
            finally:
                for b in burn:
                    b.kill()
                    b.wait()
                stop(proc)
    print(f"load average at end: {os.getloadavg()}", file=sys.stderr)
    summary = {}
    for v in a.variant:
        mine = [r for r in rows if r["variant"] == v["name"]]
        summary[v["name"]] = {"spec": v, "client_cpu_ms": statistics.mean(r["client_cpu_ms"] for r in mine)}
        for metric in ("prefill_tok_s", "decode_tok_s"):
            per_launch: dict[int, list[float]] = {}
            for r in mine:
                per_launch.setdefault(r["launch"], []).append(r[metric])
            summary[v["name"]][metric] = split(per_launch)
    print(f"{'variant':>16} {'metric':>14} {'mean':>9} {'sd_within':>9} {'sd_between':>10} {'sd_pair':>8} {'hw@12':>7}")
    for name, s in summary.items():
        for metric in ("prefill_tok_s", "decode_tok_s"):
            m = s[metric]
            print(f"{name:>16} {metric:>14} {m['mean']:9.2f} {m['sd_within']:9.2%} {m['sd_between']:10.2%} "
                  f"{m['sd_pair']:8.2%} {m['halfwidth_12_rounds']:7.2%}")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": {k: v for k, v in vars(a).items() if k != "variant"},
                                            "summary": summary, "rows": rows}, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
