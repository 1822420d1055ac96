"""The plan: counterbalanced, seeded visit order; per-round salts; stable config hash."""

from collections import Counter
from pathlib import Path

import pytest

from pairbench.core import plan as pb_plan

REPO = Path(__file__).resolve().parents[2]


def cfg(**over):
    c = {"label": "t", "model": "tiny", "arms": {"base": {}, "cand": {}}, "lengths": [400], "output_tokens": 8,
         "rounds": 4, "seed": 0}
    c.update(over)
    return c


def test_abba_alternates_who_goes_first():
    assert pb_plan.round_orders(["A", "B"], 4, "abba", 0) == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]


@pytest.mark.parametrize("arms, rounds", [(["A", "B"], 10), (["A", "B", "C"], 9)])
def test_random_order_is_balanced_and_seeded(arms, rounds):
    orders = pb_plan.round_orders(arms, rounds, "random", seed=7)
    assert orders == pb_plan.round_orders(arms, rounds, "random", seed=7)
    assert all(sorted(o) == sorted(arms) for o in orders)
    firsts = Counter(o[0] for o in orders)
    assert set(firsts.values()) == {rounds // len(arms)}
    other = [pb_plan.round_orders(arms, rounds, "random", seed=s) for s in range(20)]
    assert any(o != orders for o in other), "the seed must change the order"


def test_visits_are_numbered_in_run_order():
    visits = pb_plan.visits(cfg())
    assert [v["id"] for v in visits] == ["r01-base", "r01-cand", "r02-cand", "r02-base",
                                         "r03-base", "r03-cand", "r04-cand", "r04-base"]
    assert [v["index"] for v in visits] == list(range(1, 9))


def test_salts_differ_per_round_and_depend_on_seed():
    plan = pb_plan.make_plan(cfg(), REPO)
    assert len(set(plan["salts"].values())) == 4
    assert pb_plan.make_plan(cfg(seed=1), REPO)["salts"] != plan["salts"]


def test_same_config_same_plan_and_hash():
    assert pb_plan.make_plan(cfg(), REPO) == pb_plan.make_plan(cfg(), REPO)
    assert pb_plan.config_sha256(cfg()) != pb_plan.config_sha256(cfg(rounds=6))
    assert pb_plan.make_plan(cfg(), REPO)["max_context"] == 400 + 8 + 16
