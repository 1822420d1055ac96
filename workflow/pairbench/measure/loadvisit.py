"""One visit of a load run: every level of the plan, in its round's counterbalanced order.

A load run's visit launches the arm once (as a steady visit does, :func:`pairbench.measure.visit.run_visit`)
and then, level by level in ``plan.load.level_orders[round]`` (forward in one block of the visit
order, reversed in the next, both arms of a round alike):

1. waits until the server says it is idle (its profile's probe: the embedded engine's ``/metrics``
   slots in use and queue, llama-server's ``/slots``, vLLM's scheduler gauges; without one the
   record says *unverified*), and records how the prefix cache is kept out (off in every request, or
   by a launch flag, from the profile; *unproven* where only a per-request flush would defeat it);
2. prepares the level's requests from its fixture (one prompt per request, each with its own salt,
   or the round's one prompt with ``load.prefix: shared``) through the arm's adapter, exactly as a
   steady request is prepared (:meth:`pairbench.engines.adapter.ArmEngine.prepare`: the body from the
   condition, the server's prompt count where the reply carries none);
3. runs them on the load client (:mod:`pairbench.engines.loadclient`, every line read by the
   adapter's :meth:`~pairbench.engines.adapter.ArmEngine.read_line`): closed loop at the level's
   concurrency, or open loop on the level's arrival schedule, a pure function of (seed, round,
   level) (:func:`pairbench.core.schedule.arrivals`, :func:`~pairbench.core.schedule.derive_seed`);
4. gates EVERY request through the adapter (:meth:`~pairbench.engines.adapter.ArmEngine.judge`:
   native prompt and completion tokens; a cold cache from the engine's own per-request counts).

Each level gives one *level record* (``kind: level``: the condition and its factors, the round and
arm, the aggregated gates with per-gate counts of failing requests, ``ok`` = no gate failed, the idle
wait and the cache state, and under ``client`` the raw times the statistics read: the level's wall
and client CPU time and, per request, when it was due, sent and ended and when each token arrived)
and a private body with everything of every request (``private/levels/<visit>-<condition>.json``).
The level's metrics (throughput, TTFT/ITL/e2e percentiles, goodput) and its validity (the client
paced it, requests failed, the load was not held) are not computed here: :mod:`pairbench.analysis.loadlevel`
computes them from the raw times when the visit is read, so a change to a definition reruns
``stats``, never a visit. The first measured request's text and token ids are the level's output, on
which validation runs its cases.
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
from pairbench.engines.exchange import Link, Prepared
from pairbench.engines.loadclient import LevelRun, LoadClient, LoadRequest
from pairbench.engines.profiles import EngineError

progress_log = logging.getLogger("pairbench.progress")
GATES = ("prompt_tokens", "completion_tokens", "cold_cache")


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


def gate_requests(engine: ArmEngine, run: LevelRun, cond: Condition, prepared: list[Prepared]) -> list[dict]:
    """Every request through the adapter's gates (:meth:`ArmEngine.judge`): ``[{"index", "gates",
    "flags", "facts"}]``. A failed request has its gates None (the statistics count it as an error)."""
    out = []
    for r in run.records:
        if not r.ok:
            out.append({"index": r.index, "gates": {g: None for g in GATES}, "flags": [f"request failed: {r.error}"],
                        "facts": None})
            continue
        ex = engine.judge(r.result, cond, prepared[r.index].tokenize_count)
        out.append({"index": r.index, "gates": ex.gates, "flags": ex.flags, "facts": ex.facts})
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
    return {"text": rec.result.text, "token_ids": list(rec.result.token_ids)}, gated[rec.index]["facts"]


@dataclass
class Level:
    """What one level of a visit is: the condition, its position in the visit, its prompts."""

    cond: Condition
    position: int
    prompts: list[dict]
    fixture_round: dict


def _run(engine: ArmEngine, lc: LoadClient, link: Link, level: Level, plan: dict, round_: int):
    """Prepare and send one level's requests: ``(prepared, run, schedule)``."""
    load, cond = plan["load"], level.cond
    prepared = [engine.prepare(p["messages"], cond, plan["seed"], link) for p in level.prompts]
    requests = [LoadRequest(p.path, p.body) for p in prepared]
    factor, value = cond.load
    schedule = schedule_for(plan, cond, round_, len(requests))
    progress_log.info("[measure] level %s (%d/%d): %d requests", cond.id, level.position + 1, len(plan["conditions"]),
                      len(requests))
    if schedule is None:
        run = lc.closed_loop(requests, value, timeout_s=load["timeout_s"], warmup=load["warmup"])
    else:
        run = lc.open_loop(requests, schedule.offsets_s, timeout_s=load["timeout_s"], warmup=load["warmup"],
                           rate_rps=value)
    return prepared, run, schedule


