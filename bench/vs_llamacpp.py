#!/usr/bin/env python3
"""The embedded engine against llama.cpp at equal threads, in one run: issue 35's speed targets.

Not a test: it prints one side-by-side table (and, with ``--json``, writes the figures). For each
thread count of ``--threads`` (default 1 and 2), every engine gets that many threads for prefill and
for decode, as llama.cpp's ``--threads N --threads-batch N`` does:

1. **In process**: ``engine.load`` (the converted model, as the pipeline serves it) against
   llama-cpp-python (``n_threads = n_threads_batch = N``) on the same ``--prompt`` token ids, greedy,
   ``--decode`` tokens: prefill tok/s (prompt / time to first token), decode tok/s ((n - 1) / time
   from the first token to the last).
2. **Served, one stream**: ``python -m engine serve --threads N`` as the pipeline launches it (its
   own defaults otherwise) against ``llama-server --threads N --threads-batch N --parallel 1``; one
   streamed request per repetition, read token by token as the pipeline's client reads it; decode
   and prefill from the servers' own timings (llama.cpp's ``timings``), the client's decode beside.
3. **Served, N streams**: the same servers with ``--parallel --streams`` slots; ``--streams``
   concurrent streams and one stream in the same repetition: total decode tok/s while every stream
   decodes (client side), and the per-repetition ratio N streams / one stream.
4. **Peak RSS** of every server process (VmHWM) at the end.

With ``--old-engine TREE`` (a tree holding a previous engine/, e.g. ``git archive`` of main), that
engine is served beside the others in phase 2 (``--decode-threads N`` too, so it decodes on the same
threads): this engine's one-stream decode and prefill and its peak RSS against it, "no worse than
today". Between two arms the benchmark waits ``--gap-s``: a llama.cpp built with OpenMP keeps its
workers spinning for a while after each evaluation, which would take the next arm's second core.

Every repetition runs the arms in a rotated order, so no arm always comes first; a ratio is the
median of its per-repetition ratios (``engine_speed.paired_ratio``: both figures of a ratio come from
the same minutes), with their range. Run it under ``quiet``: it prints lscpu's model name and the
load average before and after.

    quiet python3 bench/vs_llamacpp.py --llama-server <tree>/build/bin/llama-server [--threads 1,2]
        [--reps 3] [--prompt 1024] [--decode 64] [--streams 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402

from engine_speed import (DEFAULT_GGUF, EngineArm, LlamaCppArm, Server, concurrent, log,  # noqa: E402
                          make_prompt, paired_ratio, vm_hwm)

TARGETS = {"in-process decode": 1.0, "served decode": 1.0, "streams/one": 2.5}


def lscpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "?")


def rotated(items: list, rep: int) -> list:
    return items[rep % len(items):] + items[:rep % len(items)]


def in_process(args, loaded, ids: list[int]) -> dict:
    """{threads: {"engine": [runs], "llama.cpp": [runs]}}: phase 1, arms and thread counts interleaved."""
    from engine import native

    llamas = {t: LlamaCppArm(args.gguf, t, t, len(ids) + args.decode + 16, f"llama.cpp-{t}t") for t in args.threads}
    arms = [(t, "engine", EngineArm(loaded, f"engine-{t}t", t)) for t in args.threads]
    arms += [(t, "llama.cpp", llamas[t]) for t in args.threads]
    out: dict = {t: {"engine": [], "llama.cpp": []} for t in args.threads}
    for arm in (a for _, _, a in arms):  # warm-up, not counted
        torch.set_num_threads(max(args.threads))
        arm.run(ids[:64], 4)
    for rep in range(args.reps):
        for t, name, arm in rotated(arms, rep):
            torch.set_num_threads(t)  # the engine's prefill threads (llama.cpp's are its n_threads_batch)
            native.set_threads(t)
            r = arm.run(ids, args.decode)
            time.sleep(args.gap_s)
            out[t][name].append(r)
            log(f"in-process rep {rep + 1}/{args.reps} {t}t {name:<10} prefill {r['prefill_tok_s']:7.1f} "
                f"decode {r['decode_tok_s']:6.1f} tok/s (load {os.getloadavg()[0]:.1f})")
    return out


def one_stream(srv: Server, ids: list[int], n: int) -> dict:
    """One streamed request: server-timed prefill and decode, and the client's decode."""
    r = concurrent(srv, [ids], n)
    return {"decode_tok_s": r["engine_decode_tok_s"][0], "client_decode_tok_s": r["per_stream_decode_tok_s"][0],
            "prefill_tok_s": len(ids) / r["ttft_s"][0]}


