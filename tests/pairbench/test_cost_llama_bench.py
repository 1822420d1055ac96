"""llama-bench under the cost channel, for real but small: a stand-in built like llama.cpp's (a static
library that defines ``llama_process``, a main that calls it once for the prompt of ``--n-depth``
tokens and once per ``--n-gen`` token, CMake's ``link.txt`` beside it), relinked with the wrapper
and counted under callgrind. Needs valgrind, its headers and a C compiler (./install.sh --test)."""

import shutil
import subprocess
from pathlib import Path

import pytest

from pairbench.measure import cost

pytestmark = pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("cc") is None,
                                reason="valgrind or a C compiler is not installed (./install.sh --test)")

LIB = r"""
#include <stdint.h>
struct llama_context; struct llama_batch { int n_tokens; };
volatile long sink;
/* work proportional to the batch: WORK iterations a token */
int32_t llama_process(struct llama_context *ctx, int type, const struct llama_batch *b) {
    (void)ctx; (void)type;
    for (long i = 0; i < (long)b->n_tokens * WORK; i++) sink += i ^ (sink >> 3);
    return 0;
}
"""
MAIN = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
struct llama_context; struct llama_batch { int n_tokens; };
int32_t llama_process(struct llama_context *, int, const struct llama_batch *);
int main(int argc, char **argv) {
    int depth = 0, gen = 0;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--n-depth")) depth = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--n-gen")) gen = atoi(argv[i + 1]);
    }
    struct llama_batch prompt = {depth}, one = {1};
    if (depth) llama_process(NULL, 0, &prompt);
    for (int i = 0; i < gen; i++) llama_process(NULL, 0, &one);
    printf("[]\n");
    return 0;
}
"""


def _build(root: Path, work: int) -> Path:
    """A build tree shaped as llama.cpp's: build/bin/llama-bench, and the link command CMake wrote
    for it in build/tools/llama-bench/CMakeFiles/llama-bench.dir/link.txt."""
    tool = root / "build" / "tools" / "llama-bench"
    (tool / "CMakeFiles" / "llama-bench.dir").mkdir(parents=True)
    (root / "build" / "bin").mkdir()
    (tool / "lib.c").write_text(LIB)
    (tool / "main.c").write_text(MAIN)
    subprocess.run(["cc", "-O1", f"-DWORK={work}", "-c", "lib.c", "-o", "lib.o"], cwd=tool, check=True)
    subprocess.run(["ar", "rcs", "libfake.a", "lib.o"], cwd=tool, check=True)
    subprocess.run(["cc", "-O1", "-c", "main.c", "-o", "CMakeFiles/llama-bench.dir/main.o"], cwd=tool, check=True)
    link = "cc -O1 CMakeFiles/llama-bench.dir/main.o -o ../../bin/llama-bench libfake.a\n"
    (tool / "CMakeFiles" / "llama-bench.dir" / "link.txt").write_text(link)
    subprocess.run(link.split(), cwd=tool, check=True)
    return root / "build" / "bin" / "llama-bench"


def _count(binary: Path, work: Path, phases: tuple[str, ...]) -> cost.ArmCost:
    opts = cost.CostOptions(decode_tokens=3, cache_sim=True, timeout_s=300, phases=phases)
    return cost.run_llama_bench(binary=binary, model="m.gguf", opts=opts, collect="llama_process",
                                requests=[{"condition": "in40-out8", "input_tokens": 40}], work=work,
                                log=work / "tool.log", cwd=binary.parent)


def test_relinked_llama_bench_counts_the_decode_calls_only(tmp_path):
    binary = _build(tmp_path / "arm", 2000)
    got = _count(binary, tmp_path / "work", ("decode",))
    assert got.facts["counting"] == "wrapped"
    phases = got.conditions["in40-out8"]
    assert list(phases) == ["decode"]  # the prompt ran, not instrumented
    per = phases["decode"].per_token()["instructions"]
    assert 2000 * 3 < per < 2000 * 40  # a few instructions an iteration, one token a call
    # the arm's own binary is untouched: the relinked one lives in the work folder
    assert (tmp_path / "work" / "llama-bench-counted").is_file() and binary.is_file()


def test_relinked_with_prefill_counts_the_prompt_call_too_and_tokens_scale(tmp_path):
    binary = _build(tmp_path / "arm", 2000)
    got = _count(binary, tmp_path / "work", ("prefill", "decode"))
    pre, dec = got.conditions["in40-out8"]["prefill"], got.conditions["in40-out8"]["decode"]
    assert (pre.tokens, dec.tokens) == (40, 3)
    # the same work a token in one 40-token call as in three 1-token calls (within call overheads)
    assert abs(pre.per_token()["instructions"] / dec.per_token()["instructions"] - 1) < 0.05


def test_twice_the_work_reads_twice_the_instructions(tmp_path):
    small = _count(_build(tmp_path / "a", 2000), tmp_path / "work", ("decode",))
    large = _count(_build(tmp_path / "b", 4000), tmp_path / "work", ("decode",))
    ratio = (large.conditions["in40-out8"]["decode"].counts.instructions
             / small.conditions["in40-out8"]["decode"].counts.instructions)
    assert 1.9 < ratio < 2.1


def test_without_a_link_command_it_falls_back_to_toggle_collect_and_says_so(tmp_path):
    binary = _build(tmp_path / "arm", 2000)
    shutil.rmtree(tmp_path / "arm" / "build" / "tools" / "llama-bench" / "CMakeFiles")
    got = _count(binary, tmp_path / "work", ("decode",))
    assert got.facts["counting"] == "toggle-collect"
    assert "no CMake link command" in got.facts["relink"]
    assert set(got.conditions["in40-out8"]) == {"prefill", "decode"}  # everything instrumented anyway


def test_a_llama_bench_that_never_calls_the_function_itself_is_counted_the_slow_way(tmp_path):
    # main calls decode_batch(), which calls llama_process inside the same object: --wrap cannot reach it
    root = tmp_path / "arm"
    binary = _build(root, 2000)
    tool = root / "build" / "tools" / "llama-bench"
    lib = LIB + "int32_t decode_batch(const struct llama_batch *b) { return llama_process(0, 0, b); }\n"
    (tool / "lib.c").write_text(lib)
    (tool / "main.c").write_text(MAIN.replace("llama_process(NULL, 0, ", "decode_batch(").replace(
        "int32_t llama_process(struct llama_context *, int, const struct llama_batch *);",
        "int32_t decode_batch(const struct llama_batch *);"))
    subprocess.run(["cc", "-O0", "-DWORK=2000", "-c", "lib.c", "-o", "lib.o"], cwd=tool, check=True)
    subprocess.run(["ar", "rcs", "libfake.a", "lib.o"], cwd=tool, check=True)
    subprocess.run(["cc", "-O0", "-c", "main.c", "-o", "CMakeFiles/llama-bench.dir/main.o"], cwd=tool, check=True)
    subprocess.run((tool / "CMakeFiles" / "llama-bench.dir" / "link.txt").read_text().split(), cwd=tool, check=True)
    got = _count(binary, tmp_path / "work", ("decode",))
    assert got.facts["counting"] == "toggle-collect" and "never called llama_process" in got.facts["relink"]
    assert got.conditions["in40-out8"]["decode"].counts.instructions > 0
