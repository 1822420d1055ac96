"""The run plan: arms, conditions, the counterbalanced visit order, per-round salts, and a config hash.

Everything here is a pure function of the config, so the same config always gives the same plan
(and Snakemake can build the same DAG from it before plan.json exists).

Visit order: :mod:`pairbench.core.order`.

Adaptive rounds (``rounds: {min, max, target_halfwidth}``): the plan holds every visit up to
``max``; the pipeline measures ``min`` rounds, then one block (:func:`block_length` rounds) at a
time — always a whole counterbalanced block, since ``min`` and ``max`` are multiples of it — until
the statistics' stopping rule says stop (:mod:`pairbench.analysis.adaptive`) or ``max`` is reached.
"""

from __future__ import annotations

import hashlib
import json
from pairbench.core.config import arm_names, baseline_arm, candidate_arms, normalized, serve_context
from pairbench.core.models import resolve_model
from pairbench.core import conditions, loadconfig, naming
from pairbench.core.order import block_length, round_orders


def rounds_bounds(config: dict) -> tuple[int, int, float | None]:
    """``(min, max, target_halfwidth)`` of the ``rounds`` key; a plain integer n is ``(n, n, None)``."""
    r = config["rounds"]
    if isinstance(r, dict):
        return int(r["min"]), int(r["max"]), float(r["target_halfwidth"])
    return int(r), int(r), None


def adaptive(config: dict) -> dict | None:
    """The plan's ``adaptive`` block (None for fixed rounds): min, max, block, target_halfwidth and
    max_minutes (the rounds' time budget; None: no budget)."""
    lo, hi, target = rounds_bounds(config)
    if target is None:
        return None
    cfg = normalized(config)
    return {"min": lo, "max": hi, "block": block_length(len(arm_names(cfg)), cfg["order"]), "target_halfwidth": target,
            "max_minutes": cfg["rounds"].get("max_minutes")}


def planned_adaptive(config: dict) -> dict | None:
    """The plan's ``adaptive`` block: :func:`adaptive` without the time budget."""
    a = adaptive(config)
    return None if a is None else {k: v for k, v in a.items() if k != "max_minutes"}


def visits(config: dict) -> list[dict]:
    """Every visit in run order: ``{"index", "round", "arm", "position", "id"}`` (1-based)."""
    cfg = normalized(config)
    out = []
    for r, arms in enumerate(round_orders(arm_names(cfg), rounds_bounds(cfg)[1], cfg["order"], cfg["seed"]), start=1):
        for pos, arm in enumerate(arms):
            out.append({"index": len(out) + 1, "round": r, "arm": arm, "position": pos, "id": naming.visit_id(r, arm)})
    return out


def salt(seed: int, round_: int, condition: str, request: int | None = None) -> str:
    """A short token put at the very start of every prompt of one round and condition (and, in a load
    level, of one *request*: its index among the level's requests).

    No two rounds, conditions or requests of a level share a prompt prefix (no engine can reuse
    another request's KV), while both arms of a round see identical tokens.
    """
    tail = "" if request is None else f":{request}"
    return hashlib.sha256(f"pairbench-salt:{seed}:{round_}:{condition}{tail}".encode()).hexdigest()[:8]


def load_block(cfg: dict, conds: list, rounds: int, block: int = 1) -> dict:
    """The plan's ``load`` block: what every level of every visit sends, and in which order. Each
    round's level order is counterbalanced (:func:`pairbench.core.loadconfig.level_order`); open-loop
    schedules are a pure function of (seed, round, level) (:mod:`pairbench.core.schedule`), drawn by
    the visit and recorded there with their digest."""
    load = cfg["load"]
    keys = ("requests", "warmup", "burstiness", "slo", "percentiles", "prefix", "timeout_s", "validity",
            "allow_queueing")
    return {"factor": loadconfig.factor(load), **{k: load[k] for k in keys},
            "level_orders": {str(r): [c.id for c in loadconfig.level_order(conds, r, block)]
                            for r in range(1, rounds + 1)}}


# Config sections that do not shape the measurement. They reach their own stages as params, so
# changing one reruns that stage and what follows (Snakemake's params trigger), never the plan and
# so never a visit. `resources` is where a job runs, not what it measures (docs/cluster.md).
NOT_PLANNED = ("stats", "validate", "retries", "crosscheck", "cost", "gates", "resources", "gate")


def measurement_config(config: dict) -> dict:
    """The part of the config the plan (and so every visit) depends on. The rounds' time budget
    (``rounds.max_minutes``) is not part of it: it decides how many of the planned rounds are
    measured, as the adaptive decisions' parameter, so raising it keeps every finished round and
    measures only the rounds it now allows (docs/ci.md, "An inconclusive result")."""
    out = {k: v for k, v in normalized(config).items() if k not in NOT_PLANNED}
    if isinstance(out.get("rounds"), dict):
        out["rounds"] = {k: v for k, v in out["rounds"].items() if k != "max_minutes"}
    return out


def config_sha256(config: dict) -> str:
    """sha256 of the measurement config (see :data:`NOT_PLANNED`); provenance.json records the
    hash of the whole config."""
    text = json.dumps(measurement_config(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def full_config_sha256(config: dict) -> str:
    text = json.dumps(normalized(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def make_plan(config: dict, root) -> dict:
    """The body of ``plan.json``."""
    cfg = normalized(config)
    model = resolve_model(cfg["model"], root)
    conds = conditions.conditions(cfg)
    body = {
        "label": cfg["label"],
        "model": {"name": model["name"], "kind": model["kind"]},
        "arms": {name: {"source": a["source"], "patches": list(a["patches"]), "args": list(a["args"]),
                        "env": dict(a["env"]), "engine": a["engine"], "threads": a["threads"],
                        "build": a["build"], "launch": a["launch"]} for name, a in cfg["arms"].items()},
        "allow_external": bool(cfg["allow_external"]),
        "baseline": baseline_arm(cfg),
        "candidates": candidate_arms(cfg),
        "factors": conditions.factor_columns(conds),
        "conditions": [c.to_dict() for c in conds],
        "rounds": rounds_bounds(cfg)[1],
        # without max_minutes: the adapt jobs take the budget as their parameter (measurement_config)
        "adaptive": planned_adaptive(cfg),
        "repeats": int(cfg.get("repeats", 1)),
        "order": cfg["order"],
        "seed": cfg["seed"],
        "max_context": serve_context(cfg),
        "visits": visits(cfg),
        "salts": {c.id: {str(r): salt(cfg["seed"], r, c.id) for r in range(1, rounds_bounds(cfg)[1] + 1)}
                  for c in conds},
        "config_sha256": config_sha256(cfg),
        "inputs": {},
    }
    if cfg.get("load") is not None:
        body["load"] = load_block(cfg, conds, rounds_bounds(cfg)[1], block_length(len(arm_names(cfg)), cfg["order"]))
    return body
