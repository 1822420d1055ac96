"""measurements.csv: one row per record, selection = gates and verdicts, short publishable reasons."""

import pandas as pd
import pytest

from pairbench.analysis import tables


def cid(length):
    """The condition id of *length* input tokens (8 output tokens)."""
    return f"in{length}-out8"


def record(arm, rnd, length, ok=True, flags=(), gates=None, decode=100.0):
    return {"round": rnd, "arm": arm, "condition": cid(length), "input_tokens": length, "output_tokens": 8,
            "visit_index": 2 * rnd - (arm == "a"), "attempt": 0, "ok": ok,
            "gates": gates or {"prompt_tokens": True, "completion_tokens": True, "cold_cache": True},
            "flags": list(flags), "ttft_ms": 10.0, "e2e_ms": 100.0, "prefill_tok_s": 1000.0, "decode_tok_s": decode,
            "engine": {"prefill_tok_s": 1200.0, "decode_tok_s": decode * 1.01}, "prompt_tokens": length,
            "completion_tokens": 8, "tokens_cached": 0, "kv_bytes": 1, "peak_rss_bytes": 2}


def visit(arm, rnd, *records):
    return {"visit": {"id": f"r{rnd:02d}-{arm}"}, "records": list(records)}


def verdicts(length, **cases):
    v = {c: {"verdict": verdict, "reason": "x"} for c, verdict in cases.items()}
    return {"condition": cid(length), "selected": all(x["verdict"] in ("pass", "skipped") for x in v.values()), "verdicts": v}


def test_selection_joins_gates_and_validation():
    bad_gate = record("b", 1, 400, ok=False, flags=["prompt_tokens: got 401, planned 400"],
                      gates={"prompt_tokens": False, "completion_tokens": True, "cold_cache": True})
    measures = [visit("a", 1, record("a", 1, 400), record("a", 1, 480)), visit("b", 1, bad_gate, record("b", 1, 480))]
    validations = {
        ("r01-a", 0): {"records": [verdicts(400, token_counts="pass"), verdicts(480, token_counts="pass", done_marker="fail")]},
        ("r01-b", 0): {"records": [verdicts(400, token_counts="fail"), verdicts(480, token_counts="pass")]},
    }
    df = tables.measurements_frame(measures, validations)
    assert list(df.columns) == tables.columns(["input_tokens", "output_tokens"])
    assert list(df.columns[:5]) == ["round", "arm", "condition", "input_tokens", "output_tokens"]
    assert df[["condition", "input_tokens", "output_tokens"]].values.tolist() == [
        ["in400-out8", 400, 8], ["in480-out8", 480, 8]] * 2
    assert df["selected"].tolist() == [True, False, False, True]
    assert df["reason"].tolist() == ["", "case done_marker fail", "gate prompt_tokens + case token_counts fail", ""]
    assert df.loc[0, "engine_decode_tok_s"] == 101.0


def test_a_validation_retry_supersedes_the_record_it_re_measured():
    measures = [visit("a", 1, record("a", 1, 400), record("a", 1, 480, decode=50.0)),
                {**visit("a", 1, record("a", 1, 480, decode=90.0)), "retry": 1}]
    validations = {
        ("r01-a", 0): {"records": [verdicts(400, python_function="pass"), verdicts(480, python_function="timeout")]},
        ("r01-a", 1): {"records": [verdicts(480, python_function="pass")]},
    }
    df = tables.measurements_frame(measures, validations)
    assert df[["condition", "retry", "selected", "reason"]].values.tolist() == [
        ["in400-out8", 0, True, ""], ["in480-out8", 0, False, "superseded by retry 1"], ["in480-out8", 1, True, ""]]
    assert df[df["selected"]]["decode_tok_s"].tolist() == [100.0, 90.0], "the retry's record counts, once"
    # a retry that fails again is the latest record: excluded for its own reason, not superseded
    validations[("r01-a", 1)] = {"records": [verdicts(480, python_function="timeout")]}
    df = tables.measurements_frame(measures, validations)
    assert df["reason"].tolist() == ["", "superseded by retry 1", "case python_function timeout"]


def test_unvalidated_records_are_not_selected_and_reasons_stay_short():
    df = tables.measurements_frame([visit("a", 1, record("a", 1, 400))], {})
    assert not df.loc[0, "selected"] and df.loc[0, "reason"] == "not validated"
    failed = record("a", 1, 400, ok=False, flags=["prompt_tokens: got 401, planned 400"],
                    gates={"prompt_tokens": False, "completion_tokens": False, "cold_cache": False})
    many = {"condition": cid(400), "selected": False,
            "verdicts": {c: {"verdict": "timeout", "reason": ""} for c in ("token_counts", "done_marker",
                                                                            "python_function", "matches_baseline")}}
    reason = tables.short_reason(failed, many)
    # a failed request is an engine fault that fails the visit, never a record: only gates and cases
    assert reason == "gate prompt_tokens completion_tokens cold_cache + case token_..."
    assert len(reason) == tables.REASON_MAX


