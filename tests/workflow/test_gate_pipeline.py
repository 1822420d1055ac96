"""pairbench in an engine's CI, from the outside: arms from git refs, `snakemake gate` and `python -m pairbench gate`.

One temporary git repository (a copy of this checkout, committed) with two branches besides main:
``docs`` changes only the README (the engine is main's: an A/A), and ``slow`` makes the embedded
engine's decode run its forward pass ten times per token (real work, about ten times slower). Two
runs of the embedded engine's tiny model share every assertion below:

- ``aa`` (main against docs, 2 rounds: too short to tell): ``snakemake gate`` passes, the CLI exits 0
  and writes a schema-valid gate.json, a Markdown summary and JUnit XML naming both shas; published
  again under a policy that fails an inconclusive result (nothing re-measured), it exits 2; a
  tampered bundle exits 3; a moved branch exits 3 and reruns only its own arm's export;
- ``slow`` (main against slow, 6 rounds): ``snakemake gate`` fails naming the regression, and the
  CLI exits 1.
"""

from __future__ import annotations

import json
import os
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

DECODE = "logits = self.model.decode(tokens, positions, slots)  # (B, vocab)"
SLOW = ("for _ in range(10):  # a regression on purpose: the same forward pass, ten times\n"
        "                logits = self.model.decode(tokens, positions, slots)  # (B, vocab)")
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env={**os.environ, **GIT_ENV}, check=True, capture_output=True,
                          text=True).stdout.strip()


