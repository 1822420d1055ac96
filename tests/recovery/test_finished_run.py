"""One whole pipeline run on the fake engine, then everything a user does with a finished run.

The run (tests/recovery/config/retry.yaml: ``retries: 1``) has the engine server of visit
r02-candidate SIGKILLed in the middle of its first attempt; Snakemake re-attempts the visit and the
run completes. Then, in order:

1. the retry is recorded (attempt 2) and disclosed (measurements.csv, summary.json, report page);
2. the audit passes on the real run, and fails naming the file after a flipped byte or a deleted field;
3. ``snakemake --report report.html`` opens in headless Chromium with the verdict table rendered;
4. rerunning one stage: one visit by its path, a rule with ``-R``, and a statistics parameter
   change each rerun only that stage and what follows; everything upstream stays byte-identical.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from pairbench.integrity import recovery
from pairbench.core.artifacts import read_artifact
from tests.recovery._helpers import REPO, file_has, make_workdir, snapshot, wait_until

pytestmark = pytest.mark.slow

CFG = "--configfile=tests/recovery/config/retry.yaml"  # "=": --configfile takes several values
VISITS = ["r01-baseline", "r01-candidate", "r02-candidate", "r02-baseline"]
DOWNSTREAM_OF_STATS = {"stats", "landing", "plots", "provenance", "publish", "audit", "all"}
# A redone validation also re-reads every visit's chain of retries (and retires what left it).
DOWNSTREAM_OF_VALIDATION = DOWNSTREAM_OF_STATS | {"retire"}


def job_counts(stdout: str) -> dict[str, int]:
    m = re.search(r"Job stats:\njob\s+count\n[-\s]+\n(.*?)\n\n", stdout, re.S)
    assert m, f"no Job stats table in:\n{stdout[-2000:]}"
    return {name: int(n) for name, n in (line.split() for line in m.group(1).splitlines()) if name != "total"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    wd = make_workdir(tmp_path_factory.mktemp("finished") / "repo")
    smk = wd.start_snakemake("--cores", "1", CFG, log_name="run.log")
    console = wd.root / "run.log"
    try:
        wait_until(lambda: file_has(console, "[measure] r02-candidate arm=candidate round=2 condition=in400-out12: 1/12 tokens"),
                   timeout=500, what="visit r02-candidate to stream")
        info = json.loads(recovery.pid_file(wd.run / "private", "measure").read_text())
        assert info["owner"] == "measure r02-candidate"
        os.kill(info["pid"], signal.SIGKILL)
        assert smk.wait(timeout=600) == 0, console.read_text()[-4000:]
        yield wd
    finally:
        left = wd.cleanup()
        assert not left, f"processes left running: {left}"


def test_retry_is_recorded_and_disclosed(run):
    console = (run.root / "run.log").read_text()
    assert re.search(r"measure r02-candidate FAILED: visit r02-candidate \(arm candidate, round 2, condition in4[04]0-out12, "
                     r"attempt 1\): engine fault: ", console)
    assert "r02-candidate arm=candidate round=2 condition=in400-out12: request sent (attempt 2)" in console
    for v in VISITS:
        body = read_artifact(run.run / "measure" / f"{v}.json", "measure")
        want = 2 if v == "r02-candidate" else 1
        assert body["attempt"] == want and {r["attempt"] for r in body["records"]} == {want}
    table = pd.read_csv(run.run / "tables" / "measurements.csv")
    retried = table[table["attempt"] > 1]
    assert set(zip(retried["round"], retried["arm"])) == {(2, "candidate")}
    summary = read_artifact(run.run / "stats" / "summary.json", "summary")["comparisons"]["candidate"]
    assert {(r["round"], r["arm"], r["attempt"]) for r in summary["disclosures"]["retries"]} == {(2, "candidate", 2)}
    landing = (run.run / "report" / "landing.rst").read_text()
    # one row per re-measured record: round, arm, condition, attempt, validation retry (none), outcome
    assert "Retries (attempt > 1" in landing
    assert re.search(r"\* - 2\n\s+- candidate\n\s+- in4[04]0-out12\n\s+- 2\n\s+- 0\n\s+- used", landing), landing


def audit_cli(run_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow")}
    return subprocess.run([sys.executable, "-m", "pairbench.integrity.audit", str(run_dir)], capture_output=True,
                          text=True, env=env, timeout=120)


def test_audit_passes_then_names_tampered_artifacts(run, tmp_path):
    assert read_artifact(run.run / "audit.json", "audit")["ok"] is True
    ok = audit_cli(run.run)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "audit OK" in ok.stdout

    copy = tmp_path / "recovery"
    shutil.copytree(run.run, copy, symlinks=True)
    # flip one byte of a timing inside a visit: still valid JSON, still schema-valid
    visit = copy / "measure" / "r01-baseline.json"
    data = bytearray(visit.read_bytes())
    i = re.search(rb'"e2e_ms": \d', bytes(data)).end() - 1
    data[i] = ord("1") if data[i] != ord("1") else ord("2")
    visit.write_bytes(bytes(data))
    # delete a required field of a validation
    val = copy / "validate" / "r01-candidate.json"
    body = json.loads(val.read_text())
    del body["records"]
    val.write_text(json.dumps(body))

    bad = audit_cli(copy)
    assert bad.returncode == 1 and "audit FAILED" in bad.stdout
    assert "measure/r01-baseline.json: [provenance] sha256" in bad.stderr
    assert "measure/r01-baseline.json was modified" in bad.stderr  # validate/r01-baseline's broken link
    assert re.search(r"validate/r01-candidate\.json: \[schema\] .*records", bad.stderr)


class DomTables(HTMLParser):
    """Tables of a DOM dump: {class: [[cell text, ...] per row]} (script text is never parsed as markup)."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.current = None
        self.text = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.current = self.tables.setdefault(attrs.get("class") or "", [])
        elif tag == "tr" and self.current is not None:
            self.current.append([])
        elif tag in ("td", "th") and self.current is not None:
            self.current[-1].append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self.current = None

    def handle_data(self, data):
        self.text.append(data)
        if self.current and self.current[-1]:
            self.current[-1][-1] += data.strip()


