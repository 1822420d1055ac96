"""A load run's statistics from a measurements table: per-level verdicts, the SLO capacity per arm and
round and its paired comparison, the excluded (client-bound) levels, and the report's Load section."""

import math

import pandas as pd
import pytest

from pairbench.analysis import loadstats, stats as pb_stats
from pairbench.analysis.measurements import StatsInputError
from pairbench.analysis.tables import columns
from pairbench.publish.load_section import load_section

LEVELS = (1, 2, 4, 8)
LOAD = {"factor": "concurrency", "slo": {"ttft_ms": 500.0, "itl_ms": None, "e2e_ms": None, "attainment": 0.9},
        "prefix": "distinct"}


def table(base_att, cand_att, rounds=10, bound=None, reason="validity client_cpu",
          engine_failed=False) -> pd.DataFrame:
    """A table as a load run writes it: one row per arm × level × round; the candidate's output
    throughput is 1.00-1.008× the baseline's at one stream and 1.25-1.26× above; attainments as given per level,
    the baseline's last level shifted a little per round. *bound*: (arm, level, round) of a level that
    failed validity (by default client CPU; *reason* as the measurements table labels it, and
    *engine_failed* its structured fact)."""
    rows = []
    for r in range(1, rounds + 1):
        wobble = 0.01 * ((r * 7) % 5 - 2)  # -0.02 .. +0.02, the same for both arms' throughput
        for arm, att in (("baseline", base_att), ("candidate", cand_att)):
            for i, c in enumerate(LEVELS):
                own = 1 + 0.004 * (r % 3) if arm == "candidate" else 1.0  # the pairs differ a little
                tput = 100.0 * c ** 0.8 * (1 + wobble) * own * (1.25 if arm == "candidate" and c > 1 else 1.0)
                a = att[i] + (0.02 * (r % 3) if arm == "baseline" and i == len(LEVELS) - 1 else 0.0)
                bad = bound == (arm, c, r)
                rows.append({"round": r, "arm": arm, "condition": f"in128-out32-c{c}", "input_tokens": 128,
                             "output_tokens": 32, "concurrency": c, "repeat": 1, "visit_index": 1, "attempt": 1,
                             "retry": 0, "ok": not bad, "cold_cache": True, "selected": not bad,
                             "reason": reason if bad else "", "engine_failed": bad and engine_failed, "output_tok_s": tput,
                             "ttft_p90_ms": 50.0 * c * (0.8 if arm == "candidate" and c > 1 else 1.0) * (1 + wobble),
                             "slo_attainment": a, "achieved_concurrency": c * 0.99, "lag_p99_ms": 1.5,
                             "client_cpu_share": 0.9 if bad else 0.02})
    df = pd.DataFrame(rows)
    return df.reindex(columns=[c for c in columns(["input_tokens", "output_tokens", "concurrency"], ("level",))
                               if c in df.columns or c in ("requests_s",)])


def summarize(df):
    return pb_stats.summarize_all(df, baseline="baseline", candidates=["candidate"],
                                  metrics=["output_tok_s", "ttft_p90_ms"], secondary=[], memory=[], load=LOAD)


def test_capacity_by_hand_interpolation_and_the_paired_verdict():
    s = summarize(table([1.0, 1.0, 0.95, 0.5], [1.0, 1.0, 1.0, 0.7]))
    cap = s["load"]["capacity"]["comparisons"]["candidate"]["in128-out32"]
    r1 = cap["rounds"][0]
    # baseline round 1: attainment 0.52 at 8 streams (0.5 + 0.02): 4 + (0.95 - 0.9) / (0.95 - 0.52) * 4
    assert r1["baseline"]["capacity"] == pytest.approx(4 + 0.05 / 0.43 * 4)
    assert r1["baseline"]["bracket"] == [4.0, 8.0] and r1["baseline"]["censored"] is None
    assert r1["candidate"]["capacity"] == pytest.approx(4 + 0.1 / 0.3 * 4)
    assert cap["verdict"] == "more" and cap["n_pairs"] == 10 and cap["n_censored"] == 0
    assert cap["hl_ratio"] > 1.15 and cap["ci_low"] > 1.01
    assert s["load"]["capacity"]["family_size"] == 1
    # the per-level verdicts are ordinary conditions: equivalent at one stream, faster above
    verdicts = {c: s["comparisons"]["candidate"]["paired"][f"in128-out32-c{c}"]["output_tok_s"]["verdict"]
                for c in LEVELS}
    assert verdicts == {1: "equivalent", 2: "faster", 4: "faster", 8: "faster"}