def served(args, model: str, ids: list[int], load_prompts: list[list[int]]) -> tuple[dict, dict, dict, dict]:
    """Phases 2-4. Returns (single {t: {arm: [runs]}}, load {t: {arm: {streams: [runs]}}}, rss, facts)."""
    single_srv, load_srv, facts = {}, {}, {}
    ctx1 = len(ids) + args.decode + 16
    P = args.streams
    try:
        for t in args.threads:
            single_srv[(t, "engine")] = Server.engine(model, t, ctx1, args.engine_args, label=f"engine-{t}t")
            single_srv[(t, "llama.cpp")] = Server.llama(args.llama_server, args.gguf, t, ctx1, 1, f"llama-server-{t}t")
            if args.old_engine:
                single_srv[(t, "engine@old")] = Server.engine(model, t, ctx1, ["--decode-threads", str(t)],
                                                             root=args.old_engine, label=f"engine-old-{t}t")
            load_srv[(t, "engine")] = Server.engine(model, t, args.slot_ctx, ["--parallel", str(P), *args.engine_args],
                                                    label=f"engine-{t}t-p{P}")
            load_srv[(t, "llama.cpp")] = Server.llama(args.llama_server, args.gguf, t, P * args.slot_ctx, P,
                                                      f"llama-server-{t}t-p{P}")
        for key, srv in {**single_srv, **load_srv}.items():
            srv.complete(ids[:64], 4)  # warm-up, not counted
            if key[1] == "engine":
                facts[srv.label] = srv.client.get("/props").json()["engine_facts"]
        single: dict = {t: {name: [] for (u, name) in single_srv if u == t} for t in args.threads}
        load: dict = {t: {"engine": {1: [], P: []}, "llama.cpp": {1: [], P: []}} for t in args.threads}
        for rep in range(args.reps):
            for (t, name), srv in rotated(list(single_srv.items()), rep):
                r = one_stream(srv, ids, args.decode)
                time.sleep(args.gap_s)
                single[t][name].append(r)
                log(f"served rep {rep + 1}/{args.reps} {t}t {name:<10} prefill {r['prefill_tok_s']:7.1f} decode "
                    f"{r['decode_tok_s']:6.1f} (client {r['client_decode_tok_s']:6.1f}) tok/s "
                    f"(load {os.getloadavg()[0]:.1f})")
            for (t, name), srv in rotated(list(load_srv.items()), rep):
                for n in (1, P):
                    r = concurrent(srv, load_prompts[:n], args.load_decode)
                    time.sleep(args.gap_s)
                    load[t][name][n].append(r)
                    log(f"load rep {rep + 1}/{args.reps} {t}t {name:<10} {n} streams: total decode "
                        f"{r['total_decode_tok_s'] or float('nan'):6.1f} tok/s (load {os.getloadavg()[0]:.1f})")
        rss = {f"{t}t {name}{'' if srv in single_srv.values() else f' --parallel {P}'}": vm_hwm(srv.proc.pid)
               for (t, name), srv in [*single_srv.items(), *load_srv.items()]}
    finally:
        for srv in (*single_srv.values(), *load_srv.values()):
            srv.close()
    return single, load, rss, facts


def row(label: str, eng: list, ll: list, target: float | None) -> dict:
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    r = paired_ratio(eng, ll) if ll else None
    return {"measure": label, "engine": med(eng), "llama.cpp": med(ll), "ratio": r,
            "target": target, "met": None if target is None or r is None else r[0] >= target}


