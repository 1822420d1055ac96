"""Command line: ``python -m engine --version | serve ... | convert <gguf> <out_dir> |
tokenizer-dir <model> <out_dir> | build-kernels``."""

import argparse
import sys
import time


def main(argv=None) -> int:
    from . import NATIVE
    from .fastpaths import KNOWN, MODES
    from .weights import DEFAULT_LINEAR, KV_KINDS, LINEAR_KINDS

    parser = argparse.ArgumentParser(prog="python -m engine", description=NATIVE)
    parser.add_argument("--version", action="version", version=NATIVE)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over HTTP (llama.cpp-style API)")
    serve.add_argument("--model", required=True, help="a converted directory, a GGUF file or a named model (tiny)")
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    serve.add_argument("--decode-threads", type=int, default=None,
                       help="native pool threads for each decode step; default (or 0): all of --threads, as "
                            "llama.cpp's --threads is its decode threads, so that servers compared at equal "
                            "--threads decode on equal threads (docs/perf.md, issue 35)")
    serve.add_argument("--max-context", type=int, default=None,
                       help="KV cache positions of each slot (default: the model's whole context, e.g. 8192 for "
                            "SmolLM2); unlike llama-server's -c, not divided among the slots")
    serve.add_argument("--parallel", "-np", type=int, default=1,
                       help="KV cache slots: sequences served at once, each decode step one batched forward over "
                            "all of them (default 1: one generation at a time)")
    serve.add_argument("--batch-tokens", type=int, default=None,
                       help="prompt tokens per forward pass and the token budget of one scheduler step (decode "
                            "tokens plus prompt chunks); default 1024 with --parallel 1, 512 otherwise, so a long "
                            "prompt delays the other streams' next tokens by one chunk (smaller chunks cost more "
                            "CPU per prompt token: measured 1.3x at 512, 1.7x at 256, docs/perf.md)")
    serve.add_argument("--max-queue", type=int, default=128,
                       help="requests that may wait for a slot; one more is refused with 503 (default 128)")
    serve.add_argument("--linear", choices=list(LINEAR_KINDS), default=DEFAULT_LINEAR,
                       help="weight format of the matrix products: auto (default: a GGUF's own q4_1/q8_0 "
                            "blocks with the native kernels, else fp16), fp16, or fp32 (the exact reference)")
    serve.add_argument("--kv", choices=list(KV_KINDS), default="auto",
                       help="KV cache dtype: auto (default: f16 with the native attention kernel, else f32), f16, f32")
    serve.add_argument("--fused-decode", choices=list(MODES), default=None,
                       help="the native decode fast paths (fused block, attention kernel): auto (default, or "
                            "$PAIRBENCH_ENGINE_FUSED_DECODE): where this tree's engine/model.py is the code they "
                            "stand in for (engine/csrc/fastpaths.json), else the Python path with a warning; on: "
                            "refuse to start unless they run; off: the Python decode path")
    serve.add_argument("--fast-path-off", action="append", choices=list(KNOWN), default=None, metavar="NAME",
                       help="turn one native fast path off (repeat for more; default $PAIRBENCH_ENGINE_FAST_PATHS_OFF): "
                            f"{', '.join(KNOWN)}. A harness turns off in every arm what any arm's code turned off")
    serve.add_argument("--malloc-tuning", choices=["on", "off"], default="on",
                       help="on (default): keep memory freed between requests mapped (mallopt), so a steady "
                            "request takes no page faults; off: glibc's defaults")
    from .httpconn import add_arguments as add_connection_arguments, limits_from

    add_connection_arguments(serve)  # connection cap, timeouts, body limits, backlog (engine/httpconn.py)
    conv = sub.add_parser("convert", help="convert a GGUF file to the engine's fast-loading directory "
                                          "(and build the native kernels, so a server start never compiles)")
    conv.add_argument("gguf")
    conv.add_argument("out_dir")
    tdir = sub.add_parser("tokenizer-dir", help="write a Hugging Face tokenizer directory (tokenizer.json, "
                                                "tokenizer_config.json) for a model, e.g. for AIPerf --tokenizer")
    tdir.add_argument("model", help="a GGUF file, a converted directory or a named model")
    tdir.add_argument("out_dir")
    bk = sub.add_parser("build-kernels", help="compile the native kernels into their cache and measure which "
                                              "instruction-set path is fastest on this CPU (./install.sh runs this)")
    bk.add_argument("--model", default=None, help="time the paths on this model's products (default: SmolLM2-135M's "
                                                  "shapes)")
    bk.add_argument("--remeasure", action="store_true", help="measure again even if this CPU has a cached choice")
    fp = sub.add_parser("fastpaths", help="whether this tree's engine/model.py is the code each native fast path "
                                          "stands in for (engine/csrc/fastpaths.json); JSON on stdout")
    fp.add_argument("--record", action="store_true", help="record the current code's fingerprints (after changing "
                                                          "the model code and the kernels together)")
    args = parser.parse_args(argv)

    if args.command == "build-kernels":
        return build_kernels(args)
    if args.command == "fastpaths":
        return fast_paths(args)
    if args.command == "tokenizer-dir":
        from .tokenizer import write_hf_dir
        from .weights import load_tokenizer

        try:
            out = write_hf_dir(*load_tokenizer(args.model), args.out_dir)
        except (ValueError, OSError) as e:
            print(f"tokenizer-dir: {e}", file=sys.stderr)
            return 2
        print(out)
        return 0

    if args.command == "serve":
        from .kernels import QUANT_MAX_ROWS
        from .server import serve as run_server

        # a decode step of more rows would leave the native kernels (QUANT_MAX_ROWS) for dequantize +
        # sgemm: slower, and no longer bit-identical to each stream alone
        if not 1 <= args.parallel <= QUANT_MAX_ROWS:
            parser.error(f"--parallel must be between 1 and {QUANT_MAX_ROWS}, got {args.parallel}")
        if args.batch_tokens is not None and args.batch_tokens < 1:
            parser.error(f"--batch-tokens must be >= 1, got {args.batch_tokens}")
        if args.max_queue < 1:
            parser.error(f"--max-queue must be >= 1, got {args.max_queue}")
        try:
            limits = limits_from(args)
        except ValueError as e:
            parser.error(str(e))

        return run_server(args.model, host=args.host, port=args.port, threads=args.threads,
                          max_context=args.max_context, linear=args.linear,
                          decode_threads=args.decode_threads or 0, kv=args.kv,
                          malloc_tuning=args.malloc_tuning == "on", parallel=args.parallel,
                          batch_tokens=args.batch_tokens, max_queue=args.max_queue, fused_decode=args.fused_decode,
                          fast_paths_off=args.fast_path_off, limits=limits)
    if args.command == "convert":
        from .weights import convert

        from . import native

        t0 = time.perf_counter()
        native.lib()  # warns (never fails) when the kernels cannot be built
        try:
            out = convert(args.gguf, args.out_dir)
        except (ValueError, OSError) as e:
            print(f"convert: {e}", file=sys.stderr)
            return 2
        print(f"converted {args.gguf} -> {out} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        return 0
    return 2


def build_kernels(args) -> int:
    """Compile the kernels; measure (or read from the cache) the fastest instruction-set path and print
    the table, the choice and the library's path (the last line)."""
    from . import isa, native

    try:
        path = native.build(verbose=True)
    except RuntimeError as e:
        print(f"build-kernels: warning: {e}; the engine will use its PyTorch fp16 path", file=sys.stderr)
        return 1
    if native.lib() is None:
        print(f"build-kernels: warning: built {path} but cannot use it: {native.unavailable_reason()}",
              file=sys.stderr)
        return 1
    if args.model:
        from .weights import load

        try:
            step = isa.model_step(load(args.model, max_context=64).model)
        except (ValueError, OSError) as e:
            print(f"build-kernels: {e}", file=sys.stderr)
            return 2
    else:
        step = isa.synthetic_step  # made only if this CPU has no cached choice
    facts = isa.choose(step, remeasure=args.remeasure)
    for name, row in (facts["table_ms"] or {}).items():
        print(f"{name:<11} one decode step's products: {row['rows1_ms']:7.2f} ms for 1 row, "
              f"{row['rows8_ms']:7.2f} ms for 8 rows (1 thread, CPU time)", file=sys.stderr)
    print(f"instruction-set path: {facts['isa']} ({facts['source']}; {facts['cpu']})", file=sys.stderr)
    print(path)
    return 0


def fast_paths(args) -> int:
    """Print each fast path's check as JSON; exit 0 (1 when ``--record`` cannot record)."""
    import json

    from . import fastpaths

    if args.record:
        try:
            fastpaths.record()
        except (ValueError, OSError) as e:
            print(f"fastpaths: {e}", file=sys.stderr)
            return 1
    out = {name: {"matches": c.matches, "objects": list(c.objects), "differs": list(c.differs), "error": c.error}
           for name, c in fastpaths.check().items()}
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
