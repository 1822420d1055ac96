"""The engine's own benchmark tool, run from each arm's build: the measurement half of the cross-check.

pairbench measures through the server (HTTP, streaming, its gates). An engine that ships its own
benchmark can say the same thing another way: llama.cpp's ``llama-bench`` times prompt processing
(``pp<N>``: N prompt tokens in one batch, empty context) and token generation (``tg<M>``: M tokens
one at a time after a context of ``n_depth`` tokens) directly on the library. Built from the arm's
own patched tree (the profile's build compiles it beside the server), it runs with the arm's
threads and the run's model, at the run's lengths, in rounds that alternate the arms (ABBA) so
that both meet the same drift of a shared machine:

- ``pp<length>`` for every planned length (compare with the prefill rates);
- ``tg<output_tokens>`` at depth ``<length>``, for every planned length (compare with the decode
  rates, which pairbench measures after a prompt of that length).

The engine profile's ``crosscheck`` section (:attr:`~pairbench.engines.profiles.EngineProfile.crosscheck_spec`)
holds the command templates (``{lengths}`` = comma-separated lengths, ``{output_tokens}``, plus the
launch placeholders) and says which output format they print (``format: llama-bench-json``). Each
run is a step of the one step runner (:func:`pairbench.core.steps.run_step`). Only numbers are kept
in the ``crosscheck/<arm>.json`` artifact; the tool's full output (model path, CPU name) goes to
``private/crosscheck/<arm>.json``. Comparing those numbers with pairbench's verdicts is the
analysis half, :mod:`pairbench.analysis.crosscheck`.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from pairbench.core.steps import StepError, run_step
from pairbench.engines.profiles import CrosscheckSpec, EngineError, arm_engine, load_profile, render
from pairbench.measure import exercise as pb_exercise


class ToolbenchError(Exception):
    """The cross-check tool failed or printed something unreadable; names the arm and the command."""


def has_crosscheck(arm_cfg: dict) -> bool:
    """Whether this arm's engine profile defines a cross-check tool."""
    return load_profile(arm_engine(arm_cfg)).crosscheck_spec is not None


def parse_llama_bench(text: str) -> list[dict]:
    """llama-bench's ``-o json`` output (a list of test objects) as numeric test records."""
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolbenchError(f"llama-bench printed no JSON list ({exc})") from None
    if not isinstance(rows, list):
        raise ToolbenchError("llama-bench printed JSON that is not a list of tests")
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


def tool_commands(arm: str, arm_cfg: dict, *, src_dir: str | os.PathLike, model: str, lengths: list[int],
                  output_tokens: list[int]) -> list[list[str]]:
    """The profile's cross-check commands for *arm*, rendered."""
    profile = load_profile(arm_engine(arm_cfg))
    spec = profile.crosscheck_spec
    if spec is None:
        raise ToolbenchError(f"arm {arm}: engine {profile.name} has no crosscheck section")
    values = {"src": str(Path(src_dir).resolve()), "model": model, "threads": arm_cfg.get("threads"),
              "lengths": ",".join(str(n) for n in lengths), "output_tokens": ",".join(str(n) for n in output_tokens),
              "python": None, "port": None, "ctx": None, "host": None, "commit": None}
    try:
        return [[str(a) for a in render(list(t), values, f"crosscheck.commands[{i}]")]
                for i, t in enumerate(spec.commands)]
    except EngineError as exc:
        raise ToolbenchError(f"arm {arm}: {exc}") from None


def _run_tool(arm: str, argv: list[str], cwd: str, timeout_s: float, log: Path) -> tuple[list[dict], list, dict]:
    name = os.path.basename(argv[0])
    try:
        res = run_step("tool", argv, cwd=cwd, log=log, timeout_s=timeout_s, capture="stdout",
                       subject=f"arm {arm}: {name}")
    except StepError as exc:
        if exc.reason == "not_found":
            raise ToolbenchError(f"arm {arm}: {name} not found; does the build compile it "
                                 "(build.cmake.targets)?") from None
        raise ToolbenchError(str(exc)) from None
    try:
        tests, raw = parse_llama_bench(res.stdout), json.loads(res.stdout)
    except (ToolbenchError, KeyError, TypeError, ValueError) as exc:
        raise ToolbenchError(f"arm {arm}: {name}: {exc}; see {log}") from None
    run = {k: v for k, v in res.record.items() if k != "step"}  # argv by file name only: paths are private
    return tests, raw, run


