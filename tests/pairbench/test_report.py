"""The report's line on the sandbox's isolation layers (pairbench.publish.report.isolation_lines)."""

from pairbench.publish.report import isolation_lines

ALL = ["env", "tmpdir", "rlimit", "wall", "output", "user", "pidns", "mountns", "netns", "landlock-fs", "landlock-net",
       "landlock-scope", "audit"]


def _rec(missing=None, sandboxed=True):
    verdicts = {"token_counts": {"verdict": "pass", "reason": ""}}
    if sandboxed:
        v = {"verdict": "pass", "reason": "all tests passed", "duration_s": 0.1}
        if missing is not None:
            v["isolation"] = {"applied": [layer for layer in ALL if layer not in missing], "missing": list(missing)}
        verdicts["python_function"] = v
    return {"condition": "in8-out8", "output_sha256": "0" * 64, "selected": True, "verdicts": verdicts}


def _validations(*records_per_visit):
    return {(f"r0{i}-baseline", 0): {"records": list(recs)} for i, recs in enumerate(records_per_visit, 1)}


def test_every_layer_applied_is_said_in_one_line():
    lines = isolation_lines(_validations([_rec([]), _rec([])], [_rec([])]))
    assert lines == ["Sandbox isolation: all 13 layers (env, tmpdir, rlimit, wall, output, user, pidns, mountns, "
                     "netns, landlock-fs, landlock-net, landlock-scope, audit) applied to each of the 3 records whose function ran in "
                     "the sandbox; the verdict is decided outside it. (docs/validation.md)", ""]


def test_a_missing_layer_is_named_with_how_many_records_lacked_it():
    lines = isolation_lines(_validations([_rec(["landlock-scope"]), _rec(["netns", "landlock-scope"])],
                                         [_rec([]), _rec(sandboxed=False)]))
    assert lines[0] == ("Sandbox isolation: NOT every layer applied to the records whose function ran in the "
                        "sandbox: missing `netns` for 1 of 3; `landlock-scope` for 2 of 3. (docs/validation.md)")


def test_missing_landlock_fs_says_what_that_means():
    line = isolation_lines(_validations([_rec(["landlock-fs", "landlock-net", "landlock-scope"])]))[0]
    assert "missing `landlock-fs` for 1 of 1; `landlock-net` for 1 of 1; `landlock-scope` for 1 of 1." in line
    assert "saw only the sandbox's read-only view" in line
    line = isolation_lines(_validations([_rec(["mountns", "landlock-fs"])]))[0]
    assert "missing `mountns` for 1 of 1; `landlock-fs` for 1 of 1." in line
    assert "could read this machine's files" in line


def test_records_from_an_older_pairbench_are_said_to_record_no_layers():
    line = isolation_lines(_validations([_rec([]), _rec(None)]))[0]
    assert line.endswith("1 sandboxed record(s) do not record their layers (validated by an older pairbench). "
                         "(docs/validation.md)")


def test_no_sandboxed_record_no_line():
    assert isolation_lines(_validations([_rec(sandboxed=False)])) == []
    assert isolation_lines({}) == []


def test_the_run_section_states_only_what_the_summary_records():
    import math

    import pandas as pd

    from pairbench.analysis import stats
    from pairbench.publish.stats_section import statistics_section

    rows = [{"round": r, "arm": a, "condition": "in64-out64", "input_tokens": 64, "output_tokens": 64, "selected": True,
             "decode_tok_s": 100.0 * (1.0 if a == "A" else 1.02) * math.exp(0.001 * ((r * 3) % 7))}
            for r in range(1, 11) for a in ("A", "B")]
    s = stats.summarize_all(pd.DataFrame(rows), baseline="A", candidates=["B"], metrics=["decode_tok_s"])
    s["run"] = {"rounds": {"adaptive": True, "planned": 16, "run": 10, "min": 8, "max": 16, "block": 2,
                           "target_halfwidth": 0.02, "stop_reason": "stopped after 10 rounds: every primary interval "
                           "reached the target ±2.00% (widest ±1.90%, at level 95.00%)"},
                "repeats": 1,
                "cold_cache": {"records": 20, "unproven": 3, "allowed": True, "cross_check": []},
                "load": {"visits": 20, "threshold": 0.5, "flagged": ["r02-A", "r05-B"], "min": 0.2, "max": 2.4},
                "pinning": "server on CPU(s) 1, client on CPU(s) 0 in every visit"}
    md = statistics_section(s)
    assert ("- Rounds: adaptive, 8 to 16 in blocks of 2 (target half-width ±2.0% for every primary comparison); "
            "10 run; stopped after 10 rounds") in md
    assert ("- Cold cache: 3 of 20 records have no server-side proof of a cold cache; they are included, because the "
            "config opts in (`gates.allow_unproven_cold_cache: true`).") in md
    assert "- External load: 2 of 20 visits started with a 1-minute load average more than 0.5 above" in md
    assert "r02-A, r05-B" in md and "- CPU pinning: server on CPU(s) 1, client on CPU(s) 0 in every visit." in md
    s["run"]["cold_cache"].update(unproven=0, allowed=False)
    s["run"]["load"]["flagged"] = []
    md = statistics_section(s)
    assert "- Cold cache: proven by the engine's own counters for all 20 records." in md
    assert "- External load: none flagged in 20 visits (1-minute load average 0.20–2.40)." in md


def test_landing_has_one_verdict_table_over_every_candidate():
    import pandas as pd

    from pairbench.publish.landing import verdict_rows

    paired = pd.DataFrame([
        {"candidate": "int8", "condition": "in256-out64", "input_tokens": 256, "output_tokens": 64,
         "metric": "decode_tok_s", "role": "primary", "hl_ratio": 0.91,
         "ci_low": 0.88, "ci_high": 0.94, "ci_level": 0.9875, "verdict": "slower"},
        {"candidate": "int8", "condition": "in256-out64", "input_tokens": 256, "output_tokens": 64,
         "metric": "ttft_ms", "role": "secondary", "hl_ratio": 1.0,
         "ci_low": 0.9, "ci_high": 1.1, "ci_level": 0.95, "verdict": None},
        {"candidate": "grow", "condition": "in256-out64", "input_tokens": 256, "output_tokens": 64,
         "metric": "decode_tok_s", "role": "primary", "hl_ratio": 1.0,
         "ci_low": None, "ci_high": None, "ci_level": 0.975, "verdict": "inconclusive"}])
    assert verdict_rows(paired) == [
        ["``int8``", "``in256-out64``", "``decode_tok_s``", "0.910", "[0.880, 0.940] (98.8%)", "slower"],
        ["``grow``", "``in256-out64``", "``decode_tok_s``", "1.000", "unbounded", "inconclusive"]]
