"""The run plan: arms, lengths, the counterbalanced visit order, per-round salts, and a config hash.

Everything here is a pure function of the config, so the same config always gives the same plan
(and Snakemake can build the same DAG from it before plan.json exists).

Visit order. A *visit* is one arm in one round. Within a round every arm is visited once; across
rounds the order is counterbalanced so drift (thermal, background load) cannot favour one arm:

- ``abba``: round r runs the arms rotated by r-1 — with two arms AB, BA, AB, BA … (ABBA);
- ``random``: seeded and balanced — within each block of k rounds (k arms) every arm goes first
  exactly once, the block's order drawn from ``random.Random(seed)``;
- ``williams``: a Williams design (Williams 1949), balanced for first-order carryover: over one
  block every arm takes every position once, and every ordered pair of arms is adjacent (one
  directly after the other) equally often. For even k a block is k rounds; for odd k no k-round
  square does it, so the block is the k rounds and their mirror images, 2k rounds. With two arms
  it is AB, BA: abba.

Adaptive rounds (``rounds: {min, max, target_halfwidth}``): the plan holds every visit up to
``max``; the pipeline measures ``min`` rounds, then one block (:func:`block_length` rounds) at a
time — always a whole counterbalanced block, since ``min`` and ``max`` are multiples of it — until
the statistics' stopping rule says stop (:mod:`pairbench.analysis.adaptive`) or ``max`` is reached.
"""

from __future__ import annotations

import hashlib
import json
import random

from pairbench.core.config import arm_names, baseline_arm, candidate_arms, normalized, resolve_model, serve_context

ORDERS = ("abba", "random", "williams")


def williams_rows(k: int) -> list[list[int]]:
    """The rows (arm indices) of one Williams block for k arms: k rows for even k, 2k for odd k.

    The first row interleaves from both ends, 0, 1, k-1, 2, k-2, …, so its successive differences
    mod k are all distinct; every other row adds r mod k, which keeps each arm once per position and
    each ordered pair adjacent once. For odd k the mirrored rows make up the pairs the square misses.
    """
    first, lo, hi = [0], 1, k - 1
    while len(first) < k:
        first.append(lo)
        lo += 1
        if len(first) < k:
            first.append(hi)
            hi -= 1
    rows = [[(a + r) % k for a in first] for r in range(k)]
    return rows if k % 2 == 0 else rows + [row[::-1] for row in rows]


def block_length(k: int, order: str) -> int:
    """Rounds in one counterbalanced block of *order* with k arms."""
    if order not in ORDERS:
        raise ValueError(f"order: unknown visit order {order!r} ({', '.join(ORDERS)})")
    return 2 * k if order == "williams" and k % 2 else k


def round_orders(arms: list[str], rounds: int, order: str, seed: int) -> list[list[str]]:
    """The arm order within each round (index 0 = round 1)."""
    k = len(arms)
    if order == "williams":
        rows = williams_rows(k)
        return [[arms[i] for i in rows[r % len(rows)]] for r in range(rounds)]
    if order == "abba":
        return [arms[(r % k):] + arms[:(r % k)] for r in range(rounds)]
    if order == "random":
        rng = random.Random(f"pairbench-order:{seed}")
        out: list[list[str]] = []
        while len(out) < rounds:
            base = list(arms)
            rng.shuffle(base)
            shifts = list(range(k))
            rng.shuffle(shifts)
            out += [base[s:] + base[:s] for s in shifts]
        return out[:rounds]
    raise ValueError(f"order: unknown visit order {order!r} ({', '.join(ORDERS)})")


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


def visit_id(round_: int, arm: str) -> str:
    return f"r{round_:02d}-{arm}"


def visits(config: dict) -> list[dict]:
    """Every visit in run order: ``{"index", "round", "arm", "position", "id"}`` (1-based)."""
    cfg = normalized(config)
    out = []
    for r, arms in enumerate(round_orders(arm_names(cfg), rounds_bounds(cfg)[1], cfg["order"], cfg["seed"]), start=1):
        for pos, arm in enumerate(arms):
            out.append({"index": len(out) + 1, "round": r, "arm": arm, "position": pos, "id": visit_id(r, arm)})
    return out


def round_salt(seed: int, round_: int) -> str:
    """A short per-round token put at the very start of every prompt of that round.

    Different rounds therefore share no prompt prefix (no engine can reuse an earlier round's KV),
    while both arms of a round see identical tokens.
    """
    return hashlib.sha256(f"pairbench-salt:{seed}:{round_}".encode()).hexdigest()[:8]


# Config sections that do not shape the measurement. They reach their own stages as params, so
# changing one reruns that stage and what follows (Snakemake's params trigger), never the plan and
# so never a visit. `resources` is where a job runs, not what it measures (docs/cluster.md).
NOT_PLANNED = ("stats", "validate", "retries", "crosscheck", "gates", "resources")


def measurement_config(config: dict) -> dict:
    """The part of the config the plan (and so every visit) depends on."""
    return {k: v for k, v in normalized(config).items() if k not in NOT_PLANNED}


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
    return {
        "label": cfg["label"],
        "model": {"name": model["name"], "kind": model["kind"]},
        "arms": {name: {"source": a["source"], "patches": list(a["patches"]), "args": list(a["args"]),
                        "env": dict(a["env"]), "engine": a["engine"], "threads": a["threads"],
                        "build": a["build"], "launch": a["launch"]} for name, a in cfg["arms"].items()},
        "allow_external": bool(cfg["allow_external"]),
        "baseline": baseline_arm(cfg),
        "candidates": candidate_arms(cfg),
        "lengths": list(cfg["lengths"]),
        "output_tokens": cfg["output_tokens"],
        "rounds": rounds_bounds(cfg)[1],
        "adaptive": adaptive(cfg),
        "repeats": int(cfg.get("repeats", 1)),
        "order": cfg["order"],
        "seed": cfg["seed"],
        "max_context": serve_context(cfg),
        "visits": visits(cfg),
        "salts": {str(r): round_salt(cfg["seed"], r) for r in range(1, rounds_bounds(cfg)[1] + 1)},
        "config_sha256": config_sha256(cfg),
        "inputs": {},
    }
