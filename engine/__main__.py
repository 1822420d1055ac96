"""Command line: ``python -m engine --version | serve ... | convert <gguf> <out_dir> |
tokenizer-dir <model> <out_dir> | build-kernels``."""

import argparse
import sys
import time


def main(argv=None) -> int:
    from . import NATIVE
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
                       help="native pool threads for each decode step; 0 = same as --threads. Default: 1 with "
                            "--parallel 1 (with a streaming client on the same 2 cores, 2 measured slower and "
                            "noisier in the default pipeline; alone on an idle machine 2 are ~1.36x), all of "
                            "--threads with several slots (a batched step is a large job: 8 streams measured "
                            "1.30x on 2 threads against 1). See docs/perf.md")
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
    sub.add_parser("build-kernels", help="compile the native kernels into their cache (./install.sh runs this)")
    args = parser.parse_args(argv)

    if args.command == "build-kernels":
        from . import native

        try:
            path = native.build(verbose=True)
        except RuntimeError as e:
            print(f"build-kernels: warning: {e}; the engine will use its PyTorch fp16 path", file=sys.stderr)
            return 1
        L = native.lib()
        if L is None:
            print(f"build-kernels: warning: built {path} but cannot use it: {native.unavailable_reason()}",
                  file=sys.stderr)
            return 1
        print(path)
        return 0
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
                          decode_threads=(1 if args.parallel == 1 else 0) if args.decode_threads is None
                          else args.decode_threads, kv=args.kv,
                          malloc_tuning=args.malloc_tuning == "on", parallel=args.parallel,
                          batch_tokens=args.batch_tokens, max_queue=args.max_queue, limits=limits)
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


if __name__ == "__main__":
    sys.exit(main())