def run_toolbench(arms: dict[str, dict], *, lengths: list[int], output_tokens: list[int], rounds: int,
                  raw_out: dict[str, str | os.PathLike], log: str | os.PathLike) -> dict[str, dict]:
    """Run the tool for every arm in *arms* (name -> ``{"config", "src_dir", "model"}``, baseline
    first), *rounds* times, alternating ABBA so that both arms meet the same drift of the machine:
    round 1 runs A then B, round 2 B then A, and so on. Each run is the tool's own (``-r 1``, after
    its warm-up). Returns the ``crosscheck`` body of each arm (without ``inputs``): per test the
    rounds' rates (``samples_tok_s``, in round order), their mean and standard deviation."""
    names = list(arms)
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    specs: dict[str, CrosscheckSpec] = {a: load_profile(arm_engine(arms[a]["config"])).crosscheck_spec
                                        for a in names}
    cmds = {a: tool_commands(a, arms[a]["config"], src_dir=arms[a]["src_dir"], model=arms[a]["model"],
                             lengths=lengths, output_tokens=output_tokens) for a in names}
    per: dict[str, dict] = {a: {"runs": [], "raw": [], "samples": {}, "first": {}, "t": 0.0} for a in names}
    for r in range(1, rounds + 1):
        order = names if r % 2 == 1 else names[::-1]
        for a in order:
            for argv in cmds[a]:
                tests, raw, run = _run_tool(a, argv, str(Path(arms[a]["src_dir"]).resolve()),
                                            specs[a].timeout_s, log)
                per[a]["runs"].append({"round": r, **run})
                per[a]["raw"].append(raw)
                per[a]["t"] += run["duration_s"]
                for t in tests:
                    key = (t["test"], t["n_depth"])
                    per[a]["first"].setdefault(key, t)
                    per[a]["samples"].setdefault(key, []).append(t["avg_tok_s"])
    out = {}
    for a in names:
        Path(raw_out[a]).parent.mkdir(parents=True, exist_ok=True)
        Path(raw_out[a]).write_text(json.dumps(per[a]["raw"], indent=1, sort_keys=True) + "\n")
        tests = []
        for key, t in per[a]["first"].items():
            xs = per[a]["samples"][key]
            tests.append({**t, "avg_tok_s": statistics.fmean(xs),
                          "stddev_tok_s": statistics.stdev(xs) if len(xs) > 1 else 0.0, "samples_tok_s": xs})
        out[a] = {"arm": a, "tool": specs[a].tool, "threads": arms[a]["config"].get("threads"),
                  "rounds": rounds, "order": [names if r % 2 == 1 else names[::-1] for r in range(1, rounds + 1)],
                  "runs": per[a]["runs"], "tests": tests, "duration_s": per[a]["t"]}
    return out


def exercise_candidate(arms: dict[str, dict], baseline: str, candidate: str, *, lengths: list[int],
                       output_tokens: list[int], log: str | os.PathLike) -> dict | None:
    """The candidate's exercise record (:mod:`pairbench.measure.exercise`): the functions its patch
    changed in the programs its profile names (``crosscheck.exercise_binaries``), and whether any ran
    under the tool's commands (the candidate's own, rendered as for the cross-check). None when the
    profile names no programs."""
    spec = load_profile(arm_engine(arms[candidate]["config"])).crosscheck_spec
    if spec is None or not spec.exercise_binaries:
        return None
    cmds = tool_commands(candidate, arms[candidate]["config"], src_dir=arms[candidate]["src_dir"],
                         model=arms[candidate]["model"], lengths=lengths, output_tokens=output_tokens)
    return pb_exercise.exercise(baseline_dir=Path(arms[baseline]["src_dir"]).resolve(),
                                candidate_dir=Path(arms[candidate]["src_dir"]).resolve(),
                                binaries=list(spec.exercise_binaries), commands=cmds, log=log,
                                timeout_s=spec.timeout_s)
