"""Side-by-side speed and memory of our engine, HF transformers and llama.cpp on one GGUF, in one run.

Not a test: it prints tables (and, with ``--json``, writes the figures). Three phases:

1. **Speed** (always). For each ``--contexts`` length (default 2048 and 8000) every arm gets the same
   prompt token ids, greedy, EOS ignored: prefill tok/s over the prompt, then decode tok/s of the
   ``--decode`` tokens generated right after it (so at that context). ``--reps`` repetitions with
   the arms interleaved inside each (a burst of load from other processes hits all arms alike);
   medians are reported, with ratios against llama.cpp's faster thread setting and transformers.
2. **Memory** (``--memory``): each engine in a fresh process with the same ``--memory-ctx`` context:
   peak RSS after load and after one ``--memory-prompt``-token request (our HTTP server, read from
   /proc/<pid>/status VmHWM; llama-cpp-python in a child Python), and KV bytes per position.
3. **Page faults** (``--faults N``): two of our servers, ``--malloc-tuning on`` and ``off``, N
   interleaved ``--faults-prompt``-token requests each: minor faults per request (the server
   reports ``memory.minor_faults``) and the spread (SD of log prefill rate) of the steady requests.

Arms (``--arms``; all on ``--threads`` prefill threads):
  engine          our engine in-process (``engine.load``, default format: the GGUF's q4_1/q8_0 blocks
                  with the native kernels, f16 KV), decode on 1 thread of the native pool
  engine-2t       the same model, decode on 2 threads of the native pool
  engine-fp16     the pure-PyTorch path (what runs without a compiler, and the engine's old default):
                  fp16 weights, ATen's fp16 GEMV, f32 KV, SDPA attention
  engine-http     ``python -m engine serve`` over HTTP, engine-reported timings
  transformers    ``LlamaForCausalLM.generate`` on the same GGUF (HF's own dequantizer), float32
  llama.cpp       llama-cpp-python, n_threads = n_threads_batch = --threads
  llama.cpp-1t    llama-cpp-python, n_threads = 1 (decode), n_threads_batch = --threads

Definitions (as in docs/contracts.md): prefill tok/s = prompt tokens / time to first token;
decode tok/s = (generated - 1) / (time of last token - time of first token).

    python3 bench/engine_speed.py [--gguf resources/SmolLM2-135M-Instruct.Q4_1.gguf] [--model DIR]
        [--threads 2] [--reps 3] [--contexts 2048,8000] [--decode 32] [--arms ...]
        [--long-arms engine,engine-2t,llama.cpp,llama.cpp-1t] [--memory] [--faults 12] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

DEFAULT_GGUF = REPO / "resources" / "SmolLM2-135M-Instruct.Q4_1.gguf"
ALL_ARMS = ("engine", "engine-2t", "engine-fp16", "engine-http", "transformers", "llama.cpp", "llama.cpp-1t")
DEFAULT_ARMS = "engine,engine-2t,engine-http,transformers,llama.cpp,llama.cpp-1t"
LONG_ARMS = "engine,engine-2t,engine-http,llama.cpp,llama.cpp-1t"
log = functools.partial(print, file=sys.stderr, flush=True)


def make_prompt(tokenizer, n: int) -> list[int]:
    """Exactly ``n`` token ids of ordinary text (this Python's stdlib source, deterministic)."""
    import inspect
    import json.decoder
    import textwrap
    import typing

    text = "".join(inspect.getsource(m) for m in (json.decoder, textwrap, inspect, typing, argparse))
    ids = tokenizer.encode(text)
    if len(ids) < n:
        raise SystemExit(f"prompt source has only {len(ids)} tokens, fewer than {n}")
    return ids[:n]


def rates(t0: float, stamps: list[float], prompt_len: int) -> dict:
    """prefill/decode tok/s from the start time and the arrival time of every generated token."""
    if len(stamps) < 2:
        raise RuntimeError(f"need at least 2 generated tokens to time decode, got {len(stamps)}")
    return {"prefill_tok_s": prompt_len / (stamps[0] - t0),
            "decode_tok_s": (len(stamps) - 1) / (stamps[-1] - stamps[0]),
            "generated": len(stamps)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vm_hwm(pid: int) -> int:
    """Peak resident set size (bytes) of a live process, from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


# ------------------------------------------------------------------------------------------------ arms


class EngineArm:
    """Our engine in-process; ``decode_threads`` sets the native pool (and torch) threads of decode."""

    def __init__(self, loaded, label: str, decode_threads: int = 1):
        self.loaded, self.label, self.decode_threads = loaded, label, decode_threads

    def run(self, ids: list[int], n_new: int) -> dict:
        from engine import native
        from engine.generate import generate

        native.set_threads(self.decode_threads)
        stamps = []
        t0 = time.perf_counter()
        gen = generate(self.loaded.model, ids, n_new, ignore_eos=True, decode_threads=self.decode_threads)
        next(gen)  # prefill + first token
        stamps.append(time.perf_counter())
        for _ in gen:
            stamps.append(time.perf_counter())
        return rates(t0, stamps, len(ids))


class Server:
    """``python -m engine serve`` in a subprocess, waited on until healthy."""

    def __init__(self, model: str, threads: int, max_context: int, extra: list[str] = ()):
        import httpx

        self.port = free_port()
        cmd = [sys.executable, "-m", "engine", "serve", "--model", model, "--port", str(self.port),
               "--host", "127.0.0.1", "--threads", str(threads), "--max-context", str(max_context), *extra]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env=dict(os.environ, PYTHONPATH=str(REPO)))
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=900)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine server exited {self.proc.returncode}: "
                                   f"{self.proc.stderr.read().decode(errors='replace')[-2000:]}")
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError("engine server did not become healthy within 600 s")

    def complete(self, ids: list[int], n_new: int) -> dict:
        body = {"prompt": ids, "max_tokens": n_new, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
        r = self.client.post("/v1/completions", json=body)
        r.raise_for_status()
        doc = r.json()
        t = doc["timings"]
        if t["prompt_n"] != len(ids) or t["predicted_n"] != n_new:
            raise RuntimeError(f"engine-http: evaluated {t['prompt_n']} prompt / {t['predicted_n']} "
                               f"generated tokens, expected {len(ids)} / {n_new}")
        return doc

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class HttpArm:
    """Our server over HTTP; the engine-reported llama.cpp-style timings are used."""

    label = "engine-http"

    def __init__(self, model: str, threads: int, max_context: int):
        self.server = Server(model, threads, max_context)

    def run(self, ids: list[int], n_new: int) -> dict:
        t = self.server.complete(ids, n_new)["timings"]
        # predicted_ms spans the n-1 decode steps after the first token (llama.cpp convention)
        return {"prefill_tok_s": t["prompt_per_second"],
                "decode_tok_s": (t["predicted_n"] - 1) / t["predicted_ms"] * 1e3, "generated": t["predicted_n"]}

    def close(self) -> None:
        self.server.close()


class TransformersArm:
    label = "transformers"

    def __init__(self, gguf: Path):
        os.environ["HF_HUB_OFFLINE"] = "1"
        import gguf as gguf_pkg
        from transformers import AutoModelForCausalLM

        # transformers rebuilds this (pure) name map for every submodule; memoize it for the load.
        orig = gguf_pkg.get_tensor_name_map
        gguf_pkg.get_tensor_name_map = functools.lru_cache(maxsize=None)(orig)
        try:
            self.model = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True)
        finally:
            gguf_pkg.get_tensor_name_map = orig
        self.model.eval()

    def run(self, ids: list[int], n_new: int) -> dict:
        from transformers.generation.streamers import BaseStreamer

        stamps: list[float] = []

        class Clock(BaseStreamer):
            first = True

            def put(self, value):  # the first call carries the prompt, later ones one token each
                if self.first:
                    self.first = False
                    return
                stamps.append(time.perf_counter())

            def end(self):
                pass

        x = torch.tensor([ids])
        t0 = time.perf_counter()
        with torch.inference_mode():
            self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n_new,
                                min_new_tokens=n_new, do_sample=False, pad_token_id=0, streamer=Clock())
        return rates(t0, stamps, len(ids))


class LlamaCppArm:
    def __init__(self, gguf: Path, threads: int, batch_threads: int, n_ctx: int, label: str):
        import llama_cpp

        self.label = label
        self.llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads,
                                   n_threads_batch=batch_threads, n_batch=512, verbose=False)

    def run(self, ids: list[int], n_new: int) -> dict:
        import numpy as np

        llm = self.llm
        llm.reset()  # n_tokens = 0; the next eval drops the cached KV past it
        stamps = []
        t0 = time.perf_counter()
        n_vocab = llm.n_vocab()
        llm.eval(ids)
        for i in range(n_new):
            # without logits_all, Llama.eval keeps no scores: read the last token's logits directly
            tok = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))
            stamps.append(time.perf_counter())
            if i + 1 < n_new:
                llm.eval([tok])
        return rates(t0, stamps, len(ids))


# ------------------------------------------------------------------------------------------------ phases


def speed(args, ids_for, arms_wanted: list[str], long_arms: set[str]) -> tuple[dict, dict]:
    import engine

    n_ctx = max(args.contexts) + args.decode + 16
    arms, skipped = [], {}
    t = time.perf_counter()
    loaded = engine.load(args.model or str(args.gguf), max_context=n_ctx)
    log(f"engine loaded in {time.perf_counter() - t:.1f} s (linear {loaded.linear}, kv {loaded.kv_dtype})")
    if "engine" in arms_wanted:
        arms.append(EngineArm(loaded, "engine", 1))
    if "engine-2t" in arms_wanted:
        arms.append(EngineArm(loaded, "engine-2t", 2))
    if "engine-fp16" in arms_wanted:
        fp16 = engine.load(args.model or str(args.gguf), max_context=n_ctx, linear="fp16", kv="f32")
        for layer in fp16.model.layers:
            layer.attention.decode_attention = None  # SDPA, as without engine.native
        arms.append(EngineArm(fp16, "engine-fp16", 1))
    if "engine-http" in arms_wanted:
        try:
            arms.append(HttpArm(args.model or str(args.gguf), args.threads, n_ctx))
        except Exception as e:  # noqa: BLE001 - report and keep the other arms
            skipped["engine-http"] = f"{type(e).__name__}: {e}"
    if "transformers" in arms_wanted:
        t = time.perf_counter()
        arms.append(TransformersArm(args.gguf))
        log(f"transformers loaded in {time.perf_counter() - t:.1f} s")
    for label, threads in (("llama.cpp", args.threads), ("llama.cpp-1t", 1)):
        if label in arms_wanted:
            try:
                arms.append(LlamaCppArm(args.gguf, threads, args.threads, n_ctx, label))
            except ImportError as e:
                skipped[label] = f"llama-cpp-python not importable ({e})"

    runs: dict = {}
    try:
        for arm in arms:  # warm-up, not counted: first-call allocations, page faults, lazy init
            arm.run(ids_for(64), 4)
        for ctx in args.contexts:
            ids = ids_for(ctx)
            here = [a for a in arms if ctx <= 2048 or a.label in long_arms]
            reps = args.reps if ctx <= 2048 or args.long_reps is None else args.long_reps
            for rep in range(reps):
                for arm in here:  # interleaved: every arm once per repetition
                    r = arm.run(ids, args.decode)
                    runs.setdefault(str(ctx), {}).setdefault(arm.label, []).append(r)
                    log(f"ctx {ctx} rep {rep + 1}/{reps} {arm.label:<13} prefill {r['prefill_tok_s']:7.1f} "
                        f"decode {r['decode_tok_s']:6.1f} tok/s  (load {os.getloadavg()[0]:.1f})")
    finally:
        for arm in arms:
            if hasattr(arm, "close"):
                arm.close()
    return runs, skipped


MEMORY_CHILD_LLAMA = r"""
import json, sys, llama_cpp
gguf, n_ctx, n_prompt, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
llm = llama_cpp.Llama(model_path=gguf, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=512,
                      verbose=False)
after_load = hwm()
ids = json.loads(sys.stdin.read())[:n_prompt]
llm.eval(ids)
for _ in range(8):
    llm.eval([100])
print(json.dumps({"after_load": after_load, "after_request": hwm()}))
"""


def memory(args, ids: list[int]) -> dict:
    from engine.weights import GGUFFile, gguf_config

    cfg = gguf_config(GGUFFile(args.gguf))
    out = {"ctx": args.memory_ctx, "prompt": args.memory_prompt}
    srv = Server(args.model or str(args.gguf), args.threads, args.memory_ctx)
    try:
        after_load = vm_hwm(srv.proc.pid)
        doc = srv.complete(ids[:args.memory_prompt], 8)
        out["engine-http"] = {"after_load": after_load, "after_request": vm_hwm(srv.proc.pid),
                              "reported_peak_rss": doc["memory"]["peak_rss_bytes"],
                              "kv_bytes_per_position": doc["memory"]["kv_bytes_per_position"]}
    finally:
        srv.close()
    try:
        import llama_cpp  # noqa: F401

        r = subprocess.run([sys.executable, "-c", MEMORY_CHILD_LLAMA, str(args.gguf), str(args.memory_ctx),
                            str(args.memory_prompt), str(args.threads)], input=json.dumps(ids),
                           capture_output=True, text=True, check=True)
        # llama.cpp's default KV cache is f16 K and V for every layer and KV head.
        out["llama.cpp"] = dict(json.loads(r.stdout.strip().splitlines()[-1]),
                                kv_bytes_per_position=cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * 2)
    except ImportError as e:
        out["llama.cpp"] = {"skipped": str(e)}
    return out


def faults(args, ids: list[int]) -> dict:
    servers = {mode: Server(args.model or str(args.gguf), args.threads, args.faults_prompt + 64,
                            ["--malloc-tuning", mode]) for mode in ("off", "on")}
    per = {mode: [] for mode in servers}
    try:
        for i in range(args.faults + 1):
            for mode, srv in servers.items():
                doc = srv.complete(ids[:args.faults_prompt], 4)
                per[mode].append({"minor_faults": doc["memory"]["minor_faults"],
                                  "prefill_tok_s": doc["timings"]["prompt_per_second"]})
                log(f"faults {mode:<3} request {i}: {doc['memory']['minor_faults']:>7} minor faults, prefill "
                    f"{doc['timings']['prompt_per_second']:.1f} tok/s")
    finally:
        for srv in servers.values():
            srv.close()
    out = {}
    for mode, recs in per.items():
        steady = recs[1:]  # the first request maps everything for the first time
        logs = [math.log(r["prefill_tok_s"]) for r in steady]
        out[mode] = {"first_request_faults": recs[0]["minor_faults"],
                     "median_faults": statistics.median(r["minor_faults"] for r in steady),
                     "max_faults": max(r["minor_faults"] for r in steady),
                     "prefill_median_tok_s": statistics.median(r["prefill_tok_s"] for r in steady),
                     "prefill_log_sd": statistics.stdev(logs) if len(logs) > 1 else None, "requests": recs}
    return out


# ------------------------------------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--model", help="what our engine loads; default: --gguf converted into a temporary "
                                    "directory with `python -m engine convert`, as the pipeline's build step does")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--contexts", default="2048,8000", type=lambda s: [int(x) for x in s.split(",") if x])
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--arms", default=DEFAULT_ARMS)
    ap.add_argument("--long-arms", default=LONG_ARMS, help="arms also run at contexts above 2048")
    ap.add_argument("--long-reps", type=int, default=None, help="repetitions at contexts above 2048 (default --reps)")
    ap.add_argument("--memory", action="store_true", help="also measure peak RSS and KV bytes per position")
    ap.add_argument("--memory-ctx", type=int, default=8192)
    ap.add_argument("--memory-prompt", type=int, default=2048)
    ap.add_argument("--faults", type=int, default=0, help="requests per malloc setting in the page-fault phase")
    ap.add_argument("--faults-prompt", type=int, default=1024)
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()

    arms_wanted = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms_wanted) - set(ALL_ARMS))
    if unknown:
        ap.error(f"unknown arm(s) {unknown}; choose from {', '.join(ALL_ARMS)}")
    if not args.gguf.is_file():
        ap.error(f"--gguf {args.gguf} does not exist (run ./install.sh)")
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    t_start = time.time()
    if args.model is None:
        import tempfile

        from engine.weights import convert

        tmp = tempfile.TemporaryDirectory(prefix="engine-speed-")
        args.model = str(convert(args.gguf, Path(tmp.name) / "model"))
        log(f"converted {args.gguf.name} into {args.model} in {time.time() - t_start:.1f} s")

    from engine.weights import load_tokenizer

    tok = load_tokenizer(args.model or str(args.gguf))[0]
    longest = make_prompt(tok, max([*args.contexts, args.memory_prompt, args.faults_prompt]))
    ids_for = lambda n: longest[:n]  # noqa: E731

    runs, skipped = speed(args, ids_for, arms_wanted, set(args.long_arms.split(",")))
    mem = memory(args, longest) if args.memory else None
    flt = faults(args, longest) if args.faults else None
    load_after = os.getloadavg()

    med = {ctx: {label: {k: statistics.median(r[k] for r in rs) for k in ("prefill_tok_s", "decode_tok_s")}
                 for label, rs in by_arm.items()} for ctx, by_arm in runs.items()}
    print(f"\n{args.gguf.name}: decode {args.decode} tokens after each prompt, {args.threads} prefill threads, "
          f"median of {args.reps} interleaved reps ({args.long_reps or args.reps} above 2048 tokens)")
    targets = {}
    for ctx, m in med.items():
        ll = max((m[x] for x in ("llama.cpp", "llama.cpp-1t") if x in m), key=lambda v: v["decode_tok_s"],
                 default=None)
        ll_pre = max((m[x]["prefill_tok_s"] for x in ("llama.cpp", "llama.cpp-1t") if x in m), default=None)
        hf = m.get("transformers")
        print(f"\ncontext {ctx}: {'arm':<13} {'prefill tok/s':>13} {'decode tok/s':>12} {'prefill/llama':>13} "
              f"{'decode/llama':>12} {'decode/hf':>9}")
        for label, v in m.items():
            pl = f"{v['prefill_tok_s'] / ll_pre:.2f}" if ll_pre else "-"
            dl = f"{v['decode_tok_s'] / ll['decode_tok_s']:.2f}" if ll else "-"
            dh = f"{v['decode_tok_s'] / hf['decode_tok_s']:.2f}" if hf else "-"
            print(f"{'':<17}{label:<13} {v['prefill_tok_s']:13.1f} {v['decode_tok_s']:12.1f} {pl:>13} {dl:>12} {dh:>9}")
        for label in (x for x in m if x.startswith("engine")):
            checks = {}
            if hf:
                checks["decode >= 2x transformers"] = m[label]["decode_tok_s"] / hf["decode_tok_s"] >= 2
            if ll:
                checks["decode >= 0.8x llama.cpp"] = m[label]["decode_tok_s"] / ll["decode_tok_s"] >= 0.8
                checks["prefill >= 1x llama.cpp"] = m[label]["prefill_tok_s"] / ll_pre >= 1.0
            targets.setdefault(ctx, {})[label] = checks
            print(f"  targets {label:<12} " + "; ".join(f"{k}: {'MET' if v else 'MISSED'}" for k, v in checks.items()))
    print("  (llama.cpp ratios use the faster of its two thread settings at each context)")
    for label, why in skipped.items():
        print(f"{label:<14} skipped: {why}")

    if mem:
        print(f"\nmemory, context {mem['ctx']} positions, one {mem['prompt']}-token request:")
        print(f"  {'engine':<12} {'peak RSS after load':>20} {'after request':>14} {'KV bytes/position':>18}")
        for label in ("engine-http", "llama.cpp"):
            v = mem[label]
            if "skipped" in v:
                print(f"  {label:<12} skipped: {v['skipped']}")
                continue
            print(f"  {label:<12} {v['after_load'] / 2**20:16.0f} MiB {v['after_request'] / 2**20:10.0f} MiB "
                  f"{v['kv_bytes_per_position']:18d}")
        if "after_request" in mem.get("llama.cpp", {}):
            ratio = mem["engine-http"]["after_request"] / mem["llama.cpp"]["after_request"]
            print(f"  peak RSS ratio ours / llama.cpp after the request: {ratio:.2f} "
                  f"(target <= 2: {'MET' if ratio <= 2 else 'MISSED'})")
    if flt:
        print(f"\npage faults, {args.faults_prompt}-token prompts, {args.faults} steady requests per setting:")
        for mode, v in flt.items():
            print(f"  malloc tuning {mode:<3}: first request {v['first_request_faults']} faults; steady median "
                  f"{v['median_faults']:.0f} (max {v['max_faults']}); prefill median {v['prefill_median_tok_s']:.1f} "
                  f"tok/s, SD of log rate {v['prefill_log_sd']:.3f}")
    print(f"\nload average (1/5/15 min) before: {load_before[0]:.1f} {load_before[1]:.1f} {load_before[2]:.1f}, "
          f"after: {load_after[0]:.1f} {load_after[1]:.1f} {load_after[2]:.1f} on {os.cpu_count()} CPUs; "
          f"{(time.time() - t_start) / 60:.1f} min")

    if args.json:
        doc = {"schema": "pairbench.engine_speed/v2", "gguf": args.gguf.name, "contexts": args.contexts,
               "decode_tokens": args.decode, "threads": args.threads, "reps": args.reps,
               "torch": torch.__version__, "python": platform.python_version(), "runs": runs, "median": med,
               "targets": targets, "skipped": skipped, "memory": mem, "faults": flt,
               "loadavg_before": list(load_before), "loadavg_after": list(load_after)}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
