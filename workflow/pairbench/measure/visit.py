"""One visit (and one warmup): launch the arm, first request, steady requests, gates, stop.

A *visit* (``measure/r<NN>-<arm>.json``) launches the arm's server from ``src/<arm>/``, sends a
short first request (kept apart as a first-request diagnostic: it pays for lazy initialisation and
is never a steady sample), then one steady streamed request per condition (its fixture), then stops
the server. Every engine, the embedded one included, is driven through its profile's adapter
(:class:`pairbench.engines.adapter.ArmEngine`), and every steady request is one exchange
(:meth:`~pairbench.engines.adapter.ArmEngine.exchange`): the request built from the condition in the
engine's dialect (greedy, exact output length, prefix cache off), the prompt counted, the stream
read, and the three gates (docs/contracts.md §2):

- ``prompt_tokens``: the engine's native prompt count equals the condition's ``input_tokens``;
- ``completion_tokens``: its completion count (and the tokens streamed) equal its ``output_tokens``;
- ``cold_cache``: the engine's own evidence (its profile's ``cold_cache``) shows every prompt token
  was evaluated and none reused.

A record that fails a gate is kept with ``ok: false`` and a flag per reason; the statistics exclude
it and the report counts it. An *engine fault* (the server does not start, dies mid-stream, hangs past
``request_timeout_s``, or sends malformed server-sent events) is not a sample at all: it fails the
visit with a :class:`VisitError` naming the arm, the round and the condition, and the config's
``retries`` lets Snakemake re-attempt the visit; the ``attempt`` (1 = first) is recorded.

Progress: every steady request logs ``[measure] <visit> arm=… round=… condition=…: n/N tokens`` on the
``pairbench.progress`` logger as tokens stream (at most once a second, plus the first and last token).
"""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

from pairbench.core import conditions
from pairbench.core.artifacts import sha256_bytes
from pairbench.core.conditions import Condition
from pairbench.core.metrics import METRICS, NAMES as N
from pairbench.engines.adapter import ArmEngine
from pairbench.engines.client import ClientError, StreamResult, http
from pairbench.engines.evidence import count_log_prefix_hits
from pairbench.engines.exchange import Exchange, Link
from pairbench.engines.profiles import EngineError
from pairbench.engines.server import ServerError
from pairbench.measure import hostload, loadvisit, node

progress_log = logging.getLogger("pairbench.progress")


class VisitError(Exception):
    """An engine fault failed the visit; the message names the visit, arm, round, condition and attempt."""


class RequestProgress:
    """``on_token`` callback that logs tokens-so-far for one request, throttled to *every_s*."""

    def __init__(self, label: str, total: int, every_s: float = 1.0):
        self.label, self.total, self.every_s = label, total, every_s
        self.last = 0.0

    def __call__(self, n: int) -> None:
        now = time.monotonic()
        if n == 1 or n >= self.total or now - self.last >= self.every_s:
            self.last = now
            progress_log.info("[measure] %s: %d/%d tokens", self.label, n, self.total)

FIRST_REQUEST = [{"role": "user", "content": "Write one short sentence about rivers."}]
FIRST_REQUEST_TOKENS = 8
FIRST_CONDITION = Condition.of(output_tokens=FIRST_REQUEST_TOKENS)  # its prompt's length is not planned


# where a record's engine block holds the engine's own rates (the registry's engine_* metrics)
ENGINE_PREFILL, ENGINE_DECODE = (METRICS[n].record[-1] for n in (N.engine_prefill_tok_s, N.engine_decode_tok_s))


def engine_timings(timings: dict | None) -> dict | None:
    if not timings or timings.get("predicted_ms") is None:
        return None
    t = timings

    def rate(n, ms):
        return n / ms * 1e3 if n and ms else None

    # llama.cpp's convention (and the embedded engine's): the first generated token comes out of the
    # prompt evaluation, and predicted_ms spans the predicted_n - 1 decode steps after it. Dividing by
    # predicted_n would overstate the rate by predicted_n / (predicted_n - 1) (1.6% at 64 tokens) and
    # disagree with the client's (completion_tokens - 1) / (last - first token) by exactly that.
    n = t.get("predicted_n")
    return {"prompt_n": t.get("prompt_n"), "prompt_ms": t.get("prompt_ms"), "predicted_n": n,
            "predicted_ms": t.get("predicted_ms"), ENGINE_PREFILL: rate(t.get("prompt_n"), t.get("prompt_ms")),
            ENGINE_DECODE: rate(n - 1 if n else n, t.get("predicted_ms"))}


