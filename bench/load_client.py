#!/usr/bin/env python3
"""Load-client overhead: client CPU ms per request and p99 schedule lag at the highest load levels.

A script, not a test. It starts the batching fake server (tests/fakes/openai_compat.py) answering
instantly (no prefill or decode cost, slots for every stream), pins it to one CPU and this client to
another (as ``server.pin: auto`` does in a visit), and runs pairbench's load client
(:mod:`pairbench.engines.loadclient`) at a closed-loop concurrency and at open-loop Poisson rates.
Against an instant server every millisecond of a level is the client's or the HTTP stack's, so the
figures are the client's own cost: what it adds to a real engine's level.

Per level it prints: requests, output tokens, wall s, client CPU ms per request, client CPU share
of one core, p99 (and max) schedule lag (open loop: send − scheduled; closed loop: send − the moment
the stream became free), and the achieved concurrency or rate. ``uptime`` is printed before and
after; run it under the exclusive CPU lock:

    flock -x /work/locks/cpu.lock python3 bench/load_client.py --concurrency 8 --rate 2 20 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "workflow"))
from pairbench.analysis.loadlevel import level_metrics  # noqa: E402
from pairbench.core.schedule import arrivals  # noqa: E402
from pairbench.engines.client import steady_request_body  # noqa: E402
from pairbench.engines.loadclient import LoadClient, LoadRequest  # noqa: E402
from pairbench.measure import hostload  # noqa: E402

FAKE = REPO / "tests" / "fakes" / "openai_compat.py"


def uptime(tag: str) -> None:
    print(f"[{tag}] {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}", flush=True)


def start_server(slots: int, cpus: list[int] | None) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, str(FAKE), "--flavor", "vllm", "--port", str(port), "--parallel", str(slots),
            "--decode-s-per-token", "0", "--prefill-s-per-token", "0", "--max-model-len", "65536"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    url = f"http://127.0.0.1:{port}"
    with httpx.Client(trust_env=False) as http:
        for _ in range(400):
            try:
                if http.get(url + "/health", timeout=1).status_code == 200:
                    return proc, url
            except httpx.HTTPError:
                time.sleep(0.05)
    proc.kill()
    raise SystemExit("the fake server did not start")


def prompt_requests(n: int, prompt_tokens: int, output_tokens: int, salt: str) -> list[LoadRequest]:
    """n distinct prompts of about *prompt_tokens* bytes (the fake's tokens are bytes), each salted."""
    out = []
    for i in range(n):
        head = f"{salt}-{i}: "
        text = head + "lorem ipsum " * ((prompt_tokens - len(head)) // 12 + 1)
        out.append(LoadRequest("/v1/chat/completions",
                               steady_request_body([{"role": "user", "content": text[:prompt_tokens]}],
                                                   output_tokens, 0)))
    return out


def summarize(label: str, run) -> dict:
    m = level_metrics(run.client(), level=label.split("#")[0], percentiles=(50, 99))  # "c8#1": level c8, repetition 1
    row = {"level": label, "requests": m.n_requests, "ok": m.n_ok, "errors": m.n_errors,
           "output_tokens": sum(r.streamed_tokens for r in run.records), "wall_s": round(m.wall_s, 3),
           "client_cpu_ms_per_request": round(m.client_cpu_ms_per_request, 2),
           "client_cpu_share": round(m["client_cpu_share"], 3), "lag_p99_ms": round(m["lag_p99_ms"], 2),
           "lag_max_ms": round(m.lag_max_ms, 2), "output_tok_s": round(m["output_tok_s"] or 0, 1),
           "achieved_concurrency": None if m["achieved_concurrency"] is None else round(m["achieved_concurrency"], 3),
           "achieved_rate_rps": None if m["achieved_rate_rps"] is None else round(m["achieved_rate_rps"], 3),
           "offered_rate_rps": None if m.offered_rate_rps is None else round(m.offered_rate_rps, 3)}
    print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, nargs="*", default=[8], help="closed-loop levels (default: 8)")
    p.add_argument("--rate", type=float, nargs="*", default=[2.0], help="open-loop Poisson rates, req/s")
    p.add_argument("--requests", type=int, default=200, help="requests per closed-loop level")
    p.add_argument("--rate-seconds", type=float, default=30.0, help="length of each open-loop level (its count "
                   "is rate × this, at least 100)")
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)

    server_cpus, client_cpus = hostload.pin_sets("auto")
    uptime("before")
    print(f"client CPUs {client_cpus}, server CPUs {server_cpus}; prompts {a.prompt_tokens} tokens, "
          f"outputs {a.output_tokens} tokens; the fake answers instantly", flush=True)
    proc, url = start_server(max([*a.concurrency, 1]) * 4 + 64, server_cpus)
    restore = hostload.pin_self(client_cpus)
    rows = []
    try:
        with LoadClient(url) as lc:
            lc.closed_loop(prompt_requests(32, a.prompt_tokens, a.output_tokens, "warm"), 4, timeout_s=60)
            for rep in range(a.repeats):
                for c in a.concurrency:
                    reqs = prompt_requests(a.requests, a.prompt_tokens, a.output_tokens, f"c{c}-{rep}")
                    rows.append(summarize(f"c{c}#{rep + 1}", lc.closed_loop(reqs, c, timeout_s=60)))
                for r in a.rate:
                    n = max(100, int(r * a.rate_seconds))
                    sched = arrivals(r, seed=rep, n_requests=n)
                    reqs = prompt_requests(n, a.prompt_tokens, a.output_tokens, f"r{r:g}-{rep}")
                    rows.append(summarize(f"r{r:g}#{rep + 1}", lc.open_loop(reqs, sched.offsets_s, timeout_s=60,
                                                                             rate_rps=r)))
    finally:
        if restore is not None:
            hostload.pin_self(restore)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    uptime("after")
    if a.json:
        a.json.write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
