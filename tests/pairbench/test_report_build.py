"""The report's build section (compiled engines) and cross-check section (pairbench.publish.report)."""

from pairbench.publish.report import build_section, crosscheck_section

PLAN = {"arms": {"baseline": {}, "candidate": {}}, "baseline": "baseline", "candidates": ["candidate"]}
FLAGS = ["-DGGML_NATIVE=OFF", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]


def _build(hits, misses, compile_s):
    cxx = {"id": "GNU", "version": "12.2.0", "name": "c++", "version_line": "c++ (Debian 12.2.0-14) 12.2.0"}
    return {"steps": [{"step": "configure", "duration_s": 1.0}, {"step": "compile", "duration_s": compile_s},
                      {"step": "version", "duration_s": 0.0}],
            "toolchain": {"generator": "Unix Makefiles", "cmake": "cmake version 3.25.1", "c_compiler": cxx,
                          "cxx_compiler": cxx, "flags": FLAGS, "targets": ["llama-server", "llama-bench"], "jobs": 2,
                          "build_dir": "build",
                          "ccache": {"version": "ccache version 4.7.5", "calls": hits + misses, "hits": hits,
                                     "direct_hits": hits, "preprocessed_hits": 0, "misses": misses,
                                     "uncacheable": 0, "hit_rate": hits / (hits + misses)}}}


def test_build_section_shows_each_arms_compile_time_and_cache_use():
    lines = build_section(PLAN, {"baseline": _build(0, 194, 497.2), "candidate": _build(182, 12, 38.8)})
    assert lines[0] == "## How it was built"
    assert "| `baseline` | GNU 12.2.0 | `llama-server`, `llama-bench` | 1.0 | 497.2 | 0 hits / 194 misses of 194 compiles (0%) |" in lines
    assert "| `candidate` | GNU 12.2.0 | `llama-server`, `llama-bench` | 1.0 | 38.8 | 182 hits / 12 misses of 194 compiles (94%) |" in lines
    assert "flags (both arms): `-DGGML_NATIVE=OFF` `-DCMAKE_CXX_COMPILER_LAUNCHER=ccache`" in "\n".join(lines)


def test_no_build_section_for_engines_that_are_not_compiled():
    assert build_section(PLAN, {"baseline": {"steps": []}, "candidate": {"steps": [], "toolchain": None}}) == []


def _installed(version, tree_sha, install_s):
    env = {"kind": "venv", "path": "results/x/src/a/.venv", "python": "results/x/src/a/.venv/bin/python",
           "python_version": "3.11.7", "system_site_packages": True, "package": "vllm", "version": version,
           "module": "vllm", "imports_from": "tree", "module_path": "vllm/__init__.py", "tree_sha256": tree_sha}
    return {"steps": [{"step": "venv", "duration_s": 0.3}, {"step": "install", "duration_s": install_s}],
            "toolchain": None, "environment": env}


def test_build_section_shows_each_installed_arm_and_where_its_environment_imports_it_from():
    lines = build_section(PLAN, {"baseline": _installed("0.10.1", "a" * 64, 41.0),
                                 "candidate": _installed("0.10.1", "b" * 64, 39.5)})
    assert lines[:4] == ["## How it was built", "",
                         "| arm | installed | interpreter | imports the engine from | install (s) | source tree sha256 |",
                         "|---|---|---|---|---|---|"]
    assert "| `baseline` | `vllm` 0.10.1 | Python 3.11.7 | its tree (editable) | 41.0 | aaaaaaaaaaaa |" in lines
    assert "| `candidate` | `vllm` 0.10.1 | Python 3.11.7 | its tree (editable) | 39.5 | bbbbbbbbbbbb |" in lines


def test_crosscheck_section_states_the_agreement():
    row = {"condition": "in256-out64", "quantity": "prefill", "test": "pp256", "n_depth": 0, "metric": "engine_prefill_tok_s",
           "baseline_tok_s": 150.0, "candidate_tok_s": 225.0, "baseline_stddev_tok_s": 3.0,
           "candidate_stddev_tok_s": 4.0, "tool_ratio": 1.5, "tool_direction": "faster", "pairbench_ratio": 1.48,
           "pairbench_ci_low": 1.45, "pairbench_ci_high": 1.52, "verdict": "faster", "direction": "agree",
           "size": "within CI", "size_gap": 0.0135}
    body = {"baseline": "baseline", "candidate": "candidate", "tool": "llama-bench", "noise": 0.01, "rounds": 3,
            "rows": [row], "direction_counts": {"agree": 1, "disagree": 0, "undecided": 0}, "size_within_ci": 1}
    text = "\n".join(crosscheck_section(body))
    assert "| `in256-out64` | prefill | `pp256` | 150.0 ± 3.0 | 225.0 ± 4.0 | 1.500 | 1.480 [1.450, 1.520] | faster | agree | within CI |" in text
    assert ("**llama-bench and pairbench agree on the direction of the effect in 1 of 1 comparisons. "
            "llama-bench's ratio lies inside pairbench's confidence interval in 1 of 1.**") in text
    assert crosscheck_section(None) == []
