"""Side-by-side speed of our engine, HF transformers and llama.cpp on one GGUF, in one run.

Not a test: it prints one table (and, with ``--json``, writes the figures). For each arm it measures
prefill tok/s over a ``--prompt``-token prompt (2,048 by default) and decode tok/s of the
``--decode`` tokens generated right after it (so at ~2K context), ``--reps`` times with the arms
interleaved inside each repetition (so a burst of load from other processes hits all arms alike),
and reports medians, then ratios against the issue's targets:

    decode  >= 2x transformers and >= 50% of llama.cpp;  prefill >= 80% of llama.cpp.

Arms (all fed the same prompt token ids, greedy, EOS ignored, same thread count):
  engine          our engine through its Python API (``engine.load`` + ``engine.generate``), fp32
  engine+fp16     the same with ``engine.kernels.quantize_`` (fp16 weights for matrix-vector products)
  engine+fp16+1t  the same, decode steps on 1 intra-op thread (``generate(..., decode_threads=1)``, the server's default)
  engine-http     ``python -m engine serve`` over HTTP, engine-reported timings (``--server``)
  transformers    ``LlamaForCausalLM.generate`` on the same GGUF (HF's own dequantizer), float32
  llama.cpp       llama-cpp-python, n_threads = --threads (skipped when not importable)

Definitions (as in docs/contracts.md): prefill tok/s = prompt tokens / time to first token;
decode tok/s = (generated - 1) / (time of last token - time of first token).

    python3 bench/engine_speed.py [--gguf resources/SmolLM2-135M-Instruct.Q4_1.gguf]
        [--model DIR_OR_GGUF_FOR_OUR_ENGINE] [--threads 2] [--reps 3] [--prompt 2048] [--decode 32]
        [--arms engine,engine+fp16,engine+fp16+1t,transformers,llama.cpp] [--server] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
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
# Issue 2's figures, measured on this machine on 2026-11-29 (for reference only; ratios below use
# the figures measured in this run).
ISSUE_REFERENCE = {"llama.cpp": {"decode_tok_s": 41.5, "prefill_tok_s": 143.0},
                   "transformers": {"decode_tok_s": 8.0}}
ALL_ARMS = ("engine", "engine+fp16", "engine+fp16+1t", "engine-http", "transformers", "llama.cpp")


def make_prompt(tokenizer, n: int) -> list[int]:
    """Exactly ``n`` token ids of ordinary text (this Python's stdlib source, deterministic)."""
    import inspect
    import json.decoder
    import textwrap

    text = "".join(inspect.getsource(m) for m in (json.decoder, textwrap, inspect))
    ids = tokenizer.encode(text)
    if len(ids) < n:
        raise SystemExit(f"prompt source has only {len(ids)} tokens, fewer than --prompt {n}")
    return ids[:n]


def rates(t0: float, stamps: list[float], prompt_len: int) -> dict:
    """prefill/decode tok/s from the start time and the arrival time of every generated token."""
    if len(stamps) < 2:
        raise RuntimeError(f"need at least 2 generated tokens to time decode, got {len(stamps)}")
    return {"prefill_tok_s": prompt_len / (stamps[0] - t0),
            "decode_tok_s": (len(stamps) - 1) / (stamps[-1] - stamps[0]),
            "generated": len(stamps)}


# ------------------------------------------------------------------------------------------------ arms


class EngineArm:
    """``decode_threads``: if set, decode steps (every token after the first) run on that many
    intra-op threads (``generate(decode_threads=...)``) while prefill keeps ``--threads``."""

    def __init__(self, loaded, label: str, decode_threads: int | None = None):
        self.loaded, self.label, self.decode_threads = loaded, label, decode_threads

    def run(self, ids: list[int], n_new: int) -> dict:
        from engine.generate import generate

        model = self.loaded.model
        stamps = []
        t0 = time.perf_counter()
        gen = generate(model, ids, n_new, ignore_eos=True, decode_threads=self.decode_threads)
        next(gen)  # prefill + first token
        stamps.append(time.perf_counter())
        for _ in gen:
            stamps.append(time.perf_counter())
        return rates(t0, stamps, len(ids))


class HttpArm:
    """Our server in a subprocess; the engine-reported llama.cpp-style timings are used."""

    label = "engine-http"

    def __init__(self, model: str, threads: int, max_context: int):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "engine", "serve", "--model", model, "--port", str(self.port),
               "--host", "127.0.0.1", "--threads", str(threads), "--max-context", str(max_context)]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        import httpx

        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=600)
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
            time.sleep(0.5)
        self.close()
        raise RuntimeError("engine server did not become healthy within 600 s")

    def run(self, ids: list[int], n_new: int) -> dict:
        body = {"prompt": ids, "max_tokens": n_new, "temperature": 0, "ignore_eos": True,
                "cache_prompt": False}
        r = self.client.post("/v1/completions", json=body)
        r.raise_for_status()
        doc = r.json()
        t = doc["timings"]
        if t["prompt_n"] != len(ids) or t["predicted_n"] != n_new:
            raise RuntimeError(f"engine-http: evaluated {t['prompt_n']} prompt / {t['predicted_n']} "
                               f"generated tokens, expected {len(ids)} / {n_new}")
        # predicted_ms counts the n-1 decode steps after the first token (llama.cpp convention)
        return {"prefill_tok_s": t["prompt_per_second"], "decode_tok_s": t["predicted_per_second"],
                "generated": t["predicted_n"]}

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


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
    label = "llama.cpp"

    def __init__(self, gguf: Path, threads: int, n_ctx: int):
        import llama_cpp

        self.llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads,
                                   n_threads_batch=threads, n_batch=512, verbose=False)

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


