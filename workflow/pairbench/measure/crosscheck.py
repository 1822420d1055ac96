"""An independent cross-check of one arm: the engine's own benchmark tool, run from the arm's build.

pairbench measures through the server (HTTP, streaming, its gates). An engine that ships its own
benchmark can say the same thing another way: llama.cpp's ``llama-bench`` times prompt processing
(``pp<N>``: N prompt tokens in one batch, empty context) and token generation (``tg<M>``: M tokens
one at a time after a context of ``n_depth`` tokens) directly on the library. Built from the arm's
own patched tree (the profile's build compiles it beside the server), it runs with the arm's
threads and the run's model, at the run's lengths:

- ``pp<length>`` for every planned length (compare with the prefill rates);
- ``tg<output_tokens>`` at depth ``<length>``, for every planned length (compare with the decode
  rates, which pairbench measures after a prompt of that length).

The engine profile's ``crosscheck`` section holds the command templates (``{lengths}`` =
comma-separated lengths, ``{output_tokens}``, ``{repetitions}``, plus the launch placeholders) and
says which output format they print (``format: llama-bench-json``). Only numbers are kept in the
``crosscheck/<arm>.json`` artifact; the tool's full output (model path, CPU name) goes to
``private/crosscheck/<arm>.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from pairbench.engines.profiles import EngineError, arm_engine, load_profile, render


class CrosscheckError(Exception):
    """The cross-check tool failed or printed something unreadable; names the arm and the command."""


def has_crosscheck(arm_cfg: dict) -> bool:
    """Whether this arm's engine profile defines a cross-check tool."""
    return bool(load_profile(arm_engine(arm_cfg)).data.get("crosscheck"))


def parse_llama_bench(text: str) -> list[dict]:
    """llama-bench's ``-o json`` output (a list of test objects) as numeric test records."""
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CrosscheckError(f"llama-bench printed no JSON list ({exc})") from None
    if not isinstance(rows, list):
        raise CrosscheckError("llama-bench printed JSON that is not a list of tests")
    tests = []
    for row in rows:
        n_prompt, n_gen = int(row["n_prompt"]), int(row["n_gen"])
        kind = "pp" if n_gen == 0 else "tg"
        tests.append({
            "test": f"{kind}{n_prompt if kind == 'pp' else n_gen}",
            "kind": kind,
            "n_prompt": n_prompt,
            "n_gen": n_gen,
            "n_depth": int(row.get("n_depth", 0)),
            "n_threads": int(row["n_threads"]),
            "n_batch": int(row["n_batch"]),
            "n_ubatch": int(row["n_ubatch"]),
            "avg_tok_s": float(row["avg_ts"]),
            "stddev_tok_s": float(row["stddev_ts"]),
            "samples_tok_s": [float(x) for x in row.get("samples_ts") or []],
        })
    return tests


def run_crosscheck(arm: str, arm_cfg: dict, *, src_dir: str | os.PathLike, model: str, lengths: list[int],
                   output_tokens: int, repetitions: int, raw_out: str | os.PathLike, log: str | os.PathLike) -> dict:
    """Run the profile's cross-check commands for *arm*; return the ``crosscheck`` body (without
    ``inputs``). The tool's raw output is written to *raw_out* (private)."""
    profile = load_profile(arm_engine(arm_cfg))
    spec = profile.data.get("crosscheck")
    if not spec:
        raise CrosscheckError(f"arm {arm}: engine {profile.name} has no crosscheck section")
    values = {"src": str(Path(src_dir).resolve()), "model": model, "threads": arm_cfg.get("threads"),
              "lengths": ",".join(str(n) for n in lengths), "output_tokens": output_tokens,
              "repetitions": repetitions, "python": None, "port": None, "ctx": None, "host": None, "commit": None}
    raw, tests, runs = [], [], []
    t0 = time.perf_counter()
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    for i, template in enumerate(spec["commands"]):
        try:
            argv = [str(a) for a in render(list(template), values, f"crosscheck.commands[{i}]")]
        except EngineError as exc:
            raise CrosscheckError(f"arm {arm}: {exc}") from None
        t1 = time.perf_counter()
        with open(log, "a") as fh:
            fh.write(f"$ {' '.join(argv)}\n")
            fh.flush()
            try:
                proc = subprocess.run(argv, cwd=values["src"], stdout=subprocess.PIPE, stderr=fh, text=True,
                                      timeout=float(spec.get("timeout_s", 1800)))
            except FileNotFoundError:
                raise CrosscheckError(f"arm {arm}: {os.path.basename(argv[0])} not found; does the build "
                                      "compile it (build.cmake.targets)?") from None
            except subprocess.TimeoutExpired:
                raise CrosscheckError(f"arm {arm}: {os.path.basename(argv[0])} exceeded "
                                      f"{spec.get('timeout_s', 1800)} s; see {log}") from None
        name = os.path.basename(argv[0])
        if proc.returncode != 0:
            raise CrosscheckError(f"arm {arm}: {name} exited with status {proc.returncode}; see {log}")
        try:
            got = parse_llama_bench(proc.stdout)
        except (CrosscheckError, KeyError, TypeError, ValueError) as exc:
            raise CrosscheckError(f"arm {arm}: {name}: {exc}; see {log}") from None
        raw.append(json.loads(proc.stdout))
        tests.extend(got)
        # argv recorded by file name only: the model path and the tree's location are private
        runs.append({"argv": [os.path.basename(a) if os.path.isabs(a) else a for a in argv],
                     "exit_code": proc.returncode, "duration_s": time.perf_counter() - t1})
    Path(raw_out).parent.mkdir(parents=True, exist_ok=True)
    Path(raw_out).write_text(json.dumps(raw, indent=1, sort_keys=True) + "\n")
    return {"arm": arm, "tool": spec["tool"], "threads": arm_cfg.get("threads"), "repetitions": repetitions,
            "runs": runs, "tests": tests, "duration_s": time.perf_counter() - t0}