def config(label: str, head: str, rounds: int, **extra) -> dict:
    return {"label": label, "model": "tiny", "allow_external": True,
            "arms": {"base": {"source": {"git": ".", "ref": "main"}}, "head": {"source": {"git": ".", "ref": head}}},
            "lengths": [400], "output_tokens": 16, "rounds": rounds, "seed": 0,
            "stats": {"metrics": ["decode_tok_s"], "noise": 0.1}, "gate": {"fail_slower_than": 0.1},
            "validate": {"cases": ["token_counts", "matches_baseline"], "retries": 0}, **extra}


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """This checkout's files, committed on main, with the branches docs and slow; main checked out."""
    work = tmp_path_factory.mktemp("gate") / "repo"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, files):
        if rel.split("/")[0] in ("resources", "results", "logs", ".snakemake") or not (REPO / rel).is_file():
            continue
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, work / rel)
    git(work, "init", "-q", "-b", "main")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "base")
    git(work, "checkout", "-q", "-b", "docs")
    (work / "README.md").write_text((work / "README.md").read_text() + "\nA change that is not the engine's.\n")
    git(work, "commit", "-q", "-am", "docs only")
    git(work, "checkout", "-q", "-b", "slow", "main")
    scheduler = work / "engine" / "scheduler.py"
    text = scheduler.read_text()
    assert text.count(DECODE) == 1, "engine/scheduler.py's decode call moved: update this test's regression"
    scheduler.write_text(text.replace(DECODE, SLOW))
    git(work, "commit", "-q", "-am", "decode ten times")
    git(work, "checkout", "-q", "main")
    for name, cfg in (("aa", config("aa", "docs", 2)), ("slow", config("slow", "slow", 6))):
        (work.parent / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    return work


def snakemake(work: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=work, env=env, capture_output=True,
                          text=True, timeout=1200)


def gate_cli(work: Path, run: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{work / 'workflow'}:{work}"}
    return subprocess.run([sys.executable, "-m", "pairbench", "gate", f"results/{run}", *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)


def cfg_file(work: Path, name: str) -> str:
    return str(work.parent / f"{name}.yaml")


@pytest.fixture(scope="module")
def aa(repo):
    proc = snakemake(repo, "gate", "--cores", "2", "--configfile", cfg_file(repo, "aa"))
    assert proc.returncode == 0, proc.stderr[-6000:]
    return repo


@pytest.fixture(scope="module")
def slow(repo):
    proc = snakemake(repo, "gate", "--cores", "2", "--configfile", cfg_file(repo, "slow"))
    return repo, proc


def test_an_a_a_of_two_commits_exits_0_with_its_shas_in_every_view(aa, tmp_path):
    res = aa / "results" / "aa"
    base, docs = git(aa, "rev-parse", "main"), git(aa, "rev-parse", "docs")
    for arm, ref, sha in (("base", "main", base), ("head", "docs", docs)):
        src = read_artifact(res / "source" / f"{arm}.json", "source")
        assert (src["git"]["ref"], src["git"]["ref_name"], src["git"]["commit"]) == (ref, f"refs/heads/{ref}", sha)
    assert read_artifact(res / "gate" / "gate.json", "gate")["exit_code"] == 0  # `snakemake gate` passed
    md, junit, out = tmp_path / "summary.md", tmp_path / "junit.xml", tmp_path / "gate.json"
    proc = gate_cli(aa, "aa", "--configfile", cfg_file(aa, "aa"), "--markdown", str(md), "--junit", str(junit),
                    "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("pairbench gate: pass (exit 0): no slowdown beyond 10% shown, but 1 of 1 gated "
                                  "cells could not rule out a slowdown beyond 10%: head decode_tok_s at in400-out16")
    record = read_artifact(out, "gate")  # schema-checked
    published = read_artifact(res / "publish" / "gate.json", "gate")
    assert record == published and record["arms"]["head"]["commit"] == docs
    assert [c["outcome"] for c in record["cells"]] == ["inconclusive"]  # 2 rounds: no interval is bounded
    text = md.read_text()
    assert f"| base | baseline | embedded | git | `main` | `{base[:12]}` | — |" in text
    assert f"| head | candidate | embedded | git | `docs` | `{docs[:12]}` | — |" in text
    assert "Full report: `results/aa/publish/README.md`" in text and text == proc.stdout + "\n"  # appended, a blank line after
    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("1", "0", "0")
    # the bundle verifies offline, gate.json included
    check = subprocess.run([sys.executable, "-m", "pairbench", "verify", str(res / "publish")], cwd=aa,
                           env={**os.environ, "PYTHONPATH": f"{aa / 'workflow'}:{aa}"}, capture_output=True, text=True)
    assert check.returncode == 0 and "gate v1" in check.stdout, check.stdout + check.stderr


def test_a_policy_that_fails_inconclusive_exits_2_without_measuring_again(aa):
    res = aa / "results" / "aa"
    measured = {p: p.stat().st_mtime_ns for p in (res / "measure").glob("*.json")}
    policy = "gate={fail_slower_than: 0.1, inconclusive: fail}"
    proc = snakemake(aa, "--cores", "1", "--configfile", cfg_file(aa, "aa"), "--config", policy)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert {p: p.stat().st_mtime_ns for p in (res / "measure").glob("*.json")} == measured
    gate = gate_cli(aa, "aa", "--configfile", cfg_file(aa, "aa"), "--config", policy)
    assert gate.returncode == 2, gate.stderr
    assert gate.stderr.strip().endswith("the policy fails an inconclusive result")
    # run with the config it was published under no longer: the run is of another config
    stale = gate_cli(aa, "aa", "--configfile", cfg_file(aa, "aa"))
    assert stale.returncode == 3 and "was made from another config" in stale.stderr
    snakemake(aa, "--cores", "1", "--configfile", cfg_file(aa, "aa"))  # back to the module's policy


def test_a_tampered_bundle_exits_3(aa, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(aa / "results" / "aa", copy / "results" / "aa")
    shutil.copytree(aa / "workflow", copy / "workflow")
    paired = copy / "results" / "aa" / "publish" / "tables" / "paired.csv"
    paired.write_text(paired.read_text().replace("inconclusive", "faster"))
    proc = gate_cli(copy, "aa")
    assert proc.returncode == 3
    assert proc.stderr.startswith("pairbench gate: invalid (exit 3): the run is not valid: the bundle "
                                  "results/aa/publish does not verify: tables/paired.csv: sha256 mismatch")
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
    assert proc.returncode == 3 and "gate.json: cells[0] (head decode_tok_s at in400-out16): ci_low is 0.99" in proc.stderr


def test_a_moved_branch_exits_3_and_re_exports_only_its_arm(aa):
    git(aa, "checkout", "-q", "docs")
    (aa / "README.md").write_text((aa / "README.md").read_text() + "Moved.\n")
    git(aa, "commit", "-q", "-am", "docs moved")
    git(aa, "checkout", "-q", "main")
    proc = gate_cli(aa, "aa", "--configfile", cfg_file(aa, "aa"))
    assert proc.returncode == 3
    assert "arms.head.source: 'docs' names " in proc.stderr and "but the run measured" in proc.stderr
    dry = snakemake(aa, "-n", "--configfile", cfg_file(aa, "aa"))
    jobs = dry.stdout + dry.stderr
    assert "wildcards: arm=head" in jobs and "wildcards: arm=base" not in jobs
    git(aa, "branch", "-f", "docs", "docs~1")  # put it back for the other tests
    assert gate_cli(aa, "aa", "--configfile", cfg_file(aa, "aa")).returncode == 0


def test_a_missing_ref_and_a_dirty_checkout_exit_3_naming_them(aa, tmp_path):
    cfg = yaml.safe_load(Path(cfg_file(aa, "aa")).read_text())
    cfg["arms"]["head"]["source"]["ref"] = "no-such-branch"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    proc = gate_cli(aa, "aa", "--configfile", str(bad))
    assert proc.returncode == 3 and "'no-such-branch' does not resolve to a commit in" in proc.stderr
    cfg["label"] = "never-ran"  # named before what the run lacks: the pipeline stopped at it
    bad.write_text(yaml.safe_dump(cfg))
    proc = gate_cli(aa, "never-ran", "--configfile", str(bad))
    assert proc.returncode == 3 and proc.stderr.startswith(
        "pairbench gate: invalid (exit 3): the run is not valid: arms.head.source.ref: 'no-such-branch' does not "
        "resolve to a commit in"), proc.stderr
    cfg["label"] = "aa"
    cfg["arms"]["head"]["source"]["ref"] = "HEAD"  # the checkout of main
    bad.write_text(yaml.safe_dump(cfg))
    proc = gate_cli(aa, "aa", "--configfile", str(bad))
    assert proc.returncode == 3 and "resolve 'main' and 'HEAD' to the same commit" in proc.stderr
    readme = aa / "README.md"
    before = readme.read_text()
    readme.write_text(before + "uncommitted\n")
    try:
        proc = gate_cli(aa, "aa", "--configfile", str(bad))
        assert proc.returncode == 3 and "uncommitted changes to 1 tracked file(s) (README.md)" in proc.stderr
    finally:
        readme.write_text(before)


def test_a_real_slowdown_on_a_branch_exits_1(slow):
    repo, proc = slow
    assert proc.returncode != 0
    assert "gate FAILED: pairbench gate: regression (exit 1): a slowdown beyond 10%: head decode_tok_s at " \
           "in400-out16 is " in proc.stderr, proc.stderr[-6000:]
    assert (repo / "logs" / "slow" / "gate" / "summary.md").read_text().startswith(
        "## pairbench gate `slow`: regression (exit 1)")
    assert not (repo / "results" / "slow" / "gate" / "gate.json").exists()  # written only by a pass
    cli = gate_cli(repo, "slow", "--configfile", cfg_file(repo, "slow"))
    assert cli.returncode == 1, cli.stderr
    record = read_artifact(repo / "results" / "slow" / "publish" / "gate.json", "gate")
    [cell] = record["cells"]
    assert (cell["outcome"], cell["verdict"], cell["n_pairs"]) == ("regression", "slower", 6)
    assert cell["ci_high"] < 0.9 and record["arms"]["head"]["commit"] == git(repo, "rev-parse", "slow")
    junit = ET.fromstring((repo / "logs" / "slow" / "gate" / "junit.xml").read_text()).find("testsuite")
    assert junit.get("failures") == "1" and junit.find("testcase/failure").get("type") == "regression"