def test_timing_agreement_is_client_over_engine():
    df = pd.DataFrame([{"arm": "a", "condition": cid(400), "ok": True, "decode_tok_s": 99.0, "engine_decode_tok_s": 100.0,
                        "prefill_tok_s": 50.0, "engine_prefill_tok_s": 100.0}] * 3)
    row = tables.timing_agreement(df).iloc[0]
    assert (row["arm"], row["condition"]) == ("a", "in400-out8")
    assert round(row["decode_disagreement"], 6) == -0.01 and round(row["prefill_disagreement"], 6) == -0.5


def test_an_unproven_cold_cache_is_excluded_unless_the_config_opts_in():
    unproven = record("a", 1, 400, gates={"prompt_tokens": True, "completion_tokens": True, "cold_cache": None})
    measures = [visit("a", 1, unproven, record("a", 1, 480))]
    validations = {("r01-a", 0): {"records": [verdicts(400, token_counts="pass"), verdicts(480, token_counts="pass")]}}
    df = tables.measurements_frame(measures, validations)
    assert df[["condition", "cold_cache", "selected", "reason"]].values.tolist() == [
        ["in400-out8", None, False, "gate cold_cache unproven"], ["in480-out8", True, True, ""]]
    opted = tables.measurements_frame(measures, validations, allow_unproven_cold_cache=True)
    assert opted["selected"].tolist() == [True, True]
    # a proven failure is never rescued by the opt-in
    failed = record("a", 1, 400, ok=False, flags=["cold_cache: evaluated 10 of 400"],
                    gates={"prompt_tokens": True, "completion_tokens": True, "cold_cache": False})
    df = tables.measurements_frame([visit("a", 1, failed)], {("r01-a", 0): {"records": [verdicts(400, token_counts="pass")]}},
                                   allow_unproven_cold_cache=True)
    assert not df.loc[0, "selected"] and df.loc[0, "reason"] == "gate cold_cache"


def test_repeats_are_rows_of_their_own_matched_to_their_validation():
    recs = [{**record("a", 1, n, decode=d), "repeat": k} for k, d in ((1, 10.0), (2, 20.0)) for n in (400, 480)]
    vals = [{**verdicts(n, token_counts="pass" if (k, n) != (2, 480) else "fail"), "repeat": k}
            for k in (1, 2) for n in (400, 480)]
    df = tables.measurements_frame([visit("a", 1, *recs)], {("r01-a", 0): {"records": vals}})
    assert df[["repeat", "condition", "selected", "decode_tok_s"]].values.tolist() == [
        [1, "in400-out8", True, 10.0], [1, "in480-out8", True, 10.0], [2, "in400-out8", True, 20.0],
        [2, "in480-out8", False, 20.0]]


def test_cold_cache_cross_check_catches_a_reused_prefix_the_counters_hide():
    from pairbench.analysis import coldcheck

    rows = [{"arm": "a", "condition": f"in{n}-out64", "input_tokens": n, "prompt_tokens": n, "selected": True,
             "ttft_ms": ms}
            for n, ms in ((256, 600.0), (256, 610.0), (256, 590.0), (1024, 2500.0), (1024, 2450.0), (1024, 2550.0))]
    [honest] = coldcheck.cross_check(pd.DataFrame(rows))
    assert honest["ok"] and honest["scaling_ok"] and honest["shortcuts"] == 0
    assert honest["ms_per_1k_tokens"] == pytest.approx(1000 * (2500 - 600) / (1024 - 256))
    assert honest["detail"].startswith("consistent with a cold cache: median time to first token 600 ms at 256, "
                                       "2500 ms at 1024 tokens")
    # one repeat answered from a cached prefix: the engine still claimed 1024 evaluated tokens
    cheat = rows[:-1] + [{**rows[-1], "ttft_ms": 90.0}]  # under a quarter of the 2500 ms median
    [c] = coldcheck.cross_check(pd.DataFrame(cheat))
    assert not c["ok"] and c["shortcuts"] == 1 and "INCONSISTENT" in c["detail"]
    # an engine whose TTFT does not grow with the tokens it claims to evaluate
    flat = [{**r, "ttft_ms": 100.0} for r in rows]
    [f] = coldcheck.cross_check(pd.DataFrame(flat))
    assert f["scaling_ok"] is False and not f["ok"]


def test_host_load_helpers():
    from pairbench.measure import hostload

    assert hostload.pin_sets(False, [0, 1]) == (None, None)
    assert hostload.pin_sets("auto", [0, 1, 2]) == ([1, 2], [0])
    assert hostload.pin_sets(True, [3]) == (None, None)  # one CPU: nothing to separate
    with pytest.raises(ValueError, match="server.pin: unknown mode 'maybe'"):
        hostload.pin_sets("maybe", [0, 1])
    assert hostload.external_load(1.4, 0.5) is False and hostload.external_load(1.6, 0.5) is True
    assert hostload.external_load(None, 0.5) is None
    snap = hostload.snapshot()
    assert snap["cpus"] >= 1 and set(snap) == {"load1", "load5", "load15", "cpus", "cpu_mhz", "governor"}
