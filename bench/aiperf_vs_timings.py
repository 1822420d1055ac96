"""AIPerf against the embedded engine, with the server's own timings for the same requests beside it.

Not a test. It writes a tokenizer directory from the GGUF (``python -m engine tokenizer-dir``),
starts ``python -m engine serve`` on the converted model, runs ``aiperf profile`` (from its own
virtual environment: AIPerf pins versions the project does not use) with streamed chat requests of
a fixed input and output length, then reads AIPerf's JSON export and the server's per-request
``timings:`` log lines, and prints the two side by side (docs/engines.md records one run).

    python3 -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf
    python3 bench/aiperf_vs_timings.py --aiperf /tmp/aiperf-venv/bin/aiperf [--isl 1024] [--osl 64]
        [--requests 8] [--gguf resources/SmolLM2-135M-Instruct.Q4_1.gguf] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TIMINGS = re.compile(r"timings: prompt_n=(\d+) prompt_ms=([\d.]+) cache_n=(\d+) predicted_n=(\d+) "
                     r"predicted_ms=([\d.]+)")


def metric(doc: dict, name: str, stat: str = "avg"):
    """One statistic of an AIPerf export metric (its JSON keeps each metric at the top level)."""
    m = doc.get(name) or doc.get("records", {}).get(name) or {}
    return m.get(stat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aiperf", required=True, help="the aiperf executable (in its own venv)")
    ap.add_argument("--gguf", type=Path, default=REPO / "resources" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--isl", type=int, default=1024)
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from bench.engine_speed import free_port  # noqa: E402
    from engine.weights import convert  # noqa: E402

    work = Path(tempfile.mkdtemp(prefix="aiperf-"))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    model = convert(args.gguf, work / "model")
    tok_dir = work / "tokenizer"
    subprocess.run([sys.executable, "-m", "engine", "tokenizer-dir", str(args.gguf), str(tok_dir)], cwd=REPO,
                   env=env, check=True, capture_output=True)
    port = free_port()
    log_path = work / "server.log"
    server = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", str(model), "--port", str(port),
                               "--threads", str(args.threads), "--max-context", str(args.isl + args.osl + 256)],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=open(log_path, "w"))
    try:
        import httpx

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        name = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["id"]
        cmd = [args.aiperf, "profile", "--model", name, "--url", f"http://127.0.0.1:{port}",
               "--endpoint-type", "chat", "--streaming", "--tokenizer", str(tok_dir),
               "--prompt-input-tokens-mean", str(args.isl), "--prompt-input-tokens-stddev", "0",
               "--prompt-output-tokens-mean", str(args.osl), "--prompt-output-tokens-stddev", "0",
               "--extra-inputs", "ignore_eos:true", "--extra-inputs", "cache_prompt:false",
               "--use-server-token-count",  # count the tokens the server generated, not a re-tokenization
               "--concurrency", "1", "--request-count", str(args.requests), "--warmup-request-count", "1",
               "--random-seed", "0", "--output-artifact-dir", str(work / "aiperf"), "--ui-type", "none"]
        print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
        r = subprocess.run(cmd, capture_output=True, text=True)
        (work / "aiperf.log").write_text(r.stdout + r.stderr)
        if r.returncode != 0:
            raise SystemExit(f"aiperf exited {r.returncode}; see {work / 'aiperf.log'}:\n{(r.stdout + r.stderr)[-3000:]}")
    finally:
        server.terminate()
        server.wait(timeout=30)

    export = work / "aiperf" / "profile_export_aiperf.json"  # the profiling phase (phases/warmup is apart)
    doc = json.loads(export.read_text())
    rows = [tuple(map(float, m.groups())) for m in TIMINGS.finditer(log_path.read_text())]
    steady = rows[-args.requests:]  # the warm-up request (and AIPerf's readiness probe, if any) come first
    prompt_ms = [r[1] for r in steady]
    itl_ms = [r[4] / (r[3] - 1) for r in steady if r[3] > 1]
    e2e_ms = [r[1] + r[4] for r in steady]
    ours = {"ttft_ms": statistics.mean(prompt_ms), "itl_ms": statistics.mean(itl_ms),
            "e2e_ms": statistics.mean(e2e_ms), "prompt_n": sorted({int(r[0]) for r in steady}),
            "predicted_n": sorted({int(r[3]) for r in steady})}
    theirs = {"ttft_ms": metric(doc, "time_to_first_token"), "itl_ms": metric(doc, "inter_token_latency"),
              "e2e_ms": metric(doc, "request_latency"), "isl": metric(doc, "input_sequence_length"),
              "osl": metric(doc, "output_sequence_length")}
    print(f"\n{args.requests} streamed chat requests, {args.isl} input / {args.osl} output tokens, concurrency 1:")
    print(f"  {'':<26}{'AIPerf':>10}{'server timings':>16}{'difference':>12}")
    for key, label in (("ttft_ms", "TTFT ms (prompt_ms)"), ("itl_ms", "inter-token ms"),
                       ("e2e_ms", "end-to-end ms")):
        a, b = theirs[key], ours[key]
        print(f"  {label:<26}{a:>10.1f}{b:>16.1f}{(a - b) / b * 100:>11.1f}%")
    print(f"  AIPerf ISL/OSL {theirs['isl']}/{theirs['osl']}; server prompt_n {ours['prompt_n']}, "
          f"predicted_n {ours['predicted_n']}; load average {os.getloadavg()[0]:.1f}")
    print(f"  artifacts: {work}")
    if args.json:
        args.json.write_text(json.dumps({"aiperf": theirs, "server": ours, "requests": args.requests,
                                         "isl": args.isl, "osl": args.osl}, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
