"""The condition key: ids, the cross product of factors, parsing back, and the report's words."""

import pytest

from pairbench.core import conditions as pc
from pairbench.core.conditions import Condition


def test_ids_name_every_factor_in_registry_order():
    c = Condition.of(output_tokens=64, input_tokens=256)
    assert c.id == "in256-out64"
    assert c.to_dict() == {"id": "in256-out64", "input_tokens": 256, "output_tokens": 64}
    assert (c.input_tokens, c.output_tokens, c["input_tokens"]) == (256, 64, 256)
    assert pc.label(c) == "256 input tokens, 64 output tokens"


def test_the_conditions_are_the_cross_product_input_outermost():
    cfg = {"lengths": [1024, 256], "output_tokens": [64, 512]}
    assert [c.id for c in pc.conditions(cfg)] == ["in1024-out64", "in1024-out512", "in256-out64", "in256-out512"]
    assert [c.id for c in pc.conditions({"lengths": [256], "output_tokens": 64})] == ["in256-out64"]


def test_parse_id_round_trips_and_names_what_it_cannot_read():
    for text in ("in256-out64", "in131072-out1024"):
        assert pc.parse_id(text).id == text
    with pytest.raises(ValueError, match=r"cannot read 'x9'"):
        pc.parse_id("in256-x9")
    with pytest.raises(ValueError, match="not in canonical form"):
        pc.parse_id("out64-in256")
    with pytest.raises(ValueError, match="unknown condition factor"):
        Condition((("colour", 3),))


def test_from_dict_checks_its_id():
    assert Condition.from_dict({"id": "in8-out4", "input_tokens": 8, "output_tokens": 4}).id == "in8-out4"
    with pytest.raises(ValueError, match="does not match its factors"):
        Condition.from_dict({"id": "in9-out4", "input_tokens": 8, "output_tokens": 4})


def test_plan_order_sorts_numerically_not_as_text():
    ids = ["in1024-out64", "in256-out64", "in256-out8"]
    assert [c.id for c in sorted(pc.parse_id(i) for i in ids)] == ["in256-out8", "in256-out64", "in1024-out64"]


def test_lookup_by_id_lists_the_run_s_conditions():
    conds = pc.conditions({"lengths": [8], "output_tokens": [4]})
    assert pc.by_id(conds, "in8-out4") == conds[0]
    with pytest.raises(KeyError, match="the run has in8-out4"):
        pc.by_id(conds, "in9-out4")
    assert pc.factor_columns(conds) == ["input_tokens", "output_tokens"]