def client_timings(result: StreamResult, prompt_tokens: int) -> dict:
    """Client-side timings from token arrival times (see docs/contracts.md §2)."""
    times = result.token_times
    ttft = times[0] if times else None
    decode = None
    if len(times) >= 2 and times[-1] > times[0]:
        decode = (len(times) - 1) / (times[-1] - times[0])
    return {N.ttft_ms: ttft * 1e3 if ttft is not None else None, N.e2e_ms: result.e2e_s * 1e3,
            N.prefill_tok_s: prompt_tokens / ttft if ttft else None, N.decode_tok_s: decode}


def steady_record(ex: Exchange, *, condition: Condition, visit: dict, attempt: int, repeat: int,
                  prompt_sha256: str, alive: bool = True) -> dict:
    """One steady record (docs/contracts.md §2) of a completed exchange, whole: the one place a
    steady record is assembled. (A request that failed is an engine fault: :func:`run_visit` raises
    :class:`VisitError` instead.)

    A gate the engine cannot decide is None (e.g. ``cold_cache`` where the engine gives no evidence):
    the record is flagged, and only a gate that is False makes it not ok. A server that exited
    during the request (*alive* false afterwards) makes it not ok either.
    """
    result, facts = ex.result, ex.facts
    mem = result.memory or {}
    flags = list(ex.flags) + ([] if alive else ["server: exited during the request"])
    return {
        "condition": condition.id, **dict(condition.values), "round": visit["round"], "arm": visit["arm"],
        "kind": "steady", "visit_index": visit["index"], "attempt": attempt, "repeat": repeat,
        "prompt_sha256": prompt_sha256,
        "output_sha256": sha256_bytes(result.text.encode()),
        "prompt_tokens": facts["prompt_tokens"],
        "completion_tokens": facts["completion_tokens"],
        "tokens_cached": facts["tokens_cached"],
        **client_timings(result, condition.input_tokens),
        "engine": engine_timings(result.timings),
        N.kv_bytes: mem.get(N.kv_bytes),
        N.peak_rss_bytes: mem.get(N.peak_rss_bytes),
        "gates": ex.gates,
        "flags": flags,
        "ok": ex.ok and alive,
    }


def diagnostic_request(link: Link, seed: int, engine: ArmEngine) -> dict:
    """The first request of a launch: timed, recorded apart, never a steady sample."""
    path, body = engine.request(FIRST_REQUEST, FIRST_CONDITION, seed)
    try:
        r = engine.stream(link, path, body)
    except ClientError as exc:
        return {"ok": False, "error": str(exc), N.ttft_ms: None, N.e2e_ms: None, "completion_tokens": None,
                "prompt_tokens": None, "tokens_cached": None}
    return {"ok": bool(r.token_times), "error": None, N.ttft_ms: r.ttft_s * 1e3 if r.ttft_s is not None else None,
            N.e2e_ms: r.e2e_s * 1e3, **engine.counts(r.reply(), streamed_tokens=len(r.token_times))}


def steady_exchange(engine: ArmEngine, srv, link: Link, *, messages: list[dict], cond: Condition, seed: int,
                    label: str, where: str) -> Exchange:
    """One steady exchange (:meth:`ArmEngine.exchange`). An engine fault (the request fails, the
    stream breaks, stalls or cannot be read) raises :class:`VisitError` naming *where*, with the
    server's exit status if it died."""
    try:
        return engine.exchange(messages, cond, seed, link=link, on_token=RequestProgress(label, cond.output_tokens))
    except (ClientError, EngineError) as exc:
        try:  # a crashed server may take a moment to be reaped
            code = srv.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            code = None
        state = "" if code is None else f"; the server exited with status {code}"
        raise VisitError(f"{where}: engine fault: {exc}{state}") from None


def _host(start: dict, server_cpus, client_cpus, server_cfg: dict, quiet: dict, own: float = hostload.OWN_LOAD) -> dict:
    """The visit's ``host`` block: load and CPU state at start and end, pinning, external load, and
    the quiet guard's wait (:func:`pairbench.measure.hostload.wait_for_quiet`)."""
    end = hostload.snapshot()
    threshold = server_cfg.get("external_load")
    return {"load1_start": start["load1"], "load1_end": end["load1"], "cpus": start["cpus"],
            "cpu_mhz": start["cpu_mhz"], "governor": start["governor"], "server_cpus": server_cpus,
            "client_cpus": client_cpus, "external_load_threshold": threshold,
            "external_load": hostload.external_load(start["load1"], threshold, own) if threshold is not None else None,
            "quiet": quiet}