def run_level(engine: ArmEngine, lc: LoadClient, link: Link, level: Level, *, plan: dict, visit: dict,
              attempt: int) -> tuple[dict, dict, dict]:
    """Measure one level of *visit*: ``(level record, output, private body)``."""
    load, cond = plan["load"], level.cond
    idle = _idle(engine, link, load["timeout_s"])
    prepared, run, schedule = _run(engine, lc, link, level, plan, visit["round"])
    gated = gate_requests(engine, run, cond, prepared)
    gates, failures, flags = aggregate_gates(gated)
    output, facts = _output(run, gated)
    first = level.fixture_round.get("requests", [level.fixture_round] * (load["warmup"] + 1))
    slots = engine.slots
    rec = {
        "condition": cond.id, **dict(cond.values), "round": visit["round"], "arm": visit["arm"], "kind": "level",
        "visit_index": visit["index"], "attempt": attempt, "repeat": 1, "position": level.position,
        "prompt_sha256": first[min(load["warmup"], len(first) - 1)]["prompt_sha256"],
        "output_sha256": sha256_bytes(output["text"].encode()),
        "prompt_tokens": (facts or {}).get("prompt_tokens"), "completion_tokens": (facts or {}).get("completion_tokens"),
        "tokens_cached": (facts or {}).get("tokens_cached"),
        "client": run.client(), "gates": gates, "gate_failures": failures, "flags": flags,
        "ok": all(g is not False for g in gates.values()),
        "idle": idle, "cache": engine.cache_state(), "prefix": load["prefix"], "slots": slots,
        "queued": bool(cond.load[0] == "concurrency" and slots is not None and cond.load[1] > slots),
        "schedule": None if schedule is None else {k: v for k, v in schedule.to_dict().items() if k != "offsets_s"}
        | {"offsets_sha256": digest(list(schedule.offsets_s))},
    }
    private = {"condition": cond.id, "level": run.to_dict(), "gates": gated,
               "schedule": None if schedule is None else schedule.to_dict()}
    rec["requests_sha256"] = digest(private)
    return rec, output, private


def _idle(engine: ArmEngine, link: Link, timeout_s: float) -> dict:
    """The idle wait before a level; a probe that cannot be read is disclosed, not a failed visit."""
    try:
        return engine.wait_idle(link.http, link.url, timeout_s)
    except (EngineError, ValueError) as exc:
        return {"verified": False, "waited_s": 0.0, "busy": None, "how": f"idle probe failed: {exc}"[:300]}


def measure_levels(engine: ArmEngine, link: Link, *, visit: dict, plan: dict, prompts: dict, fixtures: dict,
                   only: set[str] | None, attempt: int, alive: Callable[[], bool],
                   where: Callable[[Condition], str]) -> tuple[list[dict], dict]:
    """Every level of one visit in its round's order: ``(records, {condition id: output + "level"})``.
    Raises ``RuntimeError`` (the caller's visit error) when the server dies during a level."""
    round_ = visit["round"]
    n = plan["load"]["warmup"] + plan["load"]["requests"]
    order = [c for c in plan["load"]["level_orders"][str(round_)] if only is None or c in only]
    by_id = {c["id"]: Condition.from_dict(c) for c in plan["conditions"]}
    records, outputs = [], {}
    with LoadClient(link.url, connect_timeout_s=10.0, read_line=engine.read_line) as lc:
        for pos, cid in enumerate(order):
            cond = by_id[cid]
            prnd = next(r for r in prompts[cid]["rounds"] if r["round"] == round_)
            frnd = next(r for r in fixtures[cid]["rounds"] if r["round"] == round_)
            level = Level(cond=cond, position=pos, prompts=level_prompts(prnd, n), fixture_round=frnd)
            rec, output, private = run_level(engine, lc, link, level, plan=plan, visit=visit, attempt=attempt)
            if not alive():
                raise RuntimeError(f"{where(cond)}: engine fault: the server exited during the level")
            records.append(rec)
            outputs[cid] = {**output, "level": private}
    return records, outputs
