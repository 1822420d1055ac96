"""Unit tests of pairbench.integrity.provenance and pairbench.integrity.audit on a small synthetic run folder.

The run folder is built with test-only artifact kinds (schemas in fixtures/schemas/), so these tests
do not depend on the pipeline's own schemas; tests/recovery/test_audit_pipeline.py runs the same
checks on a real pipeline run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pairbench.core import artifacts
from pairbench.integrity import audit
from pairbench.integrity import provenance
from pairbench.arms import source

HERE = Path(__file__).resolve().parent
REAL_SCHEMAS = HERE.parents[1] / "workflow" / "schemas"


@pytest.fixture
def schema_dir(tmp_path, monkeypatch):
    d = tmp_path / "schemas"
    shutil.copytree(HERE / "fixtures" / "schemas", d)
    for kind in ("provenance", "audit"):
        shutil.copy(REAL_SCHEMAS / f"{kind}.schema.json", d)
    monkeypatch.setattr(artifacts, "SCHEMA_DIR", d)
    artifacts.load_schema.cache_clear()
    yield d
    artifacts.load_schema.cache_clear()


@pytest.fixture
def run(tmp_path, schema_dir):
    """results/demo with plan -> source(+src tree) -> two chained visits, a CSV, private raw output,
    and provenance.json over it all."""
    run = tmp_path / "results" / "demo"
    plan_sha = artifacts.write_artifact(run / "plan.json", "demo_plan",
                                        {"config_sha256": "c" * 64, "rounds": 2, "inputs": {}})
    tree = run / "src" / "baseline" / "engine"
    tree.mkdir(parents=True)
    (tree / "server.py").write_text("print('engine')\n")
    (tree / "VERSION").write_text("1.0\n")
    man = source.manifest(tree)
    src_sha = artifacts.write_artifact(run / "source" / "baseline.json", "source", {
        "pristine": {"files": 2, "manifest": man, "tree_sha256": source.tree_sha256(man)},
        "patched": {"files": 2, "changed": [], "tree_sha256": source.tree_sha256(man)},
        "inputs": {"plan": plan_sha}})
    (run / "private" / "outputs").mkdir(parents=True)
    (run / "private" / "outputs" / "r01-baseline-8.json").write_text('{"text": "raw"}\n')
    (run / "private" / "server.pid").write_text("12345\n")
    raw_sha = artifacts.sha256_file(run / "private" / "outputs" / "r01-baseline-8.json")
    m1 = artifacts.write_artifact(run / "measure" / "r01-baseline.json", "demo_measure", {
        "round": 1, "arm": "baseline", "ttft_ms": 12.5,
        "inputs": {"plan": plan_sha, "source": src_sha, "outputs": [raw_sha], "previous": None}})
    artifacts.write_artifact(run / "measure" / "r02-baseline.json", "demo_measure", {
        "round": 2, "arm": "baseline", "ttft_ms": 13.0,
        "inputs": {"plan": plan_sha, "source": src_sha, "previous": m1}})
    (run / "tables").mkdir()
    (run / "tables" / "summary.csv").write_text("arm,condition,verdict\nbaseline,in8-out4,inconclusive\n")
    provenance.write_provenance(run, run / "provenance.json", "c" * 64, run / "plan.json", HERE)
    return run


def checks(result):
    return {(f.path, f.check) for f in result.findings}


def test_clean_run_passes_and_counts(run):
    result = audit.audit_run(run)
    assert result.ok, [str(f) for f in result.findings]
    assert result.counts["artifacts"] == 5  # plan, source, 2 visits, provenance
    assert result.counts["input_links"] == 9
    prov = json.loads((run / "provenance.json").read_text())
    paths = [a["path"] for a in prov["artifacts"]]
    assert paths == sorted(paths)
    assert "tables/summary.csv" in paths and "measure/r01-baseline.json" in paths
    assert not any(p.startswith(("private/", "src/")) for p in paths)
    entry = next(a for a in prov["artifacts"] if a["path"] == "measure/r02-baseline.json")
    assert entry["schema"] == "pairbench.demo_measure/v1"
    assert entry["sha256"] == artifacts.sha256_file(run / "measure" / "r02-baseline.json")
    assert set(prov["versions"]) >= {"python", "snakemake", "torch"}
    assert prov["pairbench"]["commit"] is None or len(prov["pairbench"]["commit"]) == 40


def test_flipped_byte_names_the_artifact(run):
    path = run / "measure" / "r01-baseline.json"
    data = bytearray(path.read_bytes())
    i = data.index(b"12.5") + 1          # "12.5" -> "13.5": still valid JSON, still schema-valid
    data[i] ^= 0x01
    path.write_bytes(bytes(data))
    result = audit.audit_run(run)
    assert not result.ok
    found = checks(result)
    assert ("measure/r01-baseline.json", "provenance") in found
    # the next visit's recorded input no longer resolves, and the message names the culprit
    link = [f for f in result.findings if f.path == "measure/r02-baseline.json"]
    assert link and "measure/r01-baseline.json was modified" in link[0].message


def test_flipped_byte_breaking_json_is_a_schema_finding(run):
    path = run / "source" / "baseline.json"
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))
    found = checks(audit.audit_run(run))
    assert ("source/baseline.json", "schema") in found
    assert ("source/baseline.json", "provenance") in found


def test_deleted_field_names_artifact_and_field(run):
    path = run / "measure" / "r02-baseline.json"
    data = json.loads(path.read_text())
    del data["ttft_ms"]
    path.write_text(json.dumps(data))
    result = audit.audit_run(run)
    schema_findings = [f for f in result.findings if f.check == "schema"]
    assert [f.path for f in schema_findings] == ["measure/r02-baseline.json"]
    assert "ttft_ms" in schema_findings[0].message


def test_tampered_source_tree_fails_manifest(run):
    (run / "src" / "baseline" / "engine" / "server.py").write_text("print('patched behind our back')\n")
    (run / "src" / "baseline" / "engine" / "__pycache__").mkdir()
    (run / "src" / "baseline" / "engine" / "__pycache__" / "server.cpython-311.pyc").write_bytes(b"\0")
    result = audit.audit_run(run)
    assert ("src/baseline/engine/server.py", "manifest") in checks(result)
    assert not any("__pycache__" in f.message for f in result.findings)


def test_what_the_build_added_to_its_tree_is_left_out_but_hides_no_source(run):
    """build/<arm>.json names what the build added (an installed arm's .venv, a CMake build folder):
    not the source, so not checked; but naming a folder that holds a source file hides nothing."""
    tree = run / "src" / "baseline" / "engine"
    (tree / ".venv" / "bin").mkdir(parents=True)
    (tree / ".venv" / "bin" / "fake-serve").write_text("#!/bin/sh\n")
    (tree / "gen.py").write_text("# generated by the build\n")
    src_sha = artifacts.sha256_file(run / "source" / "baseline.json")
    artifacts.write_artifact(run / "build" / "baseline.json", "demo_build",
                             {"tree_outputs": [".venv", "gen.py"], "inputs": {"source": src_sha}})
    assert not [f for f in audit.audit_run(run).findings if f.check == "manifest"]
    artifacts.write_artifact(run / "build" / "baseline.json", "demo_build",
                             {"tree_outputs": [".venv", "gen.py", "server.py"], "inputs": {"source": src_sha}})
    (tree / "server.py").write_text("print('patched behind our back')\n")
    assert ("src/baseline/engine/server.py", "manifest") in checks(audit.audit_run(run))


def test_injected_and_deleted_files(run):
    (run / "tables" / "extra.csv").write_text("x\n1\n")
    (run / "tables" / "summary.csv").unlink()
    found = checks(audit.audit_run(run))
    assert ("tables/extra.csv", "unrecorded") in found
    assert ("tables/summary.csv", "provenance") in found


def test_provenance_edit_is_caught(run):
    path = run / "provenance.json"
    data = json.loads(path.read_text())
    data["artifacts"][0]["sha256"] = "0" * 64
    path.write_text(json.dumps(data))
    assert (data["artifacts"][0]["path"], "provenance") in checks(audit.audit_run(run))


def test_stray_temporary_file_is_a_warning_not_an_artifact(run):
    (run / "measure" / ".r03-baseline.json.abc123.tmp").write_text('{"half": ')
    result = audit.audit_run(run)
    assert result.ok
    assert any(".r03-baseline.json.abc123.tmp" in w for w in result.warnings)


def test_main_exit_codes_and_artifact(run, capsys):
    out = run / "audit.json"
    assert audit.main([str(run), "--out", str(out)]) == 0
    assert "audit OK" in capsys.readouterr().out
    written = artifacts.read_artifact(out, "audit")
    assert written["ok"] is True and written["inputs"]["provenance"] == artifacts.sha256_file(run / "provenance.json")
    (run / "measure" / "r02-baseline.json").write_text("{}")
    assert audit.main([str(run)]) == 1
    captured = capsys.readouterr()
    assert "audit FAILED" in captured.out and "measure/r02-baseline.json" in captured.err


def test_pairbench_audit_subcommand(run, capsys):
    from pairbench.__main__ import main as pairbench_main

    assert pairbench_main(["audit", str(run)]) == 0
    assert "audit OK" in capsys.readouterr().out
    (run / "plan.json").write_text("{")
    assert pairbench_main(["audit", str(run)]) == 1
    assert "plan.json: [schema] corrupt artifact" in capsys.readouterr().err


# --- the audit rule's record: written before the rule fails, and kept -------------------------------


def test_run_audit_writes_the_record_then_passes(run, tmp_path):
    out, record = run / "audit.json", tmp_path / "logs" / "audit.json"
    record.parent.mkdir()
    result = audit.run_audit(run_dir=run, audit=out, record=record)
    assert result.ok
    assert out.read_bytes() == record.read_bytes()
    assert artifacts.read_artifact(record, "audit")["ok"] is True


def test_a_tampered_run_leaves_a_record_with_ok_false_and_the_findings(run, tmp_path, capsys):
    (run / "tables" / "summary.csv").write_text("arm,condition,verdict\nbaseline,in8-out4,faster\n")
    out, record = run / "audit.json", tmp_path / "logs" / "audit.json"
    record.parent.mkdir()
    with pytest.raises(audit.AuditFailed, match=r"1 finding\(s\), first: tables/summary.csv: \[provenance\]") as exc:
        audit.run_audit(run_dir=run, audit=out, record=record)
    assert str(record) in str(exc.value)
    written = artifacts.read_artifact(record, "audit")  # schema-valid
    assert written["ok"] is False
    assert [(f["path"], f["check"]) for f in written["findings"]] == [("tables/summary.csv", "provenance")]
    assert "modified after the run" in written["findings"][0]["message"]
    assert artifacts.read_artifact(out, "audit") == written
    assert "FAIL tables/summary.csv: [provenance]" in capsys.readouterr().err


TINY_SNAKEFILE = """
rule audit:
    input:
        provenance="results/demo/provenance.json",
    output:
        audit="results/demo/audit.json",
    params:
        run_dir="results/demo",
    log:
        job="logs/demo/audit.log",
        record="logs/demo/audit.json",
    script:
        "{script}"
"""


@pytest.mark.slow
def test_the_audit_rule_fails_and_its_record_survives_in_the_log(tmp_path):
    """Through Snakemake and the real script: a finding fails the job, Snakemake deletes the job's
    output audit.json, and logs/<label>/audit.json keeps the record with ok: false."""
    import subprocess
    import sys

    work = tmp_path / "work"
    run = work / "results" / "demo"
    (run / "tables").mkdir(parents=True)
    (run / "tables" / "summary.csv").write_text("arm,condition,verdict\nbaseline,in8-out4,inconclusive\n")
    (run / "private").mkdir()
    (run / "private" / "plan.txt").write_text("the plan\n")  # provenance's input; private/ is not covered
    provenance.write_provenance(run, run / "provenance.json", "c" * 64, run / "private" / "plan.txt", HERE)
    (work / "Snakefile").write_text(TINY_SNAKEFILE.format(
        script=HERE.parents[1] / "workflow" / "scripts" / "audit.py"))

    def snakemake(*args):
        return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", *args], cwd=work,
                              capture_output=True, text=True, timeout=300)

    ok = snakemake()
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert artifacts.read_artifact(run / "audit.json", "audit")["ok"] is True
    assert artifacts.read_artifact(work / "logs" / "demo" / "audit.json", "audit")["ok"] is True

    (run / "tables" / "summary.csv").write_text("arm,condition,verdict\nbaseline,in8-out4,faster\n")  # not a rule input
    bad = snakemake("--forcerun", "audit")
    assert bad.returncode != 0
    assert not (run / "audit.json").exists()  # Snakemake removed the failed job's output
    kept = artifacts.read_artifact(work / "logs" / "demo" / "audit.json", "audit")
    assert kept["ok"] is False
    assert [(f["path"], f["check"]) for f in kept["findings"]] == [("tables/summary.csv", "provenance")]
    assert "FAIL tables/summary.csv: [provenance]" in (work / "logs" / "demo" / "audit.log").read_text()


def _visits_on(run, nodes):
    """Rewrite the run's two visits as having run on *nodes* (pseudonyms), then re-record provenance."""
    for rel, node in zip(("measure/r01-baseline.json", "measure/r02-baseline.json"), nodes):
        body = json.loads((run / rel).read_text())
        body.pop("schema")
        artifacts.write_artifact(run / rel, "demo_measure", {**body, "host": {"node": node}})
    provenance.write_provenance(run, run / "provenance.json", "c" * 64, run / "plan.json", HERE)


def test_visits_on_one_node_pass_the_placement_check(run):
    _visits_on(run, ["node-0123abcd", "node-0123abcd"])
    assert "placement" not in {f.check for f in audit.audit_run(run).findings}


def test_visits_on_two_nodes_fail_naming_both_nodes_and_their_visits(run):
    _visits_on(run, ["node-0123abcd", "node-99999999"])
    found = [f for f in audit.audit_run(run).findings if f.check == "placement"]
    assert [(f.path, f.message) for f in found] == [(
        "measure/r02-baseline.json",
        "the visits ran on 2 nodes (node-0123abcd: r01-baseline; node-99999999: r02-baseline), so their pairs "
        "also compare the nodes; the real names are the 'node' of each visit's private/outputs/*.json")]


def test_a_placement_finding_is_written_to_the_audit_record(run, schema_dir, tmp_path):
    shutil.copy(REAL_SCHEMAS / "audit.schema.json", schema_dir)
    _visits_on(run, ["node-0123abcd", "node-99999999"])
    result = audit.audit_run(run)
    audit.write_audit(result, tmp_path / "audit.json")
    body = artifacts.read_artifact(tmp_path / "audit.json", "audit")
    assert not body["ok"] and "placement" in [f["check"] for f in body["findings"]]


def test_a_bundle_being_built_beside_provenance_is_not_recorded(run):
    """The publish job builds its bundle in .publish.building-*/ and renames it; a cluster runs
    provenance at the same time, and the audit (after publish) must not miss those files."""
    building = run / ".publish.building-abc123"
    building.mkdir()
    (building / "README.md").write_text("# report in progress\n")
    provenance.write_provenance(run, run / "provenance.json", "c" * 64, run / "plan.json", HERE)
    building.rename(run / "publish")
    recorded = [a["path"] for a in json.loads((run / "provenance.json").read_text())["artifacts"]]
    assert not [p for p in recorded if "publish" in p]
    assert audit.audit_run(run).ok
