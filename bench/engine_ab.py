"""This engine against a previous revision of it, side by side in one run, alternating so drift cancels.

Not a test: it prints medians (and the load average), for a kernel or scheduler change's note. Two
phases (``--phases``):

1. **step**: the model's batched decode step in one process. Both revisions' native libraries are
   loaded (the previous one built from ``git archive REV engine``, each build cached by its source)
   and the steps alternate between them one by one: ``--batch`` rows, each over ``--ctx`` cached
   positions, on one native thread. Prints the median step time per library and batch, and each
   library's tok/s at the largest batch over the smallest.
2. **serve**: two ``python -m engine serve --parallel N --decode-threads 1`` servers, the previous
   tree and this one (``bench/engine_speed.py``'s ``engine`` arm). Each repetition measures, per
   server in alternating order, 1 stream and then N concurrent streams (``--prompt`` + ``--decode``
   tokens each), so each N-stream figure has its own server's 1-stream figure from seconds before.
   Prints the medians, the median of the per-repetition N / 1 ratios (issue 24's scaling target),
   and the median of the per-repetition this / previous ratios at N streams.

    python3 bench/engine_ab.py --old REV [--phases step,serve] [--ctx 576] [--batch 1,8] [--steps 40]
        [--reps 8] [--streams 8] [--prompt 512] [--decode 128] [--model DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import engine_speed as es  # noqa: E402  (also puts the repository on sys.path)
import torch  # noqa: E402

from engine import native  # noqa: E402


def export(rev: str, into: Path) -> Path:
    """``git archive REV engine`` unpacked under *into*: the tree a previous-engine server runs from."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(es.REPO), "archive", rev, "engine"], capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"--old {rev}: git archive failed: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def old_library(tree: Path):
    """The previous tree's native library (built on first use), through its own engine/native.py."""
    spec = importlib.util.spec_from_file_location("engine_native_old", tree / "engine" / "native.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    L = mod.lib()
    if L is None:
        raise SystemExit(f"the previous engine's native library is unavailable: {mod.unavailable_reason()}")
    if L.pb_abi_version() != native.ABI_VERSION:
        raise SystemExit(f"the previous library's ABI {L.pb_abi_version()} differs from this one's "
                         f"{native.ABI_VERSION}: its steps cannot run through this model")
    return native._bind(Path(L._name))  # this module's signatures on the same library


def step_phase(args, tree: Path) -> None:
    from engine.weights import load_converted

    libs = {"previous": old_library(tree), "this": native.lib()}
    for L in libs.values():
        L.pb_set_threads(1, native.SPIN_US)
    torch.set_num_threads(1)
    B_max = max(args.batch)
    model = load_converted(Path(args.model), args.ctx + 16, "auto", "auto", slots=B_max).model
    g = torch.Generator().manual_seed(0)
    times: dict = {(name, B): [] for name in libs for B in args.batch}
    with torch.inference_mode():
        for s in range(B_max):  # every slot holds ctx positions of its own
            model.forward(torch.randint(0, model.config.vocab_size, (args.ctx,), generator=g)[None], 0, slot=s)
        for i in range(args.steps):
            for B in args.batch:
                for name in (list(libs) if i % 2 == 0 else list(libs)[::-1]):
                    native._state["lib"] = libs[name]
                    toks = torch.randint(0, model.config.vocab_size, (B,), generator=g)
                    t0 = time.perf_counter()
                    model.decode(toks, torch.full((B,), args.ctx, dtype=torch.int64), torch.arange(B))
                    times[(name, B)].append(time.perf_counter() - t0)
    native._state["lib"] = libs["this"]
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"\nstep: decode step of B rows over {args.ctx} cached positions each, 1 thread, "
          f"{args.steps} alternating steps per library and B (medians)")
    for B in args.batch:
        print(f"  B={B:<3} previous {med[('previous', B)]:7.2f} ms   this {med[('this', B)]:7.2f} ms   "
              f"this/previous {med[('this', B)] / med[('previous', B)]:.3f}")
    lo = min(args.batch)
    for name in libs:
        r = (B_max / med[(name, B_max)]) / (lo / med[(name, lo)])
        print(f"  {name:<8} tok/s at B={B_max} over B={lo}: {r:.2f}")


