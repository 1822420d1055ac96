"""One visit of a load run: every level of the plan, in its round's counterbalanced order.

A load run's visit launches the arm once (as a steady visit does, :func:`pairbench.measure.visit.run_visit`)
and then, level by level in ``plan.load.level_orders[round]`` (forward in one block of the visit
order, reversed in the next, both arms of a round alike):

1. waits until the server says it is idle (its profile's probe: the embedded engine's ``/metrics``
   slots in use and queue, llama-server's ``/slots``, vLLM's scheduler gauges; without one the
   record says *unverified*), and records how the prefix cache is kept out (off in every request, or
   by a launch flag, from the profile; *unproven* where only a per-request flush would defeat it);
2. builds the level's requests from its fixture (one prompt per request, each with its own salt, or
   the round's one prompt with ``load.prefix: shared``) through the arm's adapter, exactly as a steady
   request is built (:meth:`pairbench.engines.adapter.ArmEngine.request`);
3. runs them on the load client (:mod:`pairbench.engines.loadclient`): closed loop at the level's
   concurrency, or open loop on the level's arrival schedule, a pure function of (seed, round,
   level) (:func:`pairbench.core.schedule.arrivals`, :func:`~pairbench.core.schedule.derive_seed`);
4. computes the level's metrics and validity by :mod:`pairbench.analysis.loadlevel`'s definitions
   (handed in by the stage as a :class:`LevelJudge`: imports flow down, and ``analysis`` stands
   above ``measure``), and gates EVERY request through the adapter (native prompt and completion
   tokens; a cold cache from the engine's own per-request counts).

Each level gives one *level record* (``kind: level``: the condition and its factors, the round and
arm, the level's metrics, the aggregated gates with per-gate counts of failing requests, validity
``{ok, failed, messages}``; ``ok`` = every gate and validity passed) and a private body with every
request (``private/levels/<visit>-<condition>.json``). The first measured request's text and token
ids are the level's output, on which validation runs its cases. A level whose requests failed, or
that the client rather than the engine paced, is kept and fails validity, never silently.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Callable

from pairbench.core.artifacts import sha256_bytes
from pairbench.core.conditions import Condition
from pairbench.core.schedule import arrivals, derive_seed
from pairbench.engines.adapter import ArmEngine
from pairbench.engines.loadclient import LevelRun, LoadClient, LoadRequest
from pairbench.engines.profiles import EngineError

progress_log = logging.getLogger("pairbench.progress")
GATES = ("prompt_tokens", "completion_tokens", "cold_cache")


# A level's metrics and validity (:mod:`pairbench.analysis.loadlevel`), handed in by the stage:
# ``judge(run_dict, cond) -> (metrics dict, {"ok", "failed", "messages"})``.
LevelJudge = Callable[[dict, Condition], tuple[dict, dict]]


def level_prompts(prompts_round: dict, n: int) -> list[dict]:
    """The *n* prompts of one level in one round: one per request, or the round's one prompt n times
    (a shared prefix)."""
    reqs = prompts_round.get("requests")
    if reqs is None:
        return [prompts_round] * n
    if len(reqs) != n:
        raise ValueError(f"the fixture holds {len(reqs)} prompts for the round, the plan sends {n}")
    return reqs


def schedule_for(plan: dict, cond: Condition, round_: int, n: int):
    """The open-loop schedule of one level in one round (None in closed loop)."""
    factor, value = cond.load
    if factor != "rate":
        return None
    return arrivals(value, seed=derive_seed(plan["seed"], round_, cond.id), n_requests=n,
                    burstiness=plan["load"]["burstiness"])


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def gate_requests(engine: ArmEngine, run: LevelRun, cond: Condition, counts: list[int | None]) -> list[dict]:
    """Every request through the adapter's gates: ``[{"index", "gates", "flags", "facts"}]``. A failed
    request has its gates None (its error fails the level's validity)."""
    out = []
    for r in run.records:
        if not r.ok:
            out.append({"index": r.index, "gates": {g: None for g in GATES}, "flags": [f"request failed: {r.error}"],
                        "facts": None})
            continue
        gates, flags, facts = engine.gates({"usage": r.usage, "timings": r.timings, "tokens_cached": r.tokens_cached},
                                           length=cond.input_tokens, output_tokens=cond.output_tokens,
                                           streamed_tokens=r.streamed_tokens, tokenize_count=counts[r.index])
        out.append({"index": r.index, "gates": gates, "flags": flags, "facts": facts})
    return out


def aggregate_gates(per_request: list[dict]) -> tuple[dict, dict, list[str]]:
    """(gates, failures, flags) of a level: a gate is False when any request failed it, None when any
    could not be decided (and none failed), else True; ``failures`` counts, per gate, the requests
    that failed it (``<gate>_unproven`` those undecided); one flag per failing gate, with its count
    and its first request's reason."""
    gates, failures, flags = {}, {}, []
    done = [q for q in per_request if q["facts"] is not None]
    for g in GATES:
        vals = [q["gates"][g] for q in done]
        failures[g] = sum(v is False for v in vals)
        failures[f"{g}_unproven"] = sum(v is None for v in vals)
        gates[g] = False if failures[g] else (None if failures[f"{g}_unproven"] or not done else True)
        bad = next((q for q in done if q["gates"][g] is not True), None)
        if bad is not None:
            reason = next((f for f in bad["flags"] if f.startswith(g)), "undecided")
            what = "failed" if failures[g] else "could not decide"
            flags.append(f"{g}: {what} for {failures[g] or failures[f'{g}_unproven']} of {len(per_request)} "
                         f"requests (request {bad['index']}: {reason})")
    return gates, failures, flags


def _output(run: LevelRun, gated: list[dict]) -> tuple[dict, dict | None]:
    """The level's output (the first measured request that completed) and its gate facts."""
    rec = next((r for r in run.records if not r.warmup and r.ok), None)
    if rec is None:
        return {"text": "", "token_ids": []}, None
    return {"text": rec.text, "token_ids": list(rec.token_ids)}, gated[rec.index]["facts"]


@dataclass
class Level:
    """What one level of a visit is: the condition, its position in the visit, its prompts."""

    cond: Condition
    position: int
    prompts: list[dict]
    fixture_round: dict


def run_level(engine: ArmEngine, lc: LoadClient, http, url: str, level: Level, *, plan: dict, round_: int,
              judge: LevelJudge) -> tuple[dict, dict, dict]:
    """Measure one level: ``(record fields, output, private body)`` (the caller adds the visit's keys)."""
    load, cond = plan["load"], level.cond
    idle = _idle(engine, http, url, load["timeout_s"])
    counts = [engine.prompt_count(http, url, p["messages"]) for p in level.prompts]  # None: the reply has it
    requests = [LoadRequest(*engine.request(p["messages"], cond.output_tokens, plan["seed"])) for p in level.prompts]
    factor, value = cond.load
    schedule = schedule_for(plan, cond, round_, len(requests))
    progress_log.info("[measure] level %s (%d/%d): %d requests", cond.id, level.position + 1, len(plan["conditions"]),
                      len(requests))
    if schedule is None:
        run = lc.closed_loop(requests, value, timeout_s=load["timeout_s"], warmup=load["warmup"])
    else:
        run = lc.open_loop(requests, schedule.offsets_s, timeout_s=load["timeout_s"], warmup=load["warmup"],
                           rate_rps=value)
    run_dict = run.to_dict()
    metrics, validity = judge(run_dict, cond)
    gated = gate_requests(engine, run, cond, counts)
    gates, failures, flags = aggregate_gates(gated)
    output, facts = _output(run, gated)
    first = level.fixture_round.get("requests", [level.fixture_round] * (load["warmup"] + 1))
    busy = _started_busy(cond, idle)
    slots = engine.slots
    rec = {
        "condition": cond.id, **dict(cond.values), "kind": "level", "position": level.position,
        "prompt_sha256": first[min(load["warmup"], len(first) - 1)]["prompt_sha256"],
        "output_sha256": sha256_bytes(output["text"].encode()),
        "prompt_tokens": (facts or {}).get("prompt_tokens"), "completion_tokens": (facts or {}).get("completion_tokens"),
        "tokens_cached": (facts or {}).get("tokens_cached"),
        "metrics": metrics, "validity": validity, "gates": gates, "gate_failures": failures,
        "flags": flags + list(validity["messages"]) + ([busy] if busy else []),
        "ok": validity["ok"] and all(g is not False for g in gates.values()) and not busy,
        "idle": idle, "cache": engine.cache_state(), "prefix": load["prefix"], "slots": slots,
        "queued": bool(factor == "concurrency" and slots is not None and value > slots),
        "schedule": None if schedule is None else {k: v for k, v in schedule.to_dict().items() if k != "offsets_s"}
        | {"offsets_sha256": digest(list(schedule.offsets_s))},
    }
    private = {"condition": cond.id, "level": run_dict, "gates": gated,
               "schedule": None if schedule is None else schedule.to_dict()}
    rec["requests_sha256"] = digest(private)
    return rec, output, private


def started_busy(idle: dict) -> bool:
    """Whether a level may have started on a busy server (*idle*: its record's ``idle``): still busy
    when the idle wait gave up, or its probe unreadable. An engine without a probe cannot tell: its
    levels count, and the report says how many were verified idle."""
    return not (idle.get("verified") or str(idle.get("how", "")).startswith("no idle probe"))


def _started_busy(cond: Condition, idle: dict) -> str | None:
    """Why level *cond* does not count because it may have started on a busy server, else None."""
    if not started_busy(idle):
        return None
    return (f"validity idle: level {cond.id} started on a server that was not shown idle "
            f"({idle.get('how')}; last report {idle.get('busy')})")[:300]


def _idle(engine: ArmEngine, http, url: str, timeout_s: float) -> dict:
    """The idle wait before a level; a probe that cannot be read is disclosed, not a failed visit."""
    try:
        return engine.wait_idle(http, url, timeout_s)
    except (EngineError, ValueError) as exc:
        return {"verified": False, "waited_s": 0.0, "busy": None, "how": f"idle probe failed: {exc}"[:300]}


def measure_levels(engine: ArmEngine, url: str, http, *, visit: dict, plan: dict, prompts: dict, fixtures: dict,
                   only: set[str] | None, judge: LevelJudge, alive: Callable[[], bool],
                   where: Callable[[Condition], str]) -> tuple[list[dict], dict]:
    """Every level of one visit in its round's order: ``(records, {condition id: output + "level"})``.
    Raises ``RuntimeError`` (the caller's visit error) when the server dies during a level."""
    round_ = visit["round"]
    n = plan["load"]["warmup"] + plan["load"]["requests"]
    order = [c for c in plan["load"]["level_orders"][str(round_)] if only is None or c in only]
    by_id = {c["id"]: Condition.from_dict(c) for c in plan["conditions"]}
    records, outputs = [], {}
    with LoadClient(url, connect_timeout_s=10.0) as lc:
        for pos, cid in enumerate(order):
            cond = by_id[cid]
            prnd = next(r for r in prompts[cid]["rounds"] if r["round"] == round_)
            frnd = next(r for r in fixtures[cid]["rounds"] if r["round"] == round_)
            level = Level(cond=cond, position=pos, prompts=level_prompts(prnd, n), fixture_round=frnd)
            rec, output, private = run_level(engine, lc, http, url, level, plan=plan, round_=round_, judge=judge)
            if not alive():
                raise RuntimeError(f"{where(cond)}: engine fault: the server exited during the level")
            records.append(rec)
            outputs[cid] = {**output, "level": private}
    return records, outputs
