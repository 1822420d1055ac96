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
    """A server subprocess (``python -m engine serve`` from this tree or another one, or llama.cpp's
    ``llama-server``), waited on until healthy. Its log goes to a temporary file (a pipe nobody
    reads would block a server that logs every request)."""

    def __init__(self, cmd: list[str], label: str, root: Path = REPO, env: dict | None = None):
        import tempfile

        import httpx

        self.label, self.port = label, int(cmd[cmd.index("--port") + 1])
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, cwd=root, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, PYTHONPATH=str(root), **(env or {})))
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=900)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{label} exited {self.proc.returncode}: {self.output()[-2000:]}")
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"{label} did not become healthy within 600 s")

    @classmethod
    def engine(cls, model: str, threads: int, max_context: int, extra: list[str] = (), root: Path = REPO,
               label: str = "engine-http") -> "Server":
        """Our server; ``root``: the tree whose engine/ runs (an old engine, side by side)."""
        port = free_port()
        return cls([sys.executable, "-m", "engine", "serve", "--model", model, "--port", str(port), "--host",
                    "127.0.0.1", "--threads", str(threads), "--max-context", str(max_context), *extra], label, root)

    @classmethod
    def llama(cls, binary: Path, gguf: Path, threads: int, n_ctx: int, parallel: int,
              label: str = "llama-server") -> "Server":
        """llama.cpp's server: -c is the context of all slots together (n_ctx / parallel each)."""
        port = free_port()
        return cls([str(binary), "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                    "--ctx-size", str(n_ctx), "--parallel", str(parallel), "--threads", str(threads),
                    "--threads-batch", str(threads), "--batch-size", "2048"], label)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def complete(self, ids: list[int], n_new: int) -> dict:
        body = {"prompt": ids, "max_tokens": n_new, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
        r = self.client.post("/v1/completions", json=body)
        r.raise_for_status()
        doc = r.json()
        t = doc["timings"]
        if t["prompt_n"] != len(ids) or t["predicted_n"] != n_new:
            raise RuntimeError(f"{self.label}: evaluated {t['prompt_n']} prompt / {t['predicted_n']} "
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
        self.log.close()


class HttpArm:
    """Our server over HTTP; the engine-reported llama.cpp-style timings are used."""

    label = "engine-http"

    def __init__(self, model: str, threads: int, max_context: int):
        self.server = Server.engine(model, threads, max_context)

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
    srv = Server.engine(args.model or str(args.gguf), args.threads, args.memory_ctx)
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
    servers = {mode: Server.engine(args.model or str(args.gguf), args.threads, args.faults_prompt + 64,
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


# ------------------------------------------------------------------------------------------------ serving


def stream_request(url: str, ids: list[int], n_new: int, out: dict, key) -> None:
    """One streamed completion, as a load client sends it: the arrival time of every token's chunk
    (client side) and the final chunk's timings and usage. Runs in its own thread."""
    import httpx

    body = {"prompt": ids, "max_tokens": n_new, "temperature": 0, "ignore_eos": True, "cache_prompt": False,
            "stream": True, "stream_options": {"include_usage": True}}
    chunks, final = [], {}
    t0 = time.perf_counter()
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=3600) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if ev.get("choices"):
                    c = ev["choices"][0]
                    chunks.append((time.perf_counter(), c.get("text") or "", c.get("finish_reason")))
                for k in ("timings", "usage"):
                    if k in ev:
                        final[k] = ev[k]
    except Exception as e:  # noqa: BLE001 - reported by the caller
        out[key] = {"error": f"{type(e).__name__}: {e}"}
        return
    n = (final.get("usage") or {}).get("completion_tokens", len(chunks))
    if len(chunks) == n + 1 and not chunks[-1][1] and chunks[-1][2]:
        chunks.pop()  # a closing chunk that carries only finish_reason (llama-server), not a token
    if len(chunks) != n or n != n_new:
        out[key] = {"error": f"{len(chunks)} token chunks, usage says {n}, asked {n_new}"}
        return
    out[key] = {"t0": t0, "stamps": [c[0] for c in chunks], **final}


def concurrent(server: Server, prompts: list[list[int]], n_new: int) -> dict:
    """len(prompts) streams sent at once. Total decode tok/s counts the tokens that arrive while
    every stream is decoding (after the last stream's first token, up to the first stream's last
    token), over that window: the steady state of N streams, the same for every server."""
    import threading

    def counters() -> dict:  # our server's decode-step counters (llama-server: none)
        if not server.label.startswith("engine"):
            return {}
        lines = server.client.get("/metrics").text.splitlines()
        return {k: float(next(x.split()[1] for x in lines if x.startswith(f"pairbench_engine_{k} ")))
                for k in ("decode_steps_total", "decode_step_seconds_total", "decode_batch_tokens_total")}

    before = counters()
    out: dict = {}
    threads = [threading.Thread(target=stream_request, args=(str(server.client.base_url), ids, n_new, out, i))
               for i, ids in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = counters()
    errors = [v["error"] for v in out.values() if "error" in v]
    if errors:
        raise RuntimeError(f"{server.label}: {errors[0]}")
    runs = [out[i] for i in range(len(prompts))]
    w0, w1 = max(r["stamps"][0] for r in runs), min(r["stamps"][-1] for r in runs)
    in_window = sum(sum(1 for t in r["stamps"] if w0 < t <= w1) for r in runs)
    start = min(r["t0"] for r in runs)
    return {"streams": len(prompts),
            "total_decode_tok_s": in_window / (w1 - w0) if w1 > w0 else None,
            "window_s": w1 - w0,
            "per_stream_decode_tok_s": [(len(r["stamps"]) - 1) / (r["stamps"][-1] - r["stamps"][0]) for r in runs],
            "ttft_s": [r["stamps"][0] - r["t0"] for r in runs],
            "wall_s": max(r["stamps"][-1] for r in runs) - start,
            "engine_decode_tok_s": [(r["timings"]["predicted_n"] - 1) / r["timings"]["predicted_ms"] * 1e3
                                    for r in runs if r.get("timings")],
            # server side: mean time inside a batched decode forward, and tokens per forward
            "server_step_ms": ((after["decode_step_seconds_total"] - before["decode_step_seconds_total"]) * 1e3
                               / max(1, after["decode_steps_total"] - before["decode_steps_total"])) if after else None,
            "server_tokens_per_step": ((after["decode_batch_tokens_total"] - before["decode_batch_tokens_total"])
                                       / max(1, after["decode_steps_total"] - before["decode_steps_total"]))
            if after else None}


def serving(args, longest: list[int]) -> dict:
    """Phase 4 (``--serve``): servers as users run them, side by side in one run.

    a) One stream as the pipeline runs it (``--serve-prompt`` tokens, ``--serve-decode`` generated):
       this engine with its defaults (``--parallel 1``, one decode thread), the same with every
       thread decoding (engine-2t), the engine of ``--old-engine`` (a tree holding the previous
       engine/) and llama-server ``--parallel 1``, all on ``--threads``; the servers' own timings.
    Every repetition runs the servers in a rotated order, so no arm always comes first.
    b) Load: ``--streams`` concurrent streams (distinct ``--load-prompt``-token prompts,
       ``--load-decode`` tokens each) against this engine ``--parallel P`` (decode on 1 and on
       ``--threads`` native threads) and llama-server ``--parallel P``, P = the most streams, each
       slot ``--slot-ctx`` positions.
    c) Memory: afterwards every P-slot server serves P streams that fill their slots; peak RSS
       (VmHWM) of each server process.
    """
    P = max(args.streams)
    model = args.model or str(args.gguf)
    ctx1 = args.serve_prompt + args.serve_decode + 16
    need = max(P * args.load_prompt, P * (args.slot_ctx - args.serve_decode - 8), args.serve_prompt)
    if len(longest) < need:
        raise SystemExit(f"--serve needs {need} prompt tokens of text, the source has {len(longest)}")
    single: dict[str, Server] = {}
    load: dict[str, Server] = {}
    out: dict = {"single": {}, "load": {}, "memory": {}, "config": {
        "threads": args.threads, "parallel": P, "slot_ctx": args.slot_ctx, "serve_prompt": args.serve_prompt,
        "serve_decode": args.serve_decode, "load_prompt": args.load_prompt, "load_decode": args.load_decode,
        "streams": args.streams, "old_engine": str(args.old_engine) if args.old_engine else None,
        "llama_server": str(args.llama_server) if args.llama_server else None}}
    try:
        single["engine"] = Server.engine(model, args.threads, ctx1, label="engine")
        single["engine-2t"] = Server.engine(model, args.threads, ctx1, ["--decode-threads", str(args.threads)],
                                            label="engine-2t")
        if args.old_engine:
            single["engine-old"] = Server.engine(model, args.threads, ctx1, root=args.old_engine, label="engine-old")
        if args.llama_server:
            single["llama-server"] = Server.llama(args.llama_server, args.gguf, args.threads, ctx1, 1)
        p_args = ["--parallel", str(P)]
        load["engine"] = Server.engine(model, args.threads, args.slot_ctx, [*p_args, "--decode-threads", "1"],
                                       label=f"engine-p{P}")
        load["engine-2t"] = Server.engine(model, args.threads, args.slot_ctx,
                                          [*p_args, "--decode-threads", str(args.threads)], label=f"engine-p{P}-2t")
        if args.llama_server:
            load["llama-server"] = Server.llama(args.llama_server, args.gguf, args.threads, P * args.slot_ctx, P,
                                                label=f"llama-server-p{P}")
        ids = longest[:args.serve_prompt]
        for srv in (*single.values(), *load.values()):  # warm-up, not counted
            srv.complete(longest[:64], 4)
        def rotated(servers: dict, rep: int) -> list:
            items = list(servers.items())
            return items[rep % len(items):] + items[:rep % len(items)]

        for rep in range(args.serve_reps):
            for label, srv in rotated(single, rep):
                t = srv.complete(ids, args.serve_decode)["timings"]
                r = {"prefill_tok_s": t["prompt_per_second"],
                     "decode_tok_s": (t["predicted_n"] - 1) / t["predicted_ms"] * 1e3}
                out["single"].setdefault(label, []).append(r)
                log(f"serve single rep {rep + 1}/{args.serve_reps} {label:<13} prefill {r['prefill_tok_s']:7.1f} "
                    f"decode {r['decode_tok_s']:6.1f} tok/s  (load {os.getloadavg()[0]:.1f})")
            for n in args.streams:
                prompts = [longest[i * args.load_prompt:(i + 1) * args.load_prompt] for i in range(n)]
                for label, srv in rotated(load, rep):
                    r = concurrent(srv, prompts, args.load_decode)
                    out["load"].setdefault(str(n), {}).setdefault(label, []).append(r)
                    log(f"serve load {n} streams rep {rep + 1}/{args.serve_reps} {label:<13} total decode "
                        f"{r['total_decode_tok_s'] or float('nan'):6.1f} tok/s, per stream "
                        f"{statistics.median(r['per_stream_decode_tok_s']):5.1f}, wall {r['wall_s']:5.1f} s  "
                        f"(load {os.getloadavg()[0]:.1f})")
        fill = args.slot_ctx - args.serve_decode - 8
        prompts = [longest[i * fill:(i + 1) * fill] for i in range(P)]
        for label, srv in load.items():
            concurrent(srv, prompts, args.serve_decode)
            out["memory"][label] = {"peak_rss_bytes": vm_hwm(srv.proc.pid), "slots": P, "slot_ctx": args.slot_ctx,
                                    "filled_positions": fill + args.serve_decode}
            log(f"serve memory {label:<13} peak RSS {out['memory'][label]['peak_rss_bytes'] / 2**20:.0f} MiB "
                f"after {P} streams of {fill} + {args.serve_decode} tokens")
    finally:
        for srv in (*single.values(), *load.values()):
            srv.close()
    return out


def paired_ratio(num: list, den: list) -> tuple[float, float, float] | None:
    """Median (and range) of the per-repetition ratios num[i] / den[i].

    Both figures of a ratio come from one repetition, a minute or so apart, so the host's drift
    from one repetition to the next (../shared/NOISE.md) drops out, which it does not from a ratio
    of two medians taken across repetitions. Drift within a repetition stays, and shows in the
    range. Repetitions missing either figure are dropped."""
    rs = [a / b for a, b in zip(num, den, strict=True) if a and b]
    return (statistics.median(rs), min(rs), max(rs)) if rs else None


def serving_report(srv: dict) -> dict:
    """Print phase 4's tables and targets; returns the targets as {name: {value, low, high, met}}.

    A target's value is the median of its per-repetition ratios (``paired_ratio``), printed with
    their range."""
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    cfg, targets = srv["config"], {}
    per_rep = lambda rs, k: [r[k] for r in rs]  # noqa: E731
    print(f"\nserving, {cfg['threads']} threads each; one stream: {cfg['serve_prompt']}-token prompt, "
          f"{cfg['serve_decode']} tokens, servers' own timings, median of {len(next(iter(srv['single'].values())))} "
          f"interleaved reps")
    s = {label: {k: med([r[k] for r in rs]) for k in ("prefill_tok_s", "decode_tok_s")}
         for label, rs in srv["single"].items()}
    for label, v in s.items():
        print(f"  {label:<14} prefill {v['prefill_tok_s']:7.1f} tok/s   decode {v['decode_tok_s']:6.1f} tok/s")
    one = srv["single"]
    if "engine-old" in s:
        for k, name in (("decode_tok_s", "decode"), ("prefill_tok_s", "prefill")):
            r = paired_ratio(per_rep(one["engine"], k), per_rep(one["engine-old"], k))
            targets[f"single-stream {name} within 2% of the previous engine"] = (r, r and r[0] >= 0.98)
    if "llama-server" in s:
        for label, how in (("engine", "the pipeline's server flags: one decode thread"),
                           ("engine-2t", "every thread decoding")):
            r = paired_ratio(per_rep(one[label], "decode_tok_s"), per_rep(one["llama-server"], "decode_tok_s"))
            targets[f"{label}: single-stream decode >= 1x llama-server at equal --threads ({how})"] = (
                r, r and r[0] >= 1.0)
    print(f"\nload: N concurrent streams of {cfg['load_prompt']}-token prompts, {cfg['load_decode']} tokens each; "
          f"servers with {cfg['parallel']} slots of {cfg['slot_ctx']}; total decode tok/s while every stream decodes "
          f"(client side), median over reps")
    for n, by in srv["load"].items():
        for label, rs in by.items():
            vals = [r["total_decode_tok_s"] for r in rs if r["total_decode_tok_s"]]
            print(f"  {n:>2} streams {label:<13} total decode {med(vals) or float('nan'):7.1f} tok/s   per stream "
                  f"{med([x for r in rs for x in r['per_stream_decode_tok_s']]):6.1f}   TTFT median "
                  f"{med([x for r in rs for x in r['ttft_s']]):6.2f} s")
    P = cfg["parallel"]
    reps = lambda n, label: per_rep(srv["load"].get(str(n), {}).get(label, []), "total_decode_tok_s")  # noqa: E731
    for label in ("engine", "engine-2t"):
        r = paired_ratio(reps(P, label), reps(1, label))
        if r:  # N streams and 1 stream of the same server, in the same repetition
            targets[f"{label}: {P}-stream total decode >= 2.5x single-stream"] = (r, r[0] >= 2.5)
        r2 = paired_ratio(reps(P, label), reps(P, "llama-server"))
        if r2:
            targets[f"{label}: {P}-stream total decode >= 1x llama-server --parallel {P}"] = (r2, r2[0] >= 1.0)
    if srv["memory"]:
        print(f"\nmemory: peak RSS after {P} streams filling {P} slots of {cfg['slot_ctx']}")
        for label, v in srv["memory"].items():
            print(f"  {label:<14} {v['peak_rss_bytes'] / 2**20:7.0f} MiB")
        if "llama-server" in srv["memory"]:
            for label in ("engine", "engine-2t"):
                ratio = srv["memory"][label]["peak_rss_bytes"] / srv["memory"]["llama-server"]["peak_rss_bytes"]
                targets[f"{label}: peak RSS at {P} slots x {cfg['slot_ctx']} <= 2x llama-server"] = (
                    (ratio, ratio, ratio), ratio <= 2.0)  # one measurement each
    print("\ntargets (issue 24; medians of the per-repetition ratios, their range in brackets):")
    out = {}
    for name, (r, met) in targets.items():
        if r is None:
            print(f"  ------ {name}: no repetition measured both")
            continue
        spread = f" ({r[1]:.2f}-{r[2]:.2f})" if r[1] != r[2] else ""  # peak RSS: one measurement
        print(f"  {'MET   ' if met else 'MISSED'} {name}: {r[0]:.2f}{spread}")
        out[name] = {"value": r[0], "low": r[1], "high": r[2], "met": bool(met)}
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
    ap.add_argument("--serve", action="store_true",
                    help="also run the serving phase: one stream against the previous engine and llama-server, "
                         "N concurrent streams against llama-server --parallel N, peak RSS with every slot filled")
    ap.add_argument("--old-engine", type=Path, help="a tree holding the previous engine/ (e.g. `git archive` of main), "
                                                     "served side by side in the serving phase")
    ap.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary for the serving phase")
    ap.add_argument("--serve-prompt", type=int, default=1024)
    ap.add_argument("--serve-decode", type=int, default=64)
    ap.add_argument("--serve-reps", type=int, default=3)
    ap.add_argument("--streams", default="1,8", type=lambda s: [int(x) for x in s.split(",") if x])
    ap.add_argument("--load-prompt", type=int, default=512)
    ap.add_argument("--load-decode", type=int, default=128)
    ap.add_argument("--slot-ctx", type=int, default=2048, help="positions per slot of the load servers")
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
    serve_need = max(max(args.streams) * args.load_prompt,
                     max(args.streams) * (args.slot_ctx - args.serve_decode - 8), args.serve_prompt) if args.serve else 0
    longest = make_prompt(tok, max([*args.contexts, args.memory_prompt, args.faults_prompt, serve_need]))
    ids_for = lambda n: longest[:n]  # noqa: E731

    runs, skipped = speed(args, ids_for, arms_wanted, set(args.long_arms.split(","))) if arms_wanted else ({}, {})
    mem = memory(args, longest) if args.memory else None
    flt = faults(args, longest) if args.faults else None
    srv = serving(args, longest) if args.serve else None
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
    serve_targets = serving_report(srv) if srv else None
    print(f"\nload average (1/5/15 min) before: {load_before[0]:.1f} {load_before[1]:.1f} {load_before[2]:.1f}, "
          f"after: {load_after[0]:.1f} {load_after[1]:.1f} {load_after[2]:.1f} on {os.cpu_count()} CPUs; "
          f"{(time.time() - t_start) / 60:.1f} min")

    if args.json:
        # v4: serving_targets hold the median of per-repetition ratios ("value") and their range
        # ("low", "high"); v3's values were ratios of medians
        doc = {"schema": "pairbench.engine_speed/v4", "gguf": args.gguf.name, "contexts": args.contexts,
               "decode_tokens": args.decode, "threads": args.threads, "reps": args.reps,
               "torch": torch.__version__, "python": platform.python_version(), "runs": runs, "median": med,
               "targets": targets, "skipped": skipped, "memory": mem, "faults": flt, "serving": srv,
               "serving_targets": serve_targets, "cpu": platform.processor() or platform.machine(),
               "loadavg_before": list(load_before), "loadavg_after": list(load_after)}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
