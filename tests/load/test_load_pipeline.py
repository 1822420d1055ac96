"""A load run through the whole pipeline on the batching fake (tests/load/load_fake.yaml): both arms
serve 4 streams with continuous batching, the candidate's decode step and prefill are cheaper; a
closed-loop sweep of 1, 2 and 4 streams, 2 rounds. Every artifact validates, the levels are measured
in their counterbalanced order and every request is gated, the candidate's throughput is higher in
every pair at 2 and 4 streams, the capacity is computed, the report has its Load section, and
``verify`` recomputes every verdict, the capacity included, from the bundle. A bad load config fails
before anything runs, naming its key."""

import json
import shutil

import pandas as pd
import pytest

from pairbench.analysis.loadlevel import judged
from pairbench.core.artifacts import read_artifact
from pairbench.publish.recompute import recompute_problems
from pairbench.publish.verify import verify_bundle
from tests.engines.pipeline_support import finished_run, snakemake

pytestmark = pytest.mark.slow
CONFIG = "tests/load/load_fake.yaml"


@pytest.fixture(scope="module")
def run(tmp_path_factory, smollm2_gguf):
    return finished_run(tmp_path_factory, CONFIG, "load-fake", timeout=600)


def test_the_levels_are_measured_in_counterbalanced_order_and_every_request_gated(run):
    _, res = run
    plan = read_artifact(res / "plan.json", "plan")
    ids = [c["id"] for c in plan["conditions"]]
    assert ids == ["in400-out16-c1", "in400-out16-c2", "in400-out16-c4"]
    assert plan["load"]["level_orders"] == {"1": ids, "2": ids}  # one ABBA block: reversed in the next
    for v in plan["visits"]:
        m = read_artifact(res / "measure" / f"{v['id']}.json", "measure")
        assert [r["condition"] for r in m["records"]] == plan["load"]["level_orders"][str(v["round"])]
        for r in m["records"]:
            assert r["kind"] == "level" and r["ok"], r["flags"]
            assert r["gates"] == {"prompt_tokens": True, "completion_tokens": True, "cold_cache": True}
            assert r["idle"]["verified"] and "metrics" not in r and len(r["client"]["requests"]) == 14
        for r in judged(m, plan)["records"]:  # the metrics, as the statistics compute them from the raw times
            assert r["ok"] and r["metrics"]["n_ok"] == 12 and r["validity"]["ok"], r["flags"]
        for r in m["records"]:
            private = read_artifact(res / "private" / "levels" / f"{v['id']}-{r['condition']}.json", "levelrun")
            assert len(private["gates"]) == 14 and all(g["gates"]["prompt_tokens"] for g in private["gates"])
        fx = read_artifact(res / "fixtures" / f"{ids[0]}.json", "fixture")
        assert len({q["salt"] for rnd in fx["rounds"] for q in rnd["requests"]}) == 2 * 14


def test_the_cheaper_candidate_has_more_throughput_in_every_pair_and_capacity_is_computed(run):
    _, res = run
    summary = read_artifact(res / "stats" / "summary.json", "summary")
    paired = summary["comparisons"]["candidate"]["paired"]
    for level in ("in400-out16-c2", "in400-out16-c4"):
        ratios = [p["ratio"] for p in paired[level]["output_tok_s"]["pairs"]]
        assert len(ratios) == 2 and all(r > 1.2 for r in ratios), (level, ratios)
    assert summary["params"]["primary"] == ["output_tok_s", "ttft_p90_ms"]
    cap = summary["load"]["capacity"]["comparisons"]["candidate"]["in400-out16"]
    assert cap["n_pairs"] == 2 and len(cap["rounds"]) == 2
    assert cap["verdict"] == "inconclusive"  # 2 rounds bound no interval
    df = pd.read_csv(res / "tables" / "measurements.csv")
    assert len(df) == 2 * 2 * 3 and df["selected"].all()
    assert {"output_tok_s", "slo_attainment", "client_cpu_s"} <= set(df.columns) and "decode_tok_s" not in df.columns


def test_the_bundle_has_the_load_section_and_verify_recomputes_it(run, tmp_path):
    _, res = run
    bundle = res / "publish"
    assert verify_bundle(bundle) == []
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    names = {f["path"] for f in manifest["files"]} if isinstance(manifest["files"], list) else set(manifest["files"])
    assert {"tables/capacity.csv", "tables/capacity_paired.csv", "plots/load.png"} <= names
    report = (bundle / "README.md").read_text()
    for words in ("## Load", "### Along the curve", "### SLO capacity", "### Levels", "### How each level was run",
                  "Idle server: verified before 12 of 12 levels", "Prefix cache of `baseline`: off by a launch flag"):
        assert words in report, words
    # a changed capacity is caught: verify recomputes it from the measurements
    copy = shutil.copytree(bundle, tmp_path / "bundle")
    cap = pd.read_csv(copy / "tables" / "capacity.csv")
    cap.loc[0, "candidate_capacity"] = cap.loc[0, "candidate_capacity"] * 2
    cap.to_csv(copy / "tables" / "capacity.csv", index=False)
    problems = recompute_problems(copy)
    assert any(p.startswith("tables/capacity.csv: row 2") and "candidate_capacity" in p for p in problems), problems
    text = (copy / "README.md").read_text().replace("### SLO capacity", "### SLO capacities")
    (copy / "README.md").write_text(text)
    assert any(p.startswith("README.md: its load section is not the one") for p in recompute_problems(copy))


def test_nothing_is_left_to_do_and_a_bad_load_config_names_its_key(run):
    checkout, _ = run
    again = snakemake(checkout, "-n", "--configfile", CONFIG)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    bad = snakemake(checkout, "-n", "--configfile", CONFIG, "--config", "load={concurrency: [1, 2], rate: [1]}")
    assert bad.returncode != 0
    assert "load: give either load.concurrency (closed loop: streams) or load.rate (open loop: requests/s), not both" \
        in bad.stdout + bad.stderr
