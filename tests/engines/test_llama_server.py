"""Integration test against a real compiled engine: the whole pipeline on llama.cpp's llama-server.

Both arms are built from source (tests/config/llama_server.yaml): the tag made from the
llama-cpp-python sdist, and the same tag plus a prototype kernel patch, through ccache, so after
the first time a build recompiles only the patched files and the handful CMake generates with
absolute paths. Needs cmake, a C++ compiler, ccache and the tagged repository, all of which
``./install.sh --test`` provides: locally the test skips without them, under CI (``CI`` set) it
fails, so it can never be skipped silently there.
"""

import json
import shutil

import pytest

from pairbench.arms.gitsource import GitSourceError, resolve_tag
from pairbench.arms.llamacpp_tree import tag_name
from pairbench.core.artifacts import read_artifact, schema_id
from pairbench.core.cache import user_cache
from pairbench.publish import envfacts, leakgate
from pairbench.publish.verify import verify_bundle

from .pipeline_support import copy_checkout, snakemake

# the first test builds both llama.cpp arms (snakemake's own limit below: 3600 s)
pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.timeout(3900)]
CONFIG = "tests/config/llama_server.yaml"
TAG = tag_name("0.3.36")


@pytest.fixture(scope="module")
def toolchain():
    missing = [t for t in ("cmake", "c++", "ccache") if shutil.which(t) is None]
    try:
        resolve_tag(str(user_cache() / "llama.cpp"), TAG)
    except GitSourceError:
        missing.append(f"the llama.cpp repository with tag {TAG} (python -m pairbench llama-tree)")
    if missing:
        msg = f"not installed: {', '.join(missing)} (./install.sh --test installs them)"
        pytest.skip(msg)


@pytest.fixture(scope="module")
def run(tmp_path_factory, smollm2_gguf, toolchain):
    checkout = copy_checkout(tmp_path_factory.mktemp("checkout"))
    proc = snakemake(checkout, "--configfile", CONFIG, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return checkout, checkout / "results" / "llama-server"


def test_both_arms_built_from_the_tag_through_ccache(run):
    _, res = run
    builds = {a: read_artifact(res / "build" / f"{a}.json", "build") for a in ("baseline", "candidate")}
    for arm, b in builds.items():
        src = read_artifact(res / "source" / f"{arm}.json", "source")
        assert src["git"]["tag"] == TAG
        assert b["native_version"].startswith("version: ") and src["git"]["commit"][:7] in b["native_version"]
        tc = b["toolchain"]
        assert tc["targets"] == ["llama-server", "llama-bench"] and "-DGGML_NATIVE=OFF" in tc["flags"]
        assert "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache" in tc["flags"] and tc["cxx_compiler"]["id"] in ("GNU", "Clang")
        cc = tc["ccache"]
        assert cc["hits"] + cc["misses"] + cc["uncacheable"] == cc["calls"]
        assert [s["step"] for s in b["steps"]] == ["configure", "compile", "version"]
    # whichever arm was built second found every file the patch leaves alone in the cache: it
    # compiled at most the two patched files and the ten unity sources CMake writes with absolute paths
    assert min(b["toolchain"]["ccache"]["misses"] for b in builds.values()) <= 12
    patched = read_artifact(res / "source" / "candidate.json", "source")["patched"]["changed"]
    assert patched == ["ggml/src/ggml-cpu/arch/x86/quants.c", "ggml/src/ggml-cpu/ggml-cpu.c"]


def test_every_request_gated_cold_from_the_servers_own_counters(run):
    _, res = run
    plan = read_artifact(res / "plan.json", "plan")
    for v in plan["visits"]:
        m = read_artifact(res / "measure" / f"{v['id']}.json", "measure")
        assert m["server"]["engine"] == "llama-server" and m["server"]["cold_cache_proof"] == "strong"
        for rec in m["records"]:
            assert rec["ok"] and rec["flags"] == []
            assert rec["gates"] == {"prompt_tokens": True, "completion_tokens": True, "cold_cache": True}
            # llama.cpp's own timings: every prompt token evaluated, none reused from the slot
            assert rec["engine"]["prompt_n"] == rec["input_tokens"] and rec["tokens_cached"] == 0
            assert rec["completion_tokens"] == rec["output_tokens"]


def test_the_patch_keeps_greedy_outputs_identical(run):
    _, res = run
    plan = read_artifact(res / "plan.json", "plan")
    for v in plan["visits"]:
        val = read_artifact(res / "validate" / f"{v['id']}.json", "validate")
        for rec in val["records"]:
            assert rec["selected"], rec["excluded_because"]
            assert rec["verdicts"]["token_counts"]["verdict"] == "pass"
            if v["arm"] == "candidate":
                assert rec["verdicts"]["matches_baseline"]["agreement"] == 1.0


def test_llama_bench_cross_check_for_both_arms(run):
    _, res = run
    for arm in ("baseline", "candidate"):
        cc = read_artifact(res / "crosscheck" / f"{arm}.json", "crosscheck")
        assert {(t["test"], t["n_depth"]) for t in cc["tests"]} == {("pp256", 0), ("tg16", 256)}
        assert all(t["avg_tok_s"] > 0 and t["n_threads"] == 1 for t in cc["tests"])
    body = read_artifact(res / "stats" / "crosscheck.json", "crosscheck_summary")
    assert [(r["quantity"], r["metric"]) for r in body["rows"]] == [
        ("prefill", "engine_prefill_tok_s"), ("decode", "engine_decode_tok_s")]


def test_bundle_verifies_passes_the_leak_gate_and_reports_build_and_cross_check(run):
    _, res = run
    bundle = res / "publish"
    assert verify_bundle(bundle) == []
    assert leakgate.scan(bundle, envfacts.identifiers(envfacts.collect(torch=False))) == []
    report = (bundle / "README.md").read_text()
    assert "## How it was built" in report and "## Cross-check: llama-bench" in report
    assert "llama-bench and pairbench agree on the direction of the effect in" in report
    published = json.loads((bundle / "tables" / "crosscheck.json").read_text())
    assert published["schema"] == schema_id("crosscheck_summary") and len(published["rows"]) == 2
    assert (bundle / "patches" / "q4_1-avx2-2x2.patch").is_file()


def test_the_audit_passes_with_the_build_folders_inside_the_trees(run):
    _, res = run
    audit = read_artifact(res / "audit.json", "audit")
    assert audit["ok"], audit["findings"]