def serve_phase(args, tree: Path) -> None:
    from engine.weights import load_tokenizer

    N = args.streams
    longest = es.make_prompt(load_tokenizer(args.model)[0], N * args.prompt)
    prompts = [longest[i * args.prompt:(i + 1) * args.prompt] for i in range(N)]
    flags = ["--parallel", str(N), "--decode-threads", "1"]
    ctx = max(2048, args.prompt + args.decode + 16)
    servers = {}
    res: dict = {}
    try:
        servers["previous"] = es.Server.engine(args.model, 2, ctx, flags, root=tree, label=f"engine-previous-p{N}")
        servers["this"] = es.Server.engine(args.model, 2, ctx, flags, label=f"engine-p{N}")
        for srv in servers.values():
            srv.complete(longest[:64], 4)  # warm-up, not counted
        for rep in range(args.reps):
            for name in (list(servers) if rep % 2 == 0 else list(servers)[::-1]):
                one = es.concurrent(servers[name], prompts[:1], args.decode)["total_decode_tok_s"]
                many = es.concurrent(servers[name], prompts, args.decode)["total_decode_tok_s"]
                res.setdefault(name, []).append((one, many))
                es.log(f"serve rep {rep + 1}/{args.reps} {name:<8} 1 stream {one:6.1f}, {N} streams {many:6.1f} "
                       f"tok/s, ratio {many / one:.2f}  (load {os.getloadavg()[0]:.1f})")
    finally:
        for srv in servers.values():
            srv.close()
    print(f"\nserve: --parallel {N} --decode-threads 1 servers, {args.prompt} + {args.decode} tokens a stream, "
          f"{args.reps} repetitions (medians; ratios per repetition, then their median and range)")
    ones = {name: [o for o, _ in rs] for name, rs in res.items()}
    manys = {name: [m for _, m in rs] for name, rs in res.items()}
    for name in res:
        r = es.paired_ratio(manys[name], ones[name])
        print(f"  {name:<8} 1 stream {statistics.median(ones[name]):6.1f}   {N} streams "
              f"{statistics.median(manys[name]):6.1f} tok/s   {N}/1: {r[0]:.2f} ({r[1]:.2f}-{r[2]:.2f})")
    r = es.paired_ratio(manys["this"], manys["previous"])
    print(f"  {N} streams, this / previous: {r[0]:.3f} ({r[1]:.3f}-{r[2]:.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the previous revision (anything `git archive` takes)")
    ap.add_argument("--phases", default="step,serve")
    ap.add_argument("--model", help="a converted model directory (default: the default GGUF, converted)")
    ap.add_argument("--ctx", type=int, default=576, help="cached positions per row in the step phase")
    ap.add_argument("--batch", default="1,8", type=lambda s: sorted(int(x) for x in s.split(",") if x))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    args = ap.parse_args()
    phases = [p for p in args.phases.split(",") if p]
    unknown = sorted(set(phases) - {"step", "serve"})
    if unknown:
        ap.error(f"--phases: unknown {unknown}; choose from step, serve")
    if native.lib() is None:
        raise SystemExit(f"native kernels unavailable: {native.unavailable_reason()}")
    with tempfile.TemporaryDirectory(prefix="engine-ab-") as tmp:
        t0, load0 = time.time(), os.getloadavg()
        if args.model is None:
            from engine.weights import convert

            args.model = str(convert(es.DEFAULT_GGUF, Path(tmp) / "model"))
        tree = export(args.old, Path(tmp) / "old")
        if "step" in phases:
            step_phase(args, tree)
        if "serve" in phases:
            serve_phase(args, tree)
        load1 = os.getloadavg()
    print(f"\n--old {args.old}; load average (1/5/15 min) before: {' '.join(f'{x:.1f}' for x in load0)}, after: "
          f"{' '.join(f'{x:.1f}' for x in load1)} on {os.cpu_count()} CPUs; {(time.time() - t0) / 60:.1f} min")


if __name__ == "__main__":
    main()
