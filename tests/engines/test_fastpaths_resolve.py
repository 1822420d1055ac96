"""Every arm of a comparison is launched with the native fast paths any arm's code turned off
turned off (pairbench.engines.fastpaths): the arms differ only by their patches, never by a fast path
against the Python code it stands in for. And the flags reach the server's command line."""

import pytest

from pairbench.engines import fastpaths
from pairbench.engines.adapter import for_arm
from pairbench.engines.fastpaths import FastPathConflict, Launch, resolve

OBJECTS = {"fused_decode": ["Attention", "FeedForward"], "native_kv": ["KVCache"], "weight_formats": ["Linear"]}


def check(**differs) -> dict:
    """A build's ``fast_paths``: every fast path matches but those given (name=[objects])."""
    return {name: {"matches": name not in differs, "differs": differs.get(name, []), "error": None, "objects": objs}
            for name, objs in OBJECTS.items()}


def test_what_one_arms_code_turns_off_is_off_in_every_other_arm():
    checks = {"base": check(), "cand": check(fused_decode=["FeedForward"]), "kv": check(native_kv=["KVCache"])}
    base = resolve("base", "auto", checks)
    assert base.off == ("fused_decode", "native_kv")
    assert base.why == {"fused_decode": "arm cand's code differs: FeedForward", "native_kv": "arm kv's code differs: KVCache"}
    # an arm's own differing code: its engine turns that off itself (and says why); the others' are passed
    assert resolve("cand", "auto", checks).off == ("native_kv",)
    assert resolve("kv", "off", checks) == Launch("off", ("fused_decode",), {"fused_decode": "arm cand's code differs: "
                                                                                       "FeedForward"})


def test_stock_arms_turn_nothing_off_and_an_unjudged_arm_turns_nothing_off():
    assert resolve("a", "auto", {"a": check(), "b": check()}) == Launch()
    # an engine without checked fast paths (another engine, an older tree) neither turns off nor is turned
    assert resolve("a", "auto", {"a": check(), "b": None}) == Launch()
    assert resolve("b", "on", {"a": check(fused_decode=["FeedForward"]), "b": None}) == Launch("on")


def test_a_check_that_could_not_compare_counts_as_different():
    broken = {n: {"matches": False, "differs": [], "error": "no record", "objects": []} for n in OBJECTS}
    assert resolve("a", "auto", {"a": check(), "b": broken}).off == tuple(sorted(OBJECTS))


def test_on_is_refused_where_any_arms_code_differs_naming_arm_and_class():
    checks = {"base": check(), "cand": check(fused_decode=["FeedForward"])}
    for arm in ("base", "cand"):
        with pytest.raises(FastPathConflict, match=rf"arm {arm}: engine_options.fused_decode is on.*fused_decode: "
                                                   r"arm cand's code differs: FeedForward"):
            resolve(arm, "on", checks)
    assert resolve("base", "on", {"base": check(), "cand": check()}) == Launch("on")


def test_mode_of_reads_yaml_bare_on_off_and_defaults_to_auto():
    assert [fastpaths.mode_of(a) for a in ({}, {"engine_options": {}}, {"engine_options": {"fused_decode": False}},
                                           {"engine_options": {"fused_decode": True}},
                                           {"engine_options": {"fused_decode": "off"}})] == ["auto", "auto", "off", "on", "off"]


def test_the_flags_reach_the_embedded_servers_command_line_before_the_arms_own(tmp_path):
    build = {"arm": "a", "conversion": None, "model": {"kind": "named", "arg": "tiny"}, "environment": None}
    plan = {"max_context": 64, "allow_external": False, "arms": {"a": {"engine": "embedded", "source": "engine"}}}
    arm = {"engine": "embedded", "source": "engine", "args": ["--kv", "f32"], "threads": 1,
           "engine_options": {"fused_decode": "off"}}
    engine = for_arm(arm, build=build, plan=plan, arm_dir=tmp_path, server_cfg={"threads": 1}, root=tmp_path,
                     fast_paths=Launch("off", ("fused_decode", "native_kv")))
    argv = engine.launch(port=1).argv
    assert argv[-8:] == ["--fused-decode", "off", "--fast-path-off", "fused_decode", "--fast-path-off", "native_kv",
                         "--kv", "f32"]
    assert engine.fast_paths.record() == {"mode": "off", "off": ["fused_decode", "native_kv"], "why": {}}
    stock = for_arm(arm | {"engine_options": {}}, build=build, plan=plan, arm_dir=tmp_path, server_cfg={"threads": 1},
                    root=tmp_path, fast_paths=Launch())
    assert stock.launch(port=1).argv[-2:] == ["--kv", "f32"] and "--fused-decode" not in stock.launch(port=1).argv


def test_notes_say_which_fast_path_is_off_and_why():
    facts = {"fast_paths": {"fused_decode": {"on": False, "differs": ["FeedForward"]}, "native_kv": {"on": False,
             "differs": []}, "weight_formats": {"on": True, "differs": []}}}
    assert fastpaths.notes("cand", facts, None) == [
        "arm cand: fast path fused_decode off: its code differs (FeedForward); the arm's own Python code runs"]
    launch = {"mode": "auto", "off": ["fused_decode"], "why": {"fused_decode": "arm cand's code differs: FeedForward"}}
    assert fastpaths.notes("base", facts | {"fast_paths": {"fused_decode": {"on": False, "differs": []}}}, launch) == [
        "arm base: fast path fused_decode off for the comparison (arm cand's code differs: FeedForward)"]
    assert fastpaths.notes("x", None, None) == []
