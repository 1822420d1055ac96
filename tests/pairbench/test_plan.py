"""The plan: counterbalanced, seeded visit order; per-round salts; stable config hash."""

from collections import Counter
from pathlib import Path

import pytest

from pairbench.core import order as pb_order
from pairbench.core import plan as pb_plan

REPO = Path(__file__).resolve().parents[2]


def cfg(**over):
    c = {"label": "t", "model": "tiny", "arms": {"base": {}, "cand": {}}, "lengths": [400], "output_tokens": 8,
         "rounds": 4, "seed": 0}
    c.update(over)
    return c


def test_abba_alternates_who_goes_first():
    assert pb_order.round_orders(["A", "B"], 4, "abba", 0) == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]


@pytest.mark.parametrize("arms, rounds", [(["A", "B"], 10), (["A", "B", "C"], 9)])
def test_random_order_is_balanced_and_seeded(arms, rounds):
    orders = pb_order.round_orders(arms, rounds, "random", seed=7)
    assert orders == pb_order.round_orders(arms, rounds, "random", seed=7)
    assert all(sorted(o) == sorted(arms) for o in orders)
    firsts = Counter(o[0] for o in orders)
    assert set(firsts.values()) == {rounds // len(arms)}
    other = [pb_order.round_orders(arms, rounds, "random", seed=s) for s in range(20)]
    assert any(o != orders for o in other), "the seed must change the order"


def test_visits_are_numbered_in_run_order():
    visits = pb_plan.visits(cfg())
    assert [v["id"] for v in visits] == ["r01-base", "r01-cand", "r02-cand", "r02-base",
                                         "r03-base", "r03-cand", "r04-cand", "r04-base"]
    assert [v["index"] for v in visits] == list(range(1, 9))


def test_salts_differ_per_round_and_depend_on_seed():
    plan = pb_plan.make_plan(cfg(), REPO)
    assert list(plan["salts"]) == ["in400-out8"]
    assert len(set(plan["salts"]["in400-out8"].values())) == 4
    assert pb_plan.make_plan(cfg(seed=1), REPO)["salts"] != plan["salts"]
    # ... and per condition: no two rounds or conditions share a prompt prefix
    two = pb_plan.make_plan(cfg(lengths=[400, 480]), REPO)["salts"]
    assert len({s for by_round in two.values() for s in by_round.values()}) == 8


def test_same_config_same_plan_and_hash():
    """The same config gives the same plan in another process, under another hash seed (a plan
    that leaned on Python's salted ``hash`` or on set order would differ there), and a different
    measurement config a different hash."""
    import json
    import os
    import subprocess
    import sys

    here = pb_plan.make_plan(cfg(), REPO)
    script = ("import json, sys; from pathlib import Path; from pairbench.core import plan; "
              "print(json.dumps(plan.make_plan(json.loads(sys.argv[1]), Path(sys.argv[2])), sort_keys=True))")
    for hash_seed in ("1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed, PYTHONPATH=str(REPO / "workflow"))
        out = subprocess.run([sys.executable, "-c", script, json.dumps(cfg()), str(REPO)], env=env, check=True,
                             capture_output=True, text=True).stdout
        assert json.loads(out) == json.loads(json.dumps(here, sort_keys=True)), hash_seed
    assert pb_plan.config_sha256(cfg()) != pb_plan.config_sha256(cfg(rounds=6))
    assert pb_plan.make_plan(cfg(), REPO)["max_context"] == 400 + 8 + 16


def williams_block(k: int) -> list[list[str]]:
    arms = [chr(ord("A") + i) for i in range(k)]
    return pb_order.round_orders(arms, pb_order.block_length(k, "williams"), "williams", seed=0)


@pytest.mark.parametrize("k, rows", [(2, 2), (3, 6), (4, 4), (5, 10), (6, 6)])
def test_williams_block_is_balanced_for_position_and_first_order_carryover(k, rows):
    block = williams_block(k)
    assert len(block) == rows
    arms = sorted(block[0])
    assert all(sorted(row) == arms for row in block)  # each arm once per round
    per_position = {pos: Counter(row[pos] for row in block) for pos in range(k)}
    assert all(set(c.values()) == {rows // k} for c in per_position.values())  # each arm equally often per place
    adjacent = Counter((row[i], row[i + 1]) for row in block for i in range(k - 1))
    pairs = [(a, b) for a in arms for b in arms if a != b]
    assert set(adjacent) == set(pairs) and len(set(adjacent.values())) == 1  # each ordered pair equally often


def test_williams_with_two_arms_is_abba():
    assert pb_order.round_orders(["A", "B"], 6, "williams", 0) == pb_order.round_orders(["A", "B"], 6, "abba", 0)


def test_williams_repeats_its_block_and_sets_the_adaptive_step():
    assert williams_block(3) == [list("ABC"), list("BCA"), list("CAB"), list("CBA"), list("ACB"), list("BAC")]
    assert pb_order.round_orders(list("ABC"), 8, "williams", 0)[6:] == [list("ABC"), list("BCA")]
    cfg = {"label": "t", "model": "tiny", "arms": {"a": {}, "b": {}, "c": {}}, "lengths": [400], "output_tokens": 8,
           "rounds": {"min": 6, "max": 12, "target_halfwidth": 0.02}, "seed": 0, "order": "williams"}
    assert pb_plan.adaptive(cfg)["block"] == 6
    assert pb_plan.adaptive({**cfg, "order": "abba"})["block"] == 3


def test_plan_records_the_candidates_in_order():
    cfg = {"label": "t", "model": "tiny", "arms": {"a": {}, "b": {}, "c": {}}, "lengths": [400], "output_tokens": 8,
           "rounds": 6, "seed": 0, "order": "williams", "candidates": ["c", "b"]}
    plan = pb_plan.make_plan(cfg, REPO)
    assert (plan["baseline"], plan["candidates"], plan["order"]) == ("a", ["c", "b"], "williams")
    assert "candidate" not in plan
    assert [v["arm"] for v in plan["visits"][:6]] == ["a", "b", "c", "b", "c", "a"]