def test_a_curve_that_never_crosses_is_censored_and_the_report_suggests_levels():
    s = summarize(table([1.0, 1.0, 0.95, 0.5], [1.0, 1.0, 1.0, 0.95]))
    cap = s["load"]["capacity"]["comparisons"]["candidate"]["in128-out32"]
    assert all(r["candidate"]["censored"] == "above" and r["candidate"]["capacity"] == 8 for r in cap["rounds"])
    assert cap["n_censored"] == 10 and cap["ci_high"] is None and cap["hl_ratio"] is None
    assert cap["verdict"] == "more"  # at least: the candidate passes the top level, the baseline crosses inside
    assert cap["bracketing"]["above"] == [16, 32]
    text = load_section(s)
    assert "serves at least" in text and "more load under the SLO" in text
    assert "Add 16 streams and 32 streams to bracket the capacity the levels did not." in text
    assert "at least 8 streams in 10 round(s) (the SLO held at every level)" in text


def test_both_arms_censored_is_inconclusive():
    s = summarize(table([1.0, 1.0, 1.0, 0.95], [1.0, 1.0, 1.0, 0.95]))
    cap = s["load"]["capacity"]["comparisons"]["candidate"]["in128-out32"]
    assert cap["verdict"] == "inconclusive" and "bracket" in cap["reason"]


def test_a_client_bound_level_is_excluded_from_every_statistic_and_disclosed():
    df = table([1.0, 1.0, 0.95, 0.5], [1.0, 1.0, 1.0, 0.7], bound=("candidate", 8, 3))
    s = summarize(df)
    pair = s["comparisons"]["candidate"]["paired"]["in128-out32-c8"]["output_tok_s"]
    assert pair["n_pairs"] == 9  # round 3's candidate level is gone
    facts = s["load"]["facts"]["in128-out32-c8"]["candidate"]
    assert facts["selected"] == 9 and facts["levels"] == 10 and facts["excluded"] == {"validity client_cpu": 1}
    # capacity in round 3 reads only the candidate's valid levels (1, 2, 4 streams: censored above at 4)
    r3 = next(r for r in s["load"]["capacity"]["comparisons"]["candidate"]["in128-out32"]["rounds"] if r["round"] == 3)
    assert r3["candidate"] == {"capacity": 4.0, "censored": "above", "bracket": None, "non_monotone": False}
    text = load_section(s)
    assert "| `in128-out32-c8` | `candidate` | 9/10 | 7.92 | 1.5 | 0.020, 0.900 | 1× validity client_cpu |" in text


def test_a_level_where_the_engine_failed_requests_is_the_slo_failing_not_a_level_left_out():
    # the candidate holds the SLO at every level, except in round 3, where 8 streams made the engine
    # time out (attainment counts a failed request as not good): that round's capacity crosses
    # between 4 and 8 streams; leaving the level out would have read "at least 4" (censored above)
    df = table([1.0, 1.0, 0.95, 0.5], [1.0, 1.0, 1.0, 0.95], bound=("candidate", 8, 3),
               reason="validity errors too_few_requests + case done_marker fail", engine_failed=True)
    df.loc[(df["arm"] == "candidate") & (df["round"] == 3) & (df["concurrency"] == 8), "slo_attainment"] = 0.4
    s = summarize(df)
    assert s["comparisons"]["candidate"]["paired"]["in128-out32-c8"]["output_tok_s"]["n_pairs"] == 9
    cap = s["load"]["capacity"]["comparisons"]["candidate"]["in128-out32"]
    r3 = next(r for r in cap["rounds"] if r["round"] == 3)
    assert r3["candidate"]["censored"] is None and r3["candidate"]["bracket"] == [4.0, 8.0]
    assert r3["candidate"]["capacity"] == pytest.approx(4 + 0.1 / 0.6 * 4)
    others = [r for r in cap["rounds"] if r["round"] != 3]
    assert all(r["candidate"]["censored"] == "above" for r in others) and cap["n_pairs"] == 10


