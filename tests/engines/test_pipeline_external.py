"""The whole pipeline with non-embedded arms (fake vLLM): opt-in, dry run, then a full run."""

import json

import pytest

from pairbench.publish import envfacts
from pairbench.publish import leakgate
from pairbench.core.artifacts import read_artifact
from pairbench.publish.verify import verify_bundle

from .pipeline_support import copy_checkout, snakemake

pytestmark = pytest.mark.slow
CONFIG = "tests/engines/fake_vllm.yaml"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory, smollm2_gguf):
    return copy_checkout(tmp_path_factory.mktemp("checkout"))


def test_without_opt_in_nothing_external_runs_and_the_plan_is_shown(tmp_path, smollm2_gguf):
    checkout = copy_checkout(tmp_path)  # its own: the shared one may hold the opt-in run's builds
    dry = snakemake(checkout, "-n", "--configfile", CONFIG)
    assert dry.returncode == 0, dry.stderr[-2000:]
    run = snakemake(checkout, "--configfile", CONFIG)
    assert run.returncode != 0
    res = checkout / "results" / "fake-vllm"
    logs = "".join(p.read_text() for p in (checkout / "logs" / "fake-vllm").rglob("*.log"))
    assert "allow_external" in logs and "arm one: engine vllm (EXTERNAL)" in logs
    assert "--flavor vllm serve" in logs and "OMP_NUM_THREADS=2" in logs
    # Nothing was built, launched or contacted: no build artifact, no server log.
    assert not (res / "build").exists() or not any((res / "build").iterdir())
    assert not (res / "private" / "logs").exists() or not any((res / "private" / "logs").iterdir())


def test_with_opt_in_the_whole_pipeline_runs(checkout):
    run = snakemake(checkout, "--configfile", CONFIG, "--config", "allow_external=true")
    assert run.returncode == 0, run.stderr[-3000:]
    res = checkout / "results" / "fake-vllm"
    plan = read_artifact(res / "plan.json", "plan")
    assert plan["allow_external"] is True and plan["arms"]["one"]["engine"] == "vllm"
    build = read_artifact(res / "build" / "two.json", "build")
    assert build["engine"]["cold_cache_proof"] == "weak" and build["native_version"] == "unknown"
    for cond in plan["conditions"]:
        fixture = read_artifact(res / "fixtures" / f"{cond['id']}.json", "fixture")
        assert fixture["checked_by"] == ["one", "two"]  # verified through each arm's /tokenize
    for v in plan["visits"]:
        m = read_artifact(res / "measure" / f"{v['id']}.json", "measure")
        assert m["server"]["engine"] == "vllm" and m["server"]["cold_cache_proof"] == "weak"
        assert m["server"]["log_prefix_hits"] is None
        for rec in m["records"]:
            assert rec["ok"] and rec["flags"] == [], rec["flags"]
            assert rec["gates"] == {"prompt_tokens": True, "completion_tokens": True, "cold_cache": True}
            assert rec["prompt_tokens"] == rec["input_tokens"] and rec["completion_tokens"] == 8
            assert rec["engine"] is None  # vLLM reports no engine timings: client-side only
    summary = json.loads((res / "stats" / "summary.json").read_text())
    assert summary["schema"].startswith("pairbench.summary/")
    # The bundle: verifies offline, passes the leak gate, and says how the cold cache was shown.
    bundle = res / "publish"
    assert verify_bundle(bundle) == []
    assert leakgate.scan(bundle, envfacts.identifiers(envfacts.collect(torch=False))) == []
    report = (bundle / "README.md").read_text()
    assert "installed package" in report
    assert "`one` runs engine `vllm`; cold cache shown per request only by the absence" in report
    again = snakemake(checkout, "-n", "--configfile", CONFIG, "--config", "allow_external=true")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_llama_cpp_python_profile_through_the_whole_pipeline(checkout):
    """Completions mode, tokenize-count prompts, chunk-count completions, flush + log-proven cold cache."""
    cfg = "tests/engines/fake_llama_cpp_python.yaml"
    run = snakemake(checkout, "--configfile", cfg)
    assert run.returncode == 0, run.stderr[-3000:]
    res = checkout / "results" / "fake-llama-cpp-python"
    plan = read_artifact(res / "plan.json", "plan")
    for v in plan["visits"]:
        m = read_artifact(res / "measure" / f"{v['id']}.json", "measure")
        assert m["server"]["cold_cache_proof"] == "strong" and m["server"]["log_prefix_hits"] == []
        argv = m["server"]["argv"]
        assert argv[argv.index("--n_threads") + 1] == v["arm"][-1]
        for rec in m["records"]:
            assert rec["ok"] and rec["flags"] == [], rec["flags"]
            assert rec["gates"] == {"prompt_tokens": True, "completion_tokens": True, "cold_cache": True}
            assert rec["tokens_cached"] == 0
    bundle = res / "publish"
    assert verify_bundle(bundle) == []
    assert "`threads2` runs engine `llama-cpp-python`; cold cache proven per request" in (bundle / "README.md").read_text()
