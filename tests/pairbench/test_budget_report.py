"""The report states the time budget (what it bought, what a next run needs) and the quiet guard."""

from pairbench.publish.stats_section import budget_line, run_lines

BUDGET = {"stopped_by": "budget", "max_minutes": 8, "used_minutes": 7.46, "width_level": 0.0125,
          "half_widths": [{"candidate": "c", "condition": "in256-out64", "metric": "decode_tok_s", "half_width": 0.031},
                          {"candidate": "c", "condition": "in1024-out64", "metric": "decode_tok_s",
                           "half_width": 0.072}],
          "rounds_for_target": 224, "minutes_for_target": 93.2}


def test_the_budget_line_says_what_the_budget_bought_and_what_a_next_run_needs():
    assert budget_line(BUDGET, 0.02) == (
        "- Time: budget 8 min; the rounds took 7.5 min, stopped by the budget; they bought half-widths of "
        "±3.1% to ±7.2% (at level 98.75%); for ±2.0% a next run would need about 224 rounds (about 93 min at "
        "this run's pace).")
    unbounded = {**BUDGET, "max_minutes": None, "stopped_by": None,
                 "half_widths": [{**BUDGET["half_widths"][0], "half_width": None}]}
    assert budget_line(unbounded, 0.02).startswith(
        "- Time: no budget; the rounds took 7.5 min; they bought no primary interval was bounded")


def test_the_quiet_guard_s_waits_are_disclosed():
    run = {"load": {"visits": 36, "threshold": 0.5, "flagged": ["r03-candidate"], "min": 0.9, "max": 2.1,
                    "waits": {"waited": ["r03-baseline", "r03-candidate"], "waited_s": 41.5,
                              "timed_out": ["r03-candidate"], "max_wait_s": 30}}}
    lines = run_lines({"run": run})
    assert lines[-1] == ("- Quiet guard: 2 of 36 visits waited for the machine to quiet (42 s in all, at most 30 s "
                         "each); 1 ran out of time and were measured anyway, flagged: r03-candidate.")