def table(args, inproc: dict, single: dict, load: dict) -> list[dict]:
    P, rows = args.streams, []
    for t in args.threads:
        e, ll = inproc[t]["engine"], inproc[t]["llama.cpp"]
        rows.append({"threads": t, **row("in process: decode tok/s", [r["decode_tok_s"] for r in e],
                                         [r["decode_tok_s"] for r in ll], TARGETS["in-process decode"])})
        rows.append({"threads": t, **row("in process: prefill tok/s", [r["prefill_tok_s"] for r in e],
                                         [r["prefill_tok_s"] for r in ll], None)})
        e, ll = single[t]["engine"], single[t]["llama.cpp"]
        rows.append({"threads": t, **row("served, 1 stream: decode tok/s", [r["decode_tok_s"] for r in e],
                                         [r["decode_tok_s"] for r in ll], TARGETS["served decode"])})
        rows.append({"threads": t, **row("served, 1 stream: client decode tok/s",
                                         [r["client_decode_tok_s"] for r in e], [r["client_decode_tok_s"] for r in ll],
                                         None)})
        rows.append({"threads": t, **row("served, 1 stream: prefill tok/s (client TTFT)", [r["prefill_tok_s"] for r in e],
                                         [r["prefill_tok_s"] for r in ll], None)})
        if "engine@old" in single[t]:
            old = single[t]["engine@old"]
            for key, label in (("decode_tok_s", "decode"), ("prefill_tok_s", "prefill (client TTFT)")):
                rows.append({"threads": t, **row(f"served, 1 stream: {label}, this engine / the engine before",
                                                 [r[key] for r in e], [r[key] for r in old], None),
                             "against": "engine before"})
        per = {name: [a["total_decode_tok_s"] / b["total_decode_tok_s"] if a["total_decode_tok_s"] and
                      b["total_decode_tok_s"] else None for a, b in zip(load[t][name][P], load[t][name][1])]
               for name in ("engine", "llama.cpp")}
        for name in ("engine", "llama.cpp"):
            xs = [x for x in per[name] if x]
            rows.append({"threads": t, "measure": f"{name}: {P} streams / 1 stream (total decode)",
                         "engine" if name == "engine" else "llama.cpp": statistics.median(xs) if xs else None,
                         "ratio": (statistics.median(xs), min(xs), max(xs)) if xs else None,
                         "target": TARGETS["streams/one"] if name == "engine" else None,
                         "met": (statistics.median(xs) >= TARGETS["streams/one"]) if xs and name == "engine" else None})
        rows.append({"threads": t, **row(f"served, {P} streams: total decode tok/s",
                                         [r["total_decode_tok_s"] for r in load[t]["engine"][P]],
                                         [r["total_decode_tok_s"] for r in load[t]["llama.cpp"][P]], None)})
    return rows


