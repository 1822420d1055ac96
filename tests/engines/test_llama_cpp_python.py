"""Integration test against a real engine: the whole pipeline on llama-cpp-python's server.

Arms ``threads: 1`` vs ``threads: 2`` (tests/config/llama_cpp_python.yaml), SmolLM2-135M GGUF.
Needs the ``llama_cpp`` package (CI installs a cached wheel, see docs/engines.md): locally the test
skips without it, under CI (``CI`` set) it fails, so it can never be skipped silently there.
"""

import importlib.util
import json

import pytest

from pairbench.publish import envfacts
from pairbench.publish import leakgate
from pairbench.core.artifacts import read_artifact
from pairbench.publish.verify import verify_bundle

from .pipeline_support import copy_checkout, snakemake

# the first test runs the whole pipeline on llama-cpp-python (snakemake's own limit below: 1800 s)
pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.timeout(2100)]
CONFIG = "tests/config/llama_cpp_python.yaml"


@pytest.fixture(scope="module")
def llama_cpp_installed():
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("uvicorn") is None:
        msg = "llama-cpp-python[server] is not installed (see docs/engines.md for the cached wheel)"
        pytest.skip(msg)


@pytest.fixture(scope="module")
def run(tmp_path_factory, smollm2_gguf, llama_cpp_installed):
    checkout = copy_checkout(tmp_path_factory.mktemp("checkout"))
    proc = snakemake(checkout, "--configfile", CONFIG, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return checkout, checkout / "results" / "llama-cpp-python"


def test_fixtures_verified_by_each_arms_server_tokenizer(run):
    _, res = run
    plan = read_artifact(res / "plan.json", "plan")
    for cond in plan["conditions"]:
        fx = read_artifact(res / "fixtures" / f"{cond['id']}.json", "fixture")
        assert fx["checked_by"] == ["threads1", "threads2"]
        assert all(r["prompt_tokens"] == cond["input_tokens"] for r in fx["rounds"])


def test_build_records_the_engine_and_its_cache_proof(run):
    _, res = run
    for arm in ("threads1", "threads2"):
        b = read_artifact(res / "build" / f"{arm}.json", "build")
        assert b["native_version"].startswith("llama-cpp-python 0.3.")
        assert b["engine"]["engine"] == "llama-cpp-python" and b["engine"]["cold_cache_proof"] == "strong"
        assert b["conversion"] is None and b["model"]["arg"].endswith(".gguf")


def test_every_visit_gated_and_disclosed(run):
    _, res = run
    plan = read_artifact(res / "plan.json", "plan")
    threads = {}
    for v in plan["visits"]:
        m = read_artifact(res / "measure" / f"{v['id']}.json", "measure")
        argv = m["server"]["argv"]
        threads[v["arm"]] = argv[argv.index("--n_threads") + 1]
        assert m["server"]["engine"] == "llama-cpp-python" and m["server"]["cold_cache_proof"] == "strong"
        assert m["server"]["log_prefix_hits"] == []  # the flush request left nothing to reuse
        assert m["first_request"]["ok"]
        for rec in m["records"]:
            assert rec["gates"]["prompt_tokens"] is True and rec["prompt_tokens"] == rec["input_tokens"]
            assert rec["gates"]["completion_tokens"] is True and rec["completion_tokens"] == rec["output_tokens"]
            # proven from the server's log: every prompt token evaluated, no prefix reused
            assert rec["gates"]["cold_cache"] is True and rec["tokens_cached"] == 0
            assert rec["ok"] and rec["flags"] == [] and rec["ttft_ms"] > 0 and rec["decode_tok_s"] > 0
            assert rec["engine"] is None  # no engine timings in llama-cpp-python's replies
    assert threads == {"threads1": "1", "threads2": "2"}


def test_validation_and_statistics(run):
    _, res = run
    plan = read_artifact(res / "plan.json", "plan")
    for v in plan["visits"]:
        read_artifact(res / "validate" / f"{v['id']}.json", "validate")
    summary = json.loads((res / "stats" / "summary.json").read_text())
    assert summary["schema"].startswith("pairbench.summary/")
    assert (res / "tables" / "measurements.csv").read_text().count("\n") == 1 + len(plan["visits"]) * len(plan["conditions"])


def test_bundle_verifies_passes_the_leak_gate_and_states_the_proof(run):
    _, res = run
    bundle = res / "publish"
    assert verify_bundle(bundle) == []
    assert leakgate.scan(bundle, envfacts.identifiers(envfacts.collect(torch=False))) == []
    report = (bundle / "README.md").read_text()
    assert "`threads1` runs engine `llama-cpp-python`; cold cache proven per request" in report