def _server(engine: ArmEngine, srv, server_log: Path, log_start: int) -> dict:
    """The visit's ``server`` block: launch facts, and the prefix hits its part of the log shows."""
    facts = srv.facts
    with open(server_log, "rb") as fh:  # this visit's part of the server log
        fh.seek(log_start)
        hits = count_log_prefix_hits(engine.profile, fh.read().decode(errors="replace"))
    return {"ready_s": facts.get("ready_s"), "exit_code": facts.get("exit_code"), "stop": facts.get("stop"),
            "argv": facts.get("argv"), "engine": engine.name, "cold_cache_proof": engine.profile.cold_cache_proof,
            "log_prefix_hits": hits}


def run_visit(*, visit: dict, engine: ArmEngine, plan: dict, prompts: dict[str, dict], fixtures: dict[str, dict],
              server_cfg: dict, server_log: Path, inputs: dict, attempt: int = 1, pid_path: Path | None = None,
              only: list[str] | None = None, secret: bytes = b"") -> tuple[dict, dict[str, dict]]:
    """Measure one visit. Returns ``(measure_body, {condition id: {"text", "token_ids", "node"[, "repeats"]}})``.

    *prompts* maps condition id to the private prompts body; *fixtures* maps it to the fixture body.
    *attempt* is Snakemake's attempt number (1 = first); *pid_path* the server's pid file (see
    :mod:`pairbench.integrity.recovery`); *only* a subset of the plan's condition ids for a partial
    visit (a validation retry; default: every condition), measured in plan order; *secret* the run's
    secret that the node's public pseudonym is made with (:mod:`pairbench.measure.node`: the body
    records the pseudonym, each output the real host name). Raises :class:`VisitError` on an engine fault.

    The plan's ``repeats`` steady requests per condition are sent repeats-outer (every condition once,
    then again), so the machine's drift over the visit touches every condition alike; the outputs of
    repeats 2.. go under ``"repeats"``. With ``server.pin`` the server runs on one CPU set and this
    process on the other for the visit (:mod:`pairbench.measure.hostload`); the load average and
    CPU state at start and end are recorded under ``host``.

    A load run's visit (``plan["load"]``) measures its levels instead (:mod:`pairbench.measure.loadvisit`):
    one level record each, and each output carries the level's private request body under ``"level"``.
    """
    round_, arm = visit["round"], visit["arm"]

    def where(cond: Condition) -> str:
        return f"visit {visit['id']} (arm {arm}, round {round_}, condition {cond.id}, attempt {attempt})"

    started_unix = time.time()  # the visit's cost, its quiet wait included, counts in rounds.max_minutes
    own = hostload.own_load(engine.arm.get("threads"), len(hostload.usable_cpus()))  # a visit's own load
    quiet = hostload.wait_for_quiet(server_cfg.get("external_load"), server_cfg.get("quiet_wait_s"), own=own,
                                    on_wait=lambda load: progress_log.info(
                                        "[measure] %s: load %.2f, waiting up to %g s for the machine to quiet",
                                        visit["id"], load, server_cfg["quiet_wait_s"]))
    server_cpus, client_cpus = hostload.pin_sets(server_cfg.get("pin", False))
    start = hostload.snapshot()
    restore = hostload.pin_self(client_cpus)
    srv = engine.server(server_log, server_cfg, pid_path=pid_path, owner=f"measure {visit['id']}", cpus=server_cpus)
    t_visit = time.perf_counter()
    log_start = server_log.stat().st_size if server_log.exists() else 0
    conds = [c for c in conditions.from_plan(plan) if only is None or c.id in set(only)]
    try:
        with srv:
            link = Link(srv.url, http(), server_cfg["request_timeout_s"], server_log)
            version = engine.version(link.http, link.url)
            first = diagnostic_request(link, plan["seed"], engine)
            if plan.get("load"):
                try:
                    records, outputs = loadvisit.measure_levels(
                        engine, link, visit=visit, plan=plan, prompts=prompts, fixtures=fixtures,
                        only=None if only is None else set(only), attempt=attempt, alive=srv.alive, where=where)
                except RuntimeError as exc:
                    raise VisitError(str(exc)) from None
            else:
                records, outputs = _steady(engine, srv, link, visit=visit, plan=plan, prompts=prompts,
                                           fixtures=fixtures, conds=conds, attempt=attempt, where=where)
    except ServerError as exc:
        raise VisitError(f"{where(conds[0])}: the engine failed to start: {exc}") from None
    finally:
        if restore is not None:
            hostload.pin_self(restore)
    host = node.hostname()  # where it ran: the pseudonym is public, the real name only in the private outputs
    body = {
        "visit": {k: visit[k] for k in ("index", "round", "arm", "position", "id")},
        "attempt": attempt,
        "server": _server(engine, srv, server_log, log_start),
        "native_version": version,
        "first_request": first,
        "records": records,
        "host": {**_host(start, server_cpus, client_cpus, server_cfg, quiet, own), "node": node.pseudonym(host, secret)},
        "complete": all(r["prompt_tokens"] is not None for r in records),
        "duration_s": time.perf_counter() - t_visit,
        "started_unix": started_unix,
        "ended_unix": time.time(),
        "inputs": inputs,
    }
    return body, {c: {**texts, "node": host} for c, texts in outputs.items()}