def print_table(rows: list[dict], rss: dict) -> None:
    fmt = lambda v: "-" if v is None else f"{v:.1f}" if v >= 10 else f"{v:.2f}"  # noqa: E731
    span = lambda r: "-" if r is None else f"{r[0]:.2f} ({r[1]:.2f}-{r[2]:.2f})"  # noqa: E731
    print("\n| threads | measure | engine | llama.cpp | engine / llama.cpp (range) | target |")
    print("|---:|---|---:|---:|---|---|")
    for r in (r for r in rows if "against" not in r):
        ratio = "-" if "streams / 1 stream" in r["measure"] else span(r["ratio"])
        target = "" if r["target"] is None else f"≥ {r['target']}: {'MET' if r['met'] else 'MISSED'}"
        print(f"| {r['threads']} | {r['measure']} | {fmt(r.get('engine'))} | {fmt(r.get('llama.cpp'))} | {ratio} | "
              f"{target} |")
    before = [r for r in rows if "against" in r]
    if before:
        print("\n| threads | measure | this engine | the engine before | ratio (range) |\n|---:|---|---:|---:|---|")
        for r in before:
            print(f"| {r['threads']} | {r['measure']} | {fmt(r['engine'])} | {fmt(r['llama.cpp'])} | {span(r['ratio'])} |")
    print("\n| server | peak RSS (MiB) |\n|---|---:|")
    for label, v in rss.items():
        print(f"| {label} | {v / 2**20:.0f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--llama-server", type=Path, required=True,
                    help="llama-server built from ~/.cache/pairbench/llama.cpp's tag (config/llama-cpp.yaml's flags)")
    ap.add_argument("--threads", default="1,2", type=lambda s: [int(x) for x in s.split(",") if x])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens of the one-stream requests")
    ap.add_argument("--decode", type=int, default=64, help="tokens generated per one-stream request")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--load-prompt", type=int, default=128)
    ap.add_argument("--load-decode", type=int, default=64)
    ap.add_argument("--slot-ctx", type=int, default=512, help="positions per slot of the --parallel servers")
    ap.add_argument("--engine-args", default="", type=lambda s: s.split(), help="more flags for the engine servers")
    ap.add_argument("--old-engine", type=Path, help="a tree holding a previous engine/, served beside (phase 2)")
    ap.add_argument("--gap-s", type=float, default=0.5, help="pause between two arms' runs")
    ap.add_argument("--skip-in-process", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not args.gguf.is_file() or not args.llama_server.is_file():
        ap.error(f"--gguf {args.gguf} and --llama-server {args.llama_server} must exist")
    cpu, load_before, t0 = lscpu_model(), os.getloadavg(), time.time()
    print(f"host: {cpu}, {os.cpu_count()} CPUs; load average before {load_before[0]:.2f} {load_before[1]:.2f} "
          f"{load_before[2]:.2f}", flush=True)
    import engine
    from engine.weights import convert, load_tokenizer

    tmp = tempfile.TemporaryDirectory(prefix="vs-llamacpp-")
    model = str(convert(args.gguf, Path(tmp.name) / "model"))  # what the pipeline's build step hands the server
    longest = make_prompt(load_tokenizer(model)[0], max(args.prompt, args.streams * args.load_prompt))
    ids = longest[:args.prompt]
    load_prompts = [longest[i * args.load_prompt:(i + 1) * args.load_prompt] for i in range(args.streams)]
    inproc = {t: {"engine": [], "llama.cpp": []} for t in args.threads}
    if not args.skip_in_process:
        loaded = engine.load(model, max_context=args.prompt + args.decode + 16)
        inproc = in_process(args, loaded, ids)
        del loaded
    single, load, rss, facts = served(args, model, ids, load_prompts)
    rows = table(args, inproc, single, load)
    load_after = os.getloadavg()
    first = next(iter(facts.values()))
    from engine.facts import summary

    print(f"\n{args.gguf.name}; one stream: {args.prompt}-token prompt, {args.decode} tokens; {args.streams} streams: "
          f"{args.load_prompt}-token prompts, {args.load_decode} tokens each; medians of {args.reps} interleaved "
          f"repetitions; ratios: medians of the per-repetition ratios\nengine: {summary(first)}")
    print_table(rows, rss)
    print(f"\nhost: {cpu}; load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, after "
          f"{load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; {(time.time() - t0) / 60:.1f} min")
    if args.json:
        doc = {"schema": "pairbench.vs_llamacpp/v1", "cpu": cpu, "gguf": args.gguf.name, "threads": args.threads,
               "reps": args.reps, "prompt": args.prompt, "decode": args.decode, "streams": args.streams,
               "load_prompt": args.load_prompt, "load_decode": args.load_decode, "torch": torch.__version__,
               "python": platform.python_version(), "loadavg_before": list(load_before),
               "loadavg_after": list(load_after), "engine_facts": facts, "rows": rows, "peak_rss_bytes": rss,
               "in_process": {str(t): v for t, v in inproc.items()}, "single": {str(t): v for t, v in single.items()},
               "load": {str(t): {a: {str(n): rs for n, rs in by.items()} for a, by in v.items()}
                        for t, v in load.items()}}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
