"""pairbench in an engine's CI, from the outside: arms from git refs, `snakemake gate` and the exit
status of `python -m pairbench gate`, run as subprocesses.

The engine under test is the fake engine (tests/fakes/engine: simulated prefill and decode time, so a
run takes seconds, not a model's minutes), committed as ``engine/`` of a temporary git repository,
the layout of this repository's own embedded engine. Besides ``main`` it has two branches:

- ``change`` makes decode twice as slow for prompts under 440 tokens, twice as fast from 440 to 519,
  and leaves longer prompts alone: one run of its three lengths has a slower, a faster and an
  equivalent condition;
- ``docs`` changes only the README (the engine is main's: an A/A).

The pipeline runs in a copy of this checkout, its arms made by the CI shorthand
``refs: {git: <that repository>, base: main, head: ...}``. Two measured runs share every assertion:

- ``pr`` (main against change, 8 rounds, lengths 400/480/560): ``snakemake gate`` fails naming the
  regression and the CLI exits 1; published again under a policy that gates the faster and the
  equivalent condition (nothing re-measured), both exit 0;
- ``aa`` (main against docs, 2 rounds: too short to tell): exits 0 saying what it could not rule out;
  under a policy that fails an inconclusive result it exits 2; a tampered bundle, a bad ref, two refs
  of one commit, a dirty checkout and a moved branch exit 3, each named.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from pairbench.core.artifacts import read_artifact, sha256_file

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
# the change under test, in the fake's decode loops (streamed and not)
SCALE = '''

def decode_scale(prompt_n: int) -> float:
    """The change under test: decode 2x slower under 440 prompt tokens, 2x faster up to 519, unchanged above."""
    return 2.0 if prompt_n < 440 else 0.5 if prompt_n < 520 else 1.0
'''
SLEEPS = {"                for _ in out:\n                    time.sleep(opts.decode_ms * 1e-3)\n":
          "                for _ in out:\n                    time.sleep(opts.decode_ms * 1e-3 * decode_scale(len(prompt)))\n",
          "            time.sleep(opts.decode_ms * 1e-3)\n            piece =":
          "            time.sleep(opts.decode_ms * 1e-3 * decode_scale(prompt_n))\n            piece ="}
SLOWER, FASTER, SAME = "in400-out8", "in480-out8", "in560-out8"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env={**os.environ, **GIT_ENV}, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(scope="module")
def engines(tmp_path_factory) -> Path:
    """A git repository whose engine/ is the fake engine: main, change and docs; main checked out."""
    repo = tmp_path_factory.mktemp("engines") / "fake-engine"
    shutil.copytree(REPO / "tests" / "fakes" / "engine", repo / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "README.md").write_text("A fake engine in its own repository.\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "checkout", "-q", "-b", "change")
    server = repo / "engine" / "server.py"
    text = server.read_text()
    for old, new in SLEEPS.items():
        assert text.count(old) == 1, "the fake engine's decode loop moved: update this test's change"
        text = text.replace(old, new)
    server.write_text(text + SCALE)
    git(repo, "commit", "-q", "-am", "decode speed by prompt length")
    git(repo, "checkout", "-q", "-b", "docs", "main")
    (repo / "README.md").write_text("A fake engine in its own repository. Docs only.\n")
    git(repo, "commit", "-q", "-am", "docs only")
    git(repo, "checkout", "-q", "main")
    return repo


def config(label: str, engines: Path, head: str, rounds: int, lengths: list[int]) -> dict:
    return {"label": label, "model": "tiny", "allow_external": True,
            "refs": {"git": str(engines), "base": "main", "head": head,
                     "arm": {"env": {"FAKE_ENGINE_DECODE_MS": "10"}}},
            "lengths": lengths, "output_tokens": 8, "rounds": rounds, "seed": 0,
            "stats": {"metrics": ["decode_tok_s"], "noise": 0.1}, "gate": {"fail_slower_than": 0.1},
            "validate": {"cases": ["token_counts"]}}


@pytest.fixture(scope="module")
def work(tmp_path_factory, engines) -> Path:
    """A copy of this checkout (tracked and untracked-but-not-ignored files) with the two configs beside it."""
    work = tmp_path_factory.mktemp("gate") / "pairbench"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, files):
        if rel.split("/")[0] in ("resources", "results", "logs", ".snakemake") or not (REPO / rel).is_file():
            continue
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, work / rel)
    for name, cfg in (("pr", config("pr", engines, "change", 8, [400, 480, 560])),
                      ("aa", config("aa", engines, "docs", 2, [400]))):
        (work.parent / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    return work


def snakemake(work: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=1500)


def gate_cli(work: Path, run: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{work / 'workflow'}:{work}"}
    return subprocess.run([sys.executable, "-m", "pairbench", "gate", f"results/{run}", *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)


def cfg(work: Path, name: str) -> str:
    return str(work.parent / f"{name}.yaml")


def measured(work: Path, run: str) -> dict:
    return {p.name: p.stat().st_mtime_ns for p in (work / "results" / run / "measure").glob("*.json")}


@pytest.fixture(scope="module")
def pr(work):
    return work, snakemake(work, "gate", "--configfile", cfg(work, "pr"))


@pytest.fixture(scope="module")
def aa(work):
    proc = snakemake(work, "gate", "--configfile", cfg(work, "aa"))
    assert proc.returncode == 0, proc.stderr[-6000:]
    return work


def test_a_slowdown_committed_on_a_branch_fails_snakemake_gate_and_exits_1(pr, engines, tmp_path):
    work, proc = pr
    assert proc.returncode != 0
    assert f"gate FAILED: pairbench gate: regression (exit 1): a slowdown beyond 10%: head decode_tok_s at {SLOWER} " \
           "is " in proc.stderr, proc.stderr[-6000:]
    assert (work / "logs" / "pr" / "gate" / "summary.md").read_text().startswith(
        "## pairbench gate `pr`: regression (exit 1)")
    assert not (work / "results" / "pr" / "gate" / "gate.json").exists()  # written only by a pass
    out, junit = tmp_path / "gate.json", tmp_path / "junit.xml"
    cli = gate_cli(work, "pr", "--configfile", cfg(work, "pr"), "--json", str(out), "--junit", str(junit))
    assert cli.returncode == 1, cli.stderr
    assert cli.stderr.startswith("pairbench gate: regression (exit 1): a slowdown beyond 10%: ")
    record = read_artifact(out, "gate")  # schema-checked
    assert record == read_artifact(work / "results" / "pr" / "publish" / "gate.json", "gate")
    cells = {c["condition"]: c for c in record["cells"]}
    assert {k: (c["verdict"], c["outcome"], c["n_pairs"]) for k, c in cells.items()} == {
        SLOWER: ("slower", "regression", 8), FASTER: ("faster", "pass", 8), SAME: ("equivalent", "pass", 8)}
    assert cells[SLOWER]["ci_high"] < 0.9 and cells[FASTER]["ci_low"] > 1.1
    assert {a: record["arms"][a]["commit"] for a in ("base", "head")} == {
        "base": git(engines, "rev-parse", "main"), "head": git(engines, "rev-parse", "change")}
    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "0")
    assert suite.find("testcase/failure").get("type") == "regression"
    assert f"| head | candidate | embedded | git | `change` | `{git(engines, 'rev-parse', 'change')[:12]}` |" in cli.stdout


def test_the_faster_and_the_equivalent_condition_pass_exit_0_without_measuring_again(pr):
    work, _ = pr
    before = measured(work, "pr")
    policy = f"gate={{fail_slower_than: 0.1, conditions: [{FASTER}, {SAME}]}}"
    proc = snakemake(work, "gate", "--configfile", cfg(work, "pr"), "--config", policy)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert measured(work, "pr") == before  # the policy re-publishes, it re-measures nothing
    assert read_artifact(work / "results" / "pr" / "gate" / "gate.json", "gate")["exit_code"] == 0
    cli = gate_cli(work, "pr", "--configfile", cfg(work, "pr"), "--config", policy)
    assert cli.returncode == 0, cli.stderr
    assert cli.stderr.strip() == "pairbench gate: pass (exit 0): all 2 gated cells rule out a slowdown beyond 10%"
    record = read_artifact(work / "results" / "pr" / "publish" / "gate.json", "gate")
    assert [(c["condition"], c["verdict"]) for c in record["cells"]] == [(FASTER, "faster"), (SAME, "equivalent")]
    # the CLI with the config the run was published under no longer: a run of another config
    stale = gate_cli(work, "pr", "--configfile", cfg(work, "pr"))
    assert stale.returncode == 3 and "was made from another config" in stale.stderr, stale.stderr


def test_an_a_a_too_short_to_tell_exits_0_saying_what_it_could_not_rule_out(aa, tmp_path):
    md = tmp_path / "summary.md"
    proc = gate_cli(aa, "aa", "--configfile", cfg(aa, "aa"), "--markdown", str(md))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("pairbench gate: pass (exit 0): no slowdown beyond 10% shown, but 1 of 1 gated "
                                  f"cells could not rule out a slowdown beyond 10%: head decode_tok_s at {SLOWER}")
    assert "Full report: `results/aa/publish/README.md`" in md.read_text() and md.read_text() == proc.stdout + "\n"
    assert read_artifact(aa / "results" / "aa" / "gate" / "gate.json", "gate")["exit_code"] == 0  # `snakemake gate`


def test_a_tampered_bundle_exits_3(aa, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(aa / "results" / "aa", copy / "results" / "aa")
    shutil.copytree(aa / "workflow", copy / "workflow")
    paired = copy / "results" / "aa" / "publish" / "tables" / "paired.csv"
    paired.write_text(paired.read_text().replace("inconclusive", "faster"))
    proc = gate_cli(copy, "aa")
    assert proc.returncode == 3
    assert proc.stderr.startswith("pairbench gate: invalid (exit 3): the run is not valid: the bundle "
                                  "results/aa/publish does not verify: tables/paired.csv: sha256 mismatch"), proc.stderr
    # a forged decision whose MANIFEST entry was made to match is caught by recomputing it
    shutil.copy2(aa / "results" / "aa" / "publish" / "tables" / "paired.csv", paired)
    gate = copy / "results" / "aa" / "publish" / "gate.json"
    forged = json.loads(gate.read_text())
    forged["cells"][0]["ci_low"] = 0.99
    gate.write_text(json.dumps(forged, indent=2, sort_keys=True) + "\n")
    manifest = copy / "results" / "aa" / "publish" / "MANIFEST.json"
    m = json.loads(manifest.read_text())
    for entry in m["files"]:
        if entry["path"] == "gate.json":
            entry.update(sha256=sha256_file(gate), size_bytes=gate.stat().st_size)
    manifest.write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
    proc = gate_cli(copy, "aa")
    assert proc.returncode == 3 and f"gate.json: cells[0] (head decode_tok_s at {SLOWER}): ci_low is 0.99" in proc.stderr


def test_a_bad_ref_two_refs_of_one_commit_and_a_dirty_checkout_exit_3_naming_them(aa, engines):
    proc = gate_cli(aa, "aa", "--configfile", cfg(aa, "aa"), "--config", "refs={head: no-such-branch}")
    assert proc.returncode == 3 and proc.stderr.startswith(
        "pairbench gate: invalid (exit 3): the run is not valid: arms.head.source.ref: 'no-such-branch' does not "
        "resolve to a commit in"), proc.stderr
    # named before what the run lacks: the pipeline stops at it, so a CI job's run never started
    proc = gate_cli(aa, "never-ran", "--configfile", cfg(aa, "aa"), "--config", "label=never-ran",
                    "--config", "refs={head: no-such-branch}")
    assert proc.returncode == 3 and "arms.head.source.ref: 'no-such-branch' does not resolve" in proc.stderr
    proc = gate_cli(aa, "aa", "--configfile", cfg(aa, "aa"), "--config", "refs={head: HEAD}")  # main checked out
    assert proc.returncode == 3 and "resolve 'main' and 'HEAD' to the same commit" in proc.stderr, proc.stderr
    readme = engines / "README.md"
    before = readme.read_text()
    readme.write_text(before + "uncommitted\n")
    try:
        proc = gate_cli(aa, "aa", "--configfile", cfg(aa, "aa"))
        assert proc.returncode == 3 and "arms.base.source" in proc.stderr
        assert "uncommitted changes to 1 tracked file(s) (README.md)" in proc.stderr, proc.stderr
    finally:
        readme.write_text(before)
    assert gate_cli(aa, "aa", "--configfile", cfg(aa, "aa")).returncode == 0


def test_a_moved_branch_exits_3_and_re_exports_only_its_arm(aa, engines):
    git(engines, "checkout", "-q", "docs")
    (engines / "README.md").write_text("Moved.\n")
    git(engines, "commit", "-q", "-am", "docs moved")
    git(engines, "checkout", "-q", "main")
    try:
        proc = gate_cli(aa, "aa", "--configfile", cfg(aa, "aa"))
        assert proc.returncode == 3
        assert "arms.head.source: 'docs' names " in proc.stderr and "but the run measured" in proc.stderr, proc.stderr
        dry = snakemake(aa, "-n", "--configfile", cfg(aa, "aa"))
        exports = re.findall(r"rule source:\n(?:    .*\n)*?    wildcards: arm=(\w+)", dry.stdout + dry.stderr)
        assert exports == ["head"], dry.stdout[-4000:]  # every warmup reruns after a build (it reads them all)
    finally:
        git(engines, "branch", "-f", "docs", "docs~1")
    assert gate_cli(aa, "aa", "--configfile", cfg(aa, "aa")).returncode == 0


def test_a_policy_that_fails_inconclusive_exits_2_on_a_run_too_short_to_tell(aa):
    """Last: it publishes the A/A again under another policy."""
    before = measured(aa, "aa")
    policy = "gate={fail_slower_than: 0.1, inconclusive: fail}"
    proc = snakemake(aa, "--configfile", cfg(aa, "aa"), "--config", policy)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert measured(aa, "aa") == before  # the policy re-publishes, it re-measures nothing
    proc = gate_cli(aa, "aa", "--configfile", cfg(aa, "aa"), "--config", policy)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().endswith("the policy fails an inconclusive result")
    assert gate_cli(aa, "aa").returncode == 2  # without a config, the policy the run published applies
