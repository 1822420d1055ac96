"""Command line: ``python -m engine --version | serve ... | convert <gguf> <out_dir>``."""

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
    serve.add_argument("--decode-threads", type=int, default=1,
                       help="intra-op threads for each decode step (default 1: faster than 2 on this "
                            "project's 2-core machines, see docs/perf.md; 0 = same as --threads)")
    serve.add_argument("--max-context", type=int, default=None,
                       help="KV cache positions (default: min(model context, 4096))")
    serve.add_argument("--linear", choices=list(LINEAR_KINDS), default=DEFAULT_LINEAR,
                       help="weight format of the matrix products: auto (default: a GGUF's own q4_1/q8_0 "
                            "blocks with the native kernels, else fp16), fp16, or fp32 (the exact reference)")
    serve.add_argument("--kv", choices=list(KV_KINDS), default="auto",
                       help="KV cache dtype: auto (default: f16 with the native attention kernel, else f32), f16, f32")
    conv = sub.add_parser("convert", help="convert a GGUF file to the engine's fast-loading directory")
    conv.add_argument("gguf")
    conv.add_argument("out_dir")
    args = parser.parse_args(argv)

    if args.command == "serve":
        from .server import serve as run_server

        return run_server(args.model, host=args.host, port=args.port, threads=args.threads,
                          max_context=args.max_context, linear=args.linear,
                          decode_threads=args.decode_threads or None)
    if args.command == "convert":
        from .weights import convert

        t0 = time.perf_counter()
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