# ------------------------------------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--model", help="what our engine loads (a converted dir is faster); default: --gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--arms", default="engine,engine+fp16,engine+fp16+1t,transformers,llama.cpp")
    ap.add_argument("--server", action="store_true", help="also measure engine-http")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()

    arms_wanted = [a for a in args.arms.split(",") if a]
    if args.server and "engine-http" not in arms_wanted:
        arms_wanted.append("engine-http")
    unknown = sorted(set(arms_wanted) - set(ALL_ARMS))
    if unknown:
        ap.error(f"unknown arm(s) {unknown}; choose from {', '.join(ALL_ARMS)}")
    if not args.gguf.is_file():
        ap.error(f"--gguf {args.gguf} does not exist (run ./install.sh)")
    torch.set_num_threads(args.threads)
    n_ctx = args.prompt + args.decode + 16

    import engine

    log = functools.partial(print, file=sys.stderr, flush=True)
    t = time.perf_counter()
    loaded = engine.load(args.model or str(args.gguf), max_context=n_ctx)
    log(f"engine loaded in {time.perf_counter() - t:.1f} s")
    ids = make_prompt(loaded.tokenizer, args.prompt)

    arms, skipped = [], {}
    if "engine" in arms_wanted:
        arms.append(EngineArm(loaded, "engine"))
    if "engine+fp16" in arms_wanted or "engine+fp16+1t" in arms_wanted:
        from engine import kernels

        fast = dataclasses.replace(loaded, model=copy.deepcopy(loaded.model))
        kernels.quantize_(fast.model)
        if "engine+fp16" in arms_wanted:
            arms.append(EngineArm(fast, "engine+fp16"))
        if "engine+fp16+1t" in arms_wanted:
            arms.append(EngineArm(fast, "engine+fp16+1t", decode_threads=1))
    if "engine-http" in arms_wanted:
        try:
            arms.append(HttpArm(args.model or str(args.gguf), args.threads, n_ctx))
        except Exception as e:  # noqa: BLE001 - report and keep the other arms
            skipped["engine-http"] = f"{type(e).__name__}: {e}"
    if "transformers" in arms_wanted:
        t = time.perf_counter()
        arms.append(TransformersArm(args.gguf))
        log(f"transformers loaded in {time.perf_counter() - t:.1f} s")
    if "llama.cpp" in arms_wanted:
        try:
            arms.append(LlamaCppArm(args.gguf, args.threads, n_ctx))
        except ImportError as e:
            skipped["llama.cpp"] = f"llama-cpp-python not importable ({e})"

    runs: dict[str, list[dict]] = {a.label: [] for a in arms}
    try:
        for arm in arms:  # warm-up, not counted: first-call allocations, page faults, lazy init
            arm.run(ids[:64], 4)
        for rep in range(args.reps):
            for arm in arms:  # interleaved: every arm once per repetition
                r = arm.run(ids, args.decode)
                runs[arm.label].append(r)
                log(f"rep {rep + 1}/{args.reps} {arm.label:<13} prefill {r['prefill_tok_s']:7.1f} "
                    f"decode {r['decode_tok_s']:6.1f} tok/s")
    finally:
        for arm in arms:
            if isinstance(arm, HttpArm):
                arm.close()

    med = {label: {k: statistics.median(r[k] for r in rs) for k in ("prefill_tok_s", "decode_tok_s")}
           for label, rs in runs.items()}
    print(f"\nSmolLM2 {args.gguf.name}: prompt {args.prompt} tokens, decode {args.decode} tokens after it, "
          f"{args.threads} threads, median of {args.reps} interleaved reps")
    print(f"{'arm':<14} {'prefill tok/s':>13} {'decode tok/s':>12} {'prefill/llama':>13} "
          f"{'decode/llama':>12} {'decode/hf':>9}")
    ll, hf = med.get("llama.cpp"), med.get("transformers")
    for label, m in med.items():
        pl = f"{m['prefill_tok_s'] / ll['prefill_tok_s']:.2f}" if ll else "-"
        dl = f"{m['decode_tok_s'] / ll['decode_tok_s']:.2f}" if ll else "-"
        dh = f"{m['decode_tok_s'] / hf['decode_tok_s']:.2f}" if hf else "-"
        print(f"{label:<14} {m['prefill_tok_s']:13.1f} {m['decode_tok_s']:12.1f} {pl:>13} {dl:>12} {dh:>9}")
    for label, why in skipped.items():
        print(f"{label:<14} skipped: {why}")

    targets = {}
    for label in (x for x in med if x.startswith("engine")):
        m = med[label]
        checks = {}
        if hf:
            checks["decode >= 2x transformers"] = m["decode_tok_s"] / hf["decode_tok_s"] >= 2
        if ll:
            checks["decode >= 0.5x llama.cpp"] = m["decode_tok_s"] / ll["decode_tok_s"] >= 0.5
            checks["prefill >= 0.8x llama.cpp"] = m["prefill_tok_s"] / ll["prefill_tok_s"] >= 0.8
        targets[label] = checks
        print(f"targets {label:<12} " + "; ".join(f"{k}: {'MET' if v else 'MISSED'}" for k, v in checks.items()))
    load = os.getloadavg()
    print(f"load average during run (1/5/15 min): {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on "
          f"{os.cpu_count()} CPUs; issue reference: llama.cpp 41.5 decode / 143 prefill, transformers ~8 decode")

    if args.json:
        doc = {"schema": "pairbench.engine_speed/v1", "gguf": args.gguf.name, "prompt_tokens": args.prompt,
               "decode_tokens": args.decode, "threads": args.threads, "reps": args.reps,
               "torch": torch.__version__, "python": platform.python_version(), "runs": runs,
               "median": med, "targets": targets, "skipped": skipped, "loadavg": list(load),
               "issue_reference": ISSUE_REFERENCE}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
