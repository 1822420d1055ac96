"""Record the A/A timings in ``aa_recorded.csv`` (a real-noise fixture for tests/pairbench/test_stats.py).

Not a benchmark and not run by the tests: it was run once to freeze real timing noise into a file,
so that the statistics tests work on genuine run-to-run variation rather than on a random-number
generator's idea of it. The workload is a stand-in for an LLM request (a 4-layer numpy
matrix stack: one batched "prefill" over ``length`` rows, then 32 single-row "decode" steps, each
token emitted through a JSON encode as a server would); both arms run the *identical* workload, so
any difference between them is noise, which is exactly what an A/A fixture must hold. Rounds are
visited in ABBA order like the real pipeline. Columns follow docs/contracts.md §2; the ``engine_*``
columns time the compute alone, the client columns include the per-token emit overhead.

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python3 tests/data/stats/record_aa.py tests/data/stats/aa_quiet.csv

``aa_quiet.csv`` was recorded that way (single-threaded BLAS, D = 512) on a shared 2-core machine;
``aa_contended.csv`` with D = 1024 and multi-threaded BLAS while five other jobs competed for the
same cores, which is why its run-to-run spread is several times wider. Both are real timings.
"""

import csv
import json
import sys
import time

import numpy as np

D, LAYERS, OUT_TOKENS, ROUNDS, LENGTHS = 512, 4, 32, 10, (128, 512, 2048)
rng = np.random.default_rng(0)
W = [rng.standard_normal((D, D)).astype(np.float32) / np.sqrt(D) for _ in range(LAYERS)]


def request(length: int) -> dict:
    x = rng.standard_normal((length, D)).astype(np.float32)
    t0 = time.perf_counter()
    for w in W:
        x = np.tanh(x @ w)
    t_first = time.perf_counter()  # first token leaves once prefill is done
    engine_prefill = t_first - t0
    h, engine_decode, stamps = x[-1:], 0.0, [t_first]
    for _ in range(OUT_TOKENS - 1):
        s0 = time.perf_counter()
        for w in W:
            h = np.tanh(h @ w)
        engine_decode += time.perf_counter() - s0
        json.dumps({"choices": [{"text": str(float(h[0, 0]))}]})  # the server's emit cost
        stamps.append(time.perf_counter())
    ttft = t_first - t0
    return {"ttft_ms": ttft * 1e3, "e2e_ms": (stamps[-1] - t0) * 1e3,
            "prefill_tok_s": length / ttft, "decode_tok_s": (OUT_TOKENS - 1) / (stamps[-1] - stamps[0]),
            "engine_prefill_tok_s": length / engine_prefill,
            "engine_decode_tok_s": (OUT_TOKENS - 1) / engine_decode,
            "prompt_tokens": length, "completion_tokens": OUT_TOKENS, "tokens_cached": 0,
            "kv_bytes": 2 * LAYERS * (length + OUT_TOKENS) * D * 4, "peak_rss_bytes": 0}


def main(path: str) -> None:
    request(128)  # warm-up, never recorded
    rows, visit = [], 0
    for rnd in range(1, ROUNDS + 1):
        order = ("A", "B") if rnd % 4 in (1, 0) else ("B", "A")  # ABBA BAAB ...
        for arm in order:
            visit += 1
            for length in LENGTHS:
                rec = request(length)
                rows.append({"round": rnd, "arm": arm, "length": length, "visit_index": visit,
                             "attempt": 1, "ok": True, "selected": True,
                             **{k: (round(v, 6) if isinstance(v, float) else v) for k, v in rec.items()}})
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main(sys.argv[1])