def chromium(*args: str, user_dir: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        msg = "chromium is not installed (apt-get install -y chromium)"
        pytest.skip(msg)
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--no-first-run", f"--user-data-dir={user_dir}", "--virtual-time-budget=5000", *args],
                          capture_output=True, text=True, timeout=120)


def test_html_report_shows_the_verdict_table_in_a_real_browser(run, tmp_path):
    report = run.root / "report.html"
    run.snakemake("--report", str(report), CFG)
    shot = tmp_path / "report.png"
    dom = chromium("--dump-dom", report.as_uri(), user_dir=tmp_path / "chrome")
    assert dom.returncode == 0, dom.stderr[-2000:]
    parser = DomTables()
    parser.feed(dom.stdout)
    tables = {cls: rows for cls, rows in parser.tables.items()}
    verdicts = next((rows for cls, rows in tables.items() if "pairbench-verdicts" in cls), None)
    assert verdicts, f"no rendered verdict table; tables: {list(tables)}"
    assert verdicts[0] == ["candidate", "condition", "metric", "ratio", "interval", "verdict"]
    paired = pd.read_csv(run.run / "tables" / "paired.csv")
    assert len(verdicts) - 1 == (paired["role"] == "primary").sum() > 0  # secondary metrics are not tested
    allowed = {"faster", "slower", "equivalent", "inconclusive"}
    assert {row[-1] for row in verdicts[1:]} <= allowed
    retries = next(rows for cls, rows in tables.items() if "pairbench-retries" in cls)
    # round, arm, condition, attempt, validation retry, outcome: both conditions of the re-attempted visit
    assert retries[1:] == [["2", "candidate", "in400-out12", "2", "0", "used"],
                           ["2", "candidate", "in440-out12", "2", "0", "used"]]
    text = " ".join(parser.text)
    for category in ("1 Summary", "2 Measurements", "3 Plots", "4 Audit"):
        assert category in text
    assert "System Message" not in text  # no docutils error rendered into the page
    shot_run = chromium(f"--screenshot={shot}", "--window-size=1400,1000", report.as_uri(),
                        user_dir=tmp_path / "chrome2")
    assert shot_run.returncode == 0 and shot.stat().st_size > 20_000  # a real page, not a blank one


def upstream(wd) -> dict:
    """Snapshot of everything that must never rerun when one visit/validation/statistic is redone."""
    snap = {}
    for sub in ("plan.json", "source", "build", "fixtures", "warmup", "private/prompts"):
        p = wd.run / sub
        items = snapshot(p) if p.is_dir() else {"": (p.read_bytes(), p.stat().st_mtime_ns)}
        snap.update({f"{sub}/{k}": v for k, v in items.items()})
    return snap


def test_rerun_one_stage(run):
    wd = run
    before = upstream(wd)
    visits = {v: snapshot(wd.run / "measure")[f"{v}.json"] for v in VISITS}

    # One visit by its output path: that visit, the validations reading its outputs, and what follows.
    target = "results/recovery/measure/r01-candidate.json"
    out = wd.snakemake("--cores", "1", CFG, "--forcerun", target)
    counts = job_counts(out.stdout + out.stderr)
    assert counts.pop("measure") == 1 and counts.pop("validate") == 1, out.stderr[-3000:]
    assert set(counts) == DOWNSTREAM_OF_VALIDATION
    for v in VISITS:
        same = snapshot(wd.run / "measure")[f"{v}.json"] == visits[v]
        assert same == (v != "r01-candidate"), v
    assert upstream(wd) == before

    # One validation by its path, dry-run: only it and what follows.
    dry = wd.snakemake("--cores", "1", CFG, "-n", "--forcerun", "results/recovery/validate/r02-baseline.json")
    assert job_counts(dry.stdout + dry.stderr) == {"validate": 1, **{r: 1 for r in DOWNSTREAM_OF_VALIDATION}}

    # A whole rule with -R: every validation and what follows, nothing upstream.
    dry = wd.snakemake("--cores", "1", CFG, "-n", "-R", "validate")
    assert job_counts(dry.stdout + dry.stderr) == {"validate": 4, **{r: 1 for r in DOWNSTREAM_OF_VALIDATION}}

    # Only a statistics parameter changes: statistics and what follows rerun (params trigger).
    visits = {v: snapshot(wd.run / "measure")[f"{v}.json"] for v in VISITS}
    changed = wd.snakemake("--cores", "1", "--configfile=tests/recovery/config/retry_alpha.yaml")
    assert job_counts(changed.stdout + changed.stderr) == {r: 1 for r in DOWNSTREAM_OF_STATS}, changed.stderr[-3000:]
    assert read_artifact(wd.run / "stats" / "summary.json", "summary")["params"]["alpha"] == 0.1
    assert {v: snapshot(wd.run / "measure")[f"{v}.json"] for v in VISITS} == visits
    assert upstream(wd) == before
    assert read_artifact(wd.run / "audit.json", "audit")["ok"] is True