def _steady(engine: ArmEngine, srv, link: Link, *, visit: dict, plan: dict, prompts: dict, fixtures: dict,
            conds: list[Condition], attempt: int, where) -> tuple[list, dict]:
    """The steady requests of a visit: ``repeats`` per condition, repeats outer."""
    round_, arm = visit["round"], visit["arm"]
    repeats = int(plan.get("repeats", 1))
    records, outputs = [], {}
    for repeat, cond in ((k, c) for k in range(1, repeats + 1) for c in conds):
        rnd = next(r for r in prompts[cond.id]["rounds"] if r["round"] == round_)
        fx = next(r for r in fixtures[cond.id]["rounds"] if r["round"] == round_)
        label = f"{visit['id']} arm={arm} round={round_} condition={cond.id}" + (
            f" repeat={repeat}/{repeats}" if repeats > 1 else "")
        progress_log.info("[measure] %s: request sent (attempt %d)", label, attempt)
        ex = steady_exchange(engine, srv, link, messages=rnd["messages"], cond=cond, seed=plan["seed"], label=label,
                             where=where(cond))
        records.append(steady_record(ex, condition=cond, visit=visit, attempt=attempt, repeat=repeat,
                                     prompt_sha256=fx["prompt_sha256"], alive=srv.alive()))
        texts = {"text": ex.result.text, "token_ids": ex.result.token_ids}
        if repeat == 1:
            outputs[cond.id] = texts
        else:
            outputs[cond.id].setdefault("repeats", []).append({"repeat": repeat, **texts})
    return records, outputs


def run_warmup(*, arm: str, engine: ArmEngine, plan: dict, server_cfg: dict, server_log: Path, inputs: dict) -> dict:
    """Launch the arm once: health, version, a first-request diagnostic and a smoke check.

    The smoke check sends the same short request twice with the prefix cache off and checks the
    engine generated exactly what was asked and reused nothing the second time.
    """
    with engine.server(server_log, server_cfg) as srv:  # healthy: its probe answered 200
        link = Link(srv.url, http(), server_cfg["request_timeout_s"], Path(server_log))
        version = engine.version(link.http, link.url)
        facts = engine.engine_facts(link.http, link.url)
        first = diagnostic_request(link, plan["seed"], engine)
        smoke = [diagnostic_request(link, plan["seed"], engine) for _ in range(2)]
    problems = []
    for i, d in enumerate(smoke, start=1):
        if not d["ok"]:
            problems.append(f"smoke request {i} failed: {d['error'] or 'no tokens'}")
        elif d["completion_tokens"] != FIRST_REQUEST_TOKENS:
            problems.append(f"smoke request {i}: completion_tokens {d['completion_tokens']}, asked {FIRST_REQUEST_TOKENS}")
        elif d["tokens_cached"] not in (0, None):
            problems.append(f"smoke request {i}: {d['tokens_cached']} cached tokens with the prefix cache off")
    return {
        "arm": arm,
        "health": "ok",
        "native_version": version,
        "server": {"ready_s": srv.facts.get("ready_s"), "exit_code": srv.facts.get("exit_code"),
                   "stop": srv.facts.get("stop")},
        "first_request": first,
        "smoke": smoke,
        "smoke_ok": not problems,
        "problems": problems,
        "engine_facts": facts,
        "fast_paths": engine.fast_paths.record() if getattr(engine, "fast_paths", None) is not None else None,
        "inputs": inputs,
    }