def test_the_capacity_reads_a_rounds_own_visit_never_a_validation_retry():
    # round 3's candidate level at 8 streams timed out in its visit and a validation retry measured it
    # again later, on another launch, where it held: the capacity reads the visit's own (failed) level
    df = table([1.0, 1.0, 0.95, 0.5], [1.0, 1.0, 1.0, 0.95], bound=("candidate", 8, 3),
               reason="superseded by retry 1", engine_failed=True)
    at = (df["arm"] == "candidate") & (df["round"] == 3) & (df["concurrency"] == 8)
    df.loc[at, "slo_attainment"] = 0.4
    retry = df[at].assign(retry=1, selected=True, ok=True, reason="", engine_failed=False, slo_attainment=1.0)
    s = summarize(pd.concat([df, retry], ignore_index=True))
    cap = s["load"]["capacity"]["comparisons"]["candidate"]["in128-out32"]
    r3 = next(r for r in cap["rounds"] if r["round"] == 3)
    assert r3["candidate"]["bracket"] == [4.0, 8.0] and cap["n_pairs"] == 10
    # a level excluded for anything else (here the client's CPU) leaves that round's curve shorter
    s = summarize(table([1.0, 1.0, 0.95, 0.5], [1.0, 1.0, 1.0, 0.7], bound=("candidate", 8, 3),
                        reason="validity errors client_cpu", engine_failed=False))
    r3 = next(r for r in s["load"]["capacity"]["comparisons"]["candidate"]["in128-out32"]["rounds"] if r["round"] == 3)
    assert r3["candidate"]["censored"] == "above" and r3["candidate"]["capacity"] == 4.0


def test_a_table_without_the_capacity_facts_is_refused_by_name():
    df = table([1.0, 1.0, 0.95, 0.5], [1.0, 1.0, 1.0, 0.7]).drop(columns="engine_failed")
    with pytest.raises(StatsInputError, match="engine_failed"):
        summarize(df)


def test_the_load_section_says_where_along_the_curve_the_candidate_helps():
    s = summarize(table([1.0, 1.0, 0.95, 0.5], [1.0, 1.0, 1.0, 0.7]))
    text = load_section(s)
    assert "- `candidate`, output throughput (whole system) (`output_tok_s`): **faster** at 2 streams, 4 streams " \
           "and 8 streams (+25.5%); **equivalent** at 1 stream." in text
    assert "SLO: time to first token ≤ 500 ms; it holds at a level when at least 90% of" in text
    assert "- `candidate` on `in128-out32`: **more**: serves " in text
    tables = loadstats.capacity_tables(s)
    assert list(tables["capacity"].columns) == loadstats.CAPACITY_COLUMNS and len(tables["capacity"]) == 10
    row = tables["capacity_paired"].iloc[0]
    assert row["verdict"] == "more" and row["n_pairs"] == 10 and math.isclose(row["hl_ratio"], s["load"]["capacity"][
        "comparisons"]["candidate"]["in128-out32"]["hl_ratio"])


def test_a_single_stream_summary_has_no_load_block_and_no_section():
    s = pb_stats.summarize_all(table([1.0] * 4, [1.0] * 4), baseline="baseline", candidates=["candidate"],
                               metrics=["output_tok_s"], secondary=[], memory=[])
    assert "load" not in s and "load" not in s["params"] and load_section(s) == ""


def level_record(failed=("errors",), n_measured=10, n_ok=7, idle=None, gates=None) -> dict:
    return {"kind": "level", "validity": {"ok": not failed, "failed": list(failed), "messages": []},
            "metrics": {"n_measured": n_measured, "n_ok": n_ok}, "idle": idle or {"verified": True, "how": "/metrics"},
            "gates": gates if gates is not None else {"prompt_tokens": True, "cold_cache": None}}


@pytest.mark.parametrize("rec, expected", [
    (level_record(), True),
    (level_record(failed=("errors", "too_few_requests", "achieved_load")), True),  # what errors bring
    (level_record(failed=("errors", "schedule_lag")), False),  # the client set the pace
    (level_record(failed=("errors", "client_cpu")), False),
    (level_record(n_ok=10), False),  # only warm-up requests failed: the measured ones did not
    (level_record(failed=()), False),
    (level_record(idle={"verified": False, "how": "still busy after 120 s"}), False),  # started busy
    (level_record(idle={"verified": False, "how": "no idle probe (profile has none)"}), True),
    (level_record(gates={"prompt_tokens": False}), False),  # the engine misreported its counts
    ({"kind": "steady"}, False),
])
def test_engine_failed_is_read_from_the_records_facts_not_its_label(rec, expected):
    from pairbench.analysis.tables import engine_failed

    assert engine_failed(rec) is expected
