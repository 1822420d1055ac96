"""``pairbench verify`` recomputes every verdict and number from the bundle's measurements table and
recorded parameters: a bundle whose tables, README or parameters do not follow from its measurements
fails, naming the file, row and column."""

import json

import pandas as pd
import pytest

from pairbench.analysis import runfacts, stats, tables
from pairbench.core.artifacts import dumps, schema_id
from pairbench.publish.assemble import stats_params
from pairbench.publish.recompute import recompute_problems
from pairbench.publish.stats_section import statistics_section


def measurements(effect=0.95, rounds=10, unproven_round=None, extra=()):
    """Arm A, arm B at *effect* on decode, and each (arm, effect) of *extra*."""
    rows = []
    for r in range(1, rounds + 1):
        for i, (arm, k) in enumerate((("A", 1.0), ("B", effect), *extra)):
            noise = 1 + 0.002 * ((r * 7 + (arm != "A") * 3 * i) % 5 - 2)
            rows.append({"round": r, "arm": arm, "condition": "in64-out64", "input_tokens": 64, "output_tokens": 64,
                         "repeat": 1, "ok": True,
                         "cold_cache": None if r == unproven_round else True, "selected": True, "reason": "",
                         "decode_tok_s": 20.0 * k * noise, "prefill_tok_s": 400.0 * noise, "ttft_ms": 160.0 / noise,
                         "e2e_ms": 3300.0 / noise, "prompt_tokens": 64, "kv_bytes": 1000 if arm == "A" else 260,
                         "peak_rss_bytes": 4e8})
    return pd.DataFrame(rows)


def write_bundle(root, df, candidates=("B",), **kw):
    (root / "tables").mkdir(parents=True)
    df.to_csv(root / "tables" / "measurements.csv", index=False)
    df = pd.read_csv(root / "tables" / "measurements.csv")
    summary = stats.summarize_all(df, baseline="A", candidates=list(candidates), **kw)
    plan = {"rounds": int(df["round"].nunique()), "repeats": 1}
    measures = [{"visit": {"round": int(r), "id": f"r{int(r):02d}-a"}} for r in sorted(df["round"].unique())]
    summary["run"] = runfacts.run_facts(plan, measures, df, {"allow_unproven_cold_cache": False})
    for name, t in tables.summary_tables(summary).items():
        t.to_csv(root / "tables" / f"{name}.csv", index=False)
    (root / "stats_params.json").write_text(dumps({**stats_params(summary), "schema": schema_id("stats_params")}))
    (root / "README.md").write_text("# report\n\n" + statistics_section(summary) + "\n## Files\n")
    return summary


@pytest.fixture
def bundle(tmp_path):
    root = tmp_path / "bundle"
    write_bundle(root, measurements())
    return root


def test_a_bundle_recomputes(bundle):
    assert recompute_problems(bundle) == []
    assert "**slower**: decode throughput" in (bundle / "README.md").read_text()


def test_a_forged_verdict_is_named(bundle):
    path = bundle / "tables" / "paired.csv"
    df = pd.read_csv(path)
    df.loc[df["metric"] == "decode_tok_s", "verdict"] = "faster"
    df.to_csv(path, index=False)
    [problem] = recompute_problems(bundle)
    assert problem.startswith("tables/paired.csv: row 2 (candidate B, condition in64-out64, metric decode_tok_s): column 'verdict' is "
                              "'faster', the measurements give 'slower'")


def test_a_forged_number_is_named(bundle):
    path = bundle / "tables" / "memory.csv"
    df = pd.read_csv(path)
    df.loc[df["metric"] == "kv_bytes", "ratio"] = 0.2
    df.to_csv(path, index=False)
    assert any("tables/memory.csv: row 2 (candidate B, condition in64-out64, metric kv_bytes): column 'ratio' is 0.2" in p
               for p in recompute_problems(bundle))


def test_a_forged_readme_sentence_is_named(bundle):
    readme = bundle / "README.md"
    text = readme.read_text()
    assert "4.9% lower" in text
    readme.write_text(text.replace("4.9% lower", "1.0% lower"))
    [problem] = recompute_problems(bundle)
    assert problem.startswith("README.md: its statistics section is not the one the measurements give (line ")


def test_changed_measurements_or_parameters_are_caught(bundle):
    params = json.loads((bundle / "stats_params.json").read_text())
    (bundle / "stats_params.json").write_text(dumps({**params, "noise": 0.2}))
    problems = recompute_problems(bundle)
    assert any("column 'verdict' is 'slower', the measurements give 'equivalent'" in p for p in problems)
    assert any(p.startswith("README.md") for p in problems)


def test_an_unproven_record_counted_without_the_opt_in_is_caught(tmp_path):
    root = tmp_path / "b"
    write_bundle(root, measurements(unproven_round=3))
    assert any("2 selected row(s) without cold-cache proof" in p for p in recompute_problems(root))


def test_published_verdicts_without_their_parameters_fail(bundle):
    (bundle / "stats_params.json").unlink()
    assert recompute_problems(bundle) == [
        "stats_params.json: missing, so the published verdicts cannot be recomputed from tables/measurements.csv"]


@pytest.fixture
def three_arms(tmp_path):
    root = tmp_path / "three"
    write_bundle(root, measurements(extra=(("C", 1.0),)), candidates=("B", "C"))
    return root


def test_a_three_arm_bundle_recomputes_every_candidate(three_arms):
    assert recompute_problems(three_arms) == []
    paired = pd.read_csv(three_arms / "tables" / "paired.csv")
    primary = paired[paired["role"] == "primary"]
    assert list(primary["candidate"]) == ["B", "B", "C", "C"]
    assert sorted(primary["family_rank"]) == [1, 2, 3, 4]  # one family over both candidates


def test_a_forged_verdict_of_the_second_candidate_is_named(three_arms):
    path = three_arms / "tables" / "paired.csv"
    df = pd.read_csv(path)
    row = (df["candidate"] == "C") & (df["metric"] == "decode_tok_s")
    df.loc[row, "verdict"] = "faster"
    df.to_csv(path, index=False)
    problems = recompute_problems(three_arms)
    assert any(p.startswith(f"tables/paired.csv: row {df.index[row][0] + 2} (candidate C, condition in64-out64, metric "
                            "decode_tok_s): column 'verdict' is 'faster'") for p in problems)


def test_dropping_a_candidate_from_the_parameters_is_caught(three_arms):
    params = json.loads((three_arms / "stats_params.json").read_text())
    (three_arms / "stats_params.json").write_text(dumps({**params, "candidates": ["B"]}))
    assert recompute_problems(three_arms)[0].startswith("tables/summary.csv: ")
