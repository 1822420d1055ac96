"""Tests for build_bundle: planted identifiers never reach the bundle, the gate fails closed, and bad
tables or patches are refused with a message naming the culprit."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pairbench.publish import envfacts
from pairbench.publish import bundle as publish
from pairbench.publish import sanitize
from pairbench.publish.verify import verify_bundle

from sanitize_support import DATA, planted_facts, planted_run, planted_strings, png, use_test_schemas


@pytest.fixture
def planted(tmp_path, monkeypatch):
    use_test_schemas(monkeypatch, tmp_path)
    facts = planted_facts()
    run = planted_run(tmp_path, facts)
    ids = envfacts.identifiers(facts)
    out = tmp_path / "results" / "smoke" / "publish"
    private = tmp_path / "results" / "smoke" / "private"

    def build(files=None, **overrides):
        kwargs = dict(identifiers=ids, private_dir=private, patches=run["patches"], clean_source=run["clean_source"],
                      patched_files=run["patched_files"], patch_roots=run["patch_roots"])
        kwargs.update(overrides)
        return publish.build_bundle(out, run["files"] if files is None else files, **kwargs)

    return {"run": run, "ids": ids, "out": out, "private": private, "build": build, "tmp": tmp_path}


def bundle_bytes(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(".publish.")]


def test_planted_identifiers_never_reach_the_bundle(planted):
    result = planted["build"]()
    out = planted["out"]
    files = bundle_bytes(out)
    assert sorted(files) == [
        "MANIFEST.json", "README.md", "config.resolved.yaml", "environment.json", "fixtures.json",
        "patches/0001-int8-path.patch", "patches/0002-version-tag.patch", "plots/decode_tok_s.png",
        "scripts/replot.py", "tables/measurements.csv", "tables/verdicts.json",
    ]
    for rel, data in files.items():
        low = data.lower()
        assert b"zq" not in low, f"{rel} still holds a planted 'zq' identifier"
        for planted_value in planted_strings():
            assert planted_value.lower().encode() not in low, f"{rel} leaks {planted_value!r}"
    assert result["excluded"] == ["logs/server.log", "outputs/r01-candidate-in256-out64.json"]
    assert result["findings"] == 0 and result["files"] == len(files) and result["patches_checked"]
    line = re.fullmatch(r"0 findings by detect-secrets \((\d+) plugins, independent of the scrubber\), by the "
                        r"scrubber's own 16 pattern rules and this machine's literal identifiers \((\d+) categories\) "
                        r"re-run over its output, and by 3 file checks \(PNG metadata, symlinks, UTF-8\), over "
                        rf"{len(files)} files", result["report_line"])
    assert line, result["report_line"]
    names = json.loads(Path(result["private_result"]).read_text())["detectors"]
    assert int(line[1]) == len([n for n in names if n.startswith("detect-secrets:")]) > 0
    assert int(line[2]) == len([n for n in names if n.startswith("literal:")]) > 0
    assert f"Leak gate: {result['report_line']}" in files["README.md"].decode()
    # the mapping stays private, and is consistent across files
    pseudonyms = json.loads(Path(result["pseudonyms"]).read_text())
    assert pseudonyms["zq-devbox-07"] == "host-3" and pseudonyms["zq_alice"] == "user-1"
    assert "host-3" in files["README.md"].decode() and "host-3" in files["patches/0001-int8-path.patch"].decode()
    gate = json.loads(Path(result["private_result"]).read_text())
    assert gate["findings"] == [] and len(gate["detectors"]) == result["detectors"]
    assert not leftovers(out.parent)
    assert verify_bundle(out, clean_source=planted["run"]["clean_source"]) == []
    assert {oct(p.stat().st_mode & 0o777) for p in [out, *out.rglob("*")]} == {"0o755", "0o644"}


def test_manifest_lists_every_file_with_hash_and_schema(planted):
    planted["build"]()
    manifest = json.loads((planted["out"] / "MANIFEST.json").read_text())
    entries = {e["path"]: e for e in manifest["files"]}
    assert entries["environment.json"]["schema"] == "pairbench.environment/v1"
    assert entries["fixtures.json"]["schema"] == "pairbench.fixture_manifest/v2"
    assert entries["tables/measurements.csv"]["schema"] == "pairbench.table/v1"
    assert entries["tables/measurements.csv"]["categorical"] == ["arm", "condition", "round"]
    assert entries["README.md"]["schema"] is None
    assert manifest["source"] == {"patches": ["patches/0001-int8-path.patch", "patches/0002-version-tag.patch"],
                                  "patched_files": json.loads((DATA / "patched_files.json").read_text())}
    env = json.loads((planted["out"] / "environment.json").read_text())
    assert [g["id"] for g in env["gpus"]] == ["gpu0", "gpu1"]
    assert env["engine_version"] == "pairbench-engine 0.1.0 (built by user-1@host-3)"


def test_forced_leak_fails_closed(planted, monkeypatch):
    # Simulate a scrubber that misses everything: the gate must stop the publication on its own.
    monkeypatch.setattr(sanitize, "scrub_text", lambda text, identifiers, pseudonyms=None: text)
    previous = planted["out"]
    previous.mkdir(parents=True)
    (previous / "README.md").write_text("previous, verified bundle\n")
    with pytest.raises(publish.LeakGateError) as exc:
        planted["build"]()
    msg = str(exc.value)
    assert "nothing was published" in msg
    assert "README.md:1: literal:hostname" in msg
    assert "... and " in msg  # long lists are cut; the full list is private
    assert "zq" not in msg.lower(), "the error must name file, line and detector, never the value"
    # the previous bundle is untouched, no half-built bundle is left, the full result is private
    assert bundle_bytes(previous) == {"README.md": b"previous, verified bundle\n"}
    assert not leftovers(previous.parent)
    gate = json.loads((planted["private"] / "leakgate.json").read_text())
    assert {"file": "README.md", "line": 1, "detector": "literal:hostname", "value": "zq-devbox-07"} in gate["findings"]
    assert {"file": "config.resolved.yaml", "line": 3, "detector": "home-path", "value": "/home/zq_alice"} in gate["findings"]
    leaked = {f["file"] for f in gate["findings"]}
    assert {"README.md", "config.resolved.yaml", "scripts/replot.py", "patches/0002-version-tag.patch"} <= leaked


def test_identifier_the_scrubber_cannot_rewrite_fails_the_gate(planted):
    files = dict(planted["run"]["files"])
    files["plots/decode_tok_s.png"] = png(extra={b"prVt": b"rendered on zq-devbox-07"})
    with pytest.raises(publish.LeakGateError, match=r"plots/decode_tok_s.png:0: literal:hostname"):
        planted["build"](files)
    assert not planted["out"].exists() and not leftovers(planted["out"].parent)


def test_detect_secrets_finding_fails_the_gate(planted, tmp_path):
    readme = tmp_path / "README.md"
    jwt = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ"
           ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
    readme.write_text(f"# report\n\nsession cookie {jwt}\n")
    with pytest.raises(publish.LeakGateError, match=r"README.md:3: detect-secrets:JSON Web Token"):
        planted["build"]({"README.md": readme})
    assert not planted["out"].exists()


def test_non_numeric_table_field_is_refused(planted, tmp_path):
    csv = tmp_path / "m.csv"
    csv.write_text("round,arm,ttft_ms,host_label\n1,baseline,120.5,rack-a\n")
    with pytest.raises(publish.PublishError, match=r"tables/m.csv: line 2: column 'host_label' is not numeric"):
        planted["build"]({"tables/m.csv": csv}, patches={}, clean_source=None)
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"schema": "pairbench.verdicts/v1", "inputs": {},
                                 "rows": [{"arm": "candidate", "ratio": 1.1, "prompt": "tell me about rivers"}]}))
    with pytest.raises(publish.PublishError, match=r"field 'rows/0/prompt' holds text but 'prompt' is not an allowlisted"):
        planted["build"]({"tables/t.json": table}, patches={}, clean_source=None)
    # the allowlist is a parameter: a publisher can widen it explicitly
    planted["build"]({"tables/t.json": table}, patches={}, clean_source=None,
                     categorical=publish.CATEGORICAL_FIELDS | {"prompt"})
    assert (planted["out"] / "tables" / "t.json").exists()


def test_json_without_schema_is_refused(planted, tmp_path):
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"rows": []}))
    with pytest.raises(publish.PublishError, match=r"must be a valid pairbench artifact: tables/t.json: corrupt artifact, no 'schema' field"):
        planted["build"]({"tables/t.json": table}, patches={}, clean_source=None)


def test_stripped_patch_must_still_apply(planted):
    # Without the root, the absolute path in patch 2 cannot be made relative: it no longer applies.
    with pytest.raises(publish.PublishError, match=r"patches/0002-version-tag.patch: does not apply to the clean source"):
        planted["build"](patch_roots=())
    assert not planted["out"].exists()


def test_patched_files_must_match_the_measured_source(planted):
    wrong = dict(planted["run"]["patched_files"], **{"engine/VERSION": "0" * 64})
    with pytest.raises(publish.PublishError, match=r"source engine/VERSION: sha256 after patching"):
        planted["build"](patched_files=wrong)


def test_allowlist_and_bad_names(planted, tmp_path):
    f = tmp_path / "x.md"
    f.write_text("hello\n")
    result = planted["build"]({"README.md": f, "notes/x.md": f, "tables/x.txt": f}, patches={}, clean_source=None)
    assert result["excluded"] == ["notes/x.md", "tables/x.txt"]
    assert sorted(bundle_bytes(planted["out"])) == ["MANIFEST.json", "README.md"]
    with pytest.raises(publish.PublishError, match=r"MANIFEST.json: written by build_bundle itself"):
        planted["build"]({"MANIFEST.json": f}, patches={})
    with pytest.raises(publish.PublishError, match=r"not a plain relative bundle path"):
        planted["build"]({"../README.md": f}, patches={})
    with pytest.raises(publish.PublishError, match=r"README.md: cannot read its source file"):
        planted["build"]({"README.md": str(tmp_path / "missing.md")}, patches={})
    assert publish.allowed("tables/a.csv", publish.DEFAULT_ALLOWLIST)
    assert not publish.allowed("tables/sub/a.csv", publish.DEFAULT_ALLOWLIST)


def test_success_replaces_a_previous_bundle(planted, tmp_path):
    planted["out"].mkdir(parents=True)
    (planted["out"] / "stale.md").write_text("old\n")
    f = tmp_path / "README.md"
    f.write_text("new\n")
    planted["build"]({"README.md": f}, patches={}, clean_source=None)
    assert sorted(bundle_bytes(planted["out"])) == ["MANIFEST.json", "README.md"]
    assert not leftovers(planted["out"].parent)


def test_patch_series_in_one_file_applies(planted, tmp_path):
    series = tmp_path / "series.patch"
    series.write_bytes((DATA / "0001-int8-path.patch").read_bytes() + (DATA / "0002-version-tag.patch").read_bytes())
    f = tmp_path / "README.md"
    f.write_text("r\n")
    planted["build"]({"README.md": f}, patches={"series": series})
    text = (planted["out"] / "patches" / "series.patch").read_text()
    assert "zq" not in text.lower()
    assert verify_bundle(planted["out"], clean_source=planted["run"]["clean_source"]) == []


def candidate_sets(planted, tag_files=None):
    """Two candidates, one patch each (0001 changes engine/model.py, 0002 engine/VERSION)."""
    known = planted["run"]["patched_files"]
    return {"int8": (["0001-int8-path"], {"engine/model.py": known["engine/model.py"]}),
            "tag": (["0002-version-tag.patch"], tag_files or {"engine/VERSION": known["engine/VERSION"]})}


def test_each_candidates_patches_apply_alone_and_verify(planted):
    planted["build"](patched_files=None, patch_sets=candidate_sets(planted))
    source = json.loads((planted["out"] / "MANIFEST.json").read_text())["source"]
    assert source["patches"] == ["patches/0001-int8-path.patch", "patches/0002-version-tag.patch"]
    assert {c: s["patches"] for c, s in source["candidates"].items()} == {
        "int8": ["patches/0001-int8-path.patch"], "tag": ["patches/0002-version-tag.patch"]}
    assert verify_bundle(planted["out"], clean_source=planted["run"]["clean_source"]) == []


def test_a_candidate_whose_patches_do_not_give_its_measured_source_is_named(planted):
    # the tag patch alone leaves engine/model.py as it was: not the int8 candidate's model.py
    model = planted["run"]["patched_files"]["engine/model.py"]
    with pytest.raises(publish.PublishError, match=r"^candidate tag: patched source differs from the measured one"):
        planted["build"](patched_files=None, patch_sets=candidate_sets(planted, {"engine/model.py": model}))
    assert not planted["out"].exists()


BOB_PATHS = ["/opt/qx_bob/toolchain/bin/g++", "/scratch/qx_bob/jobs/4711/build", "/tmp/qx_bob-tmp/bench.log",
             "/var/spool/slurmd/job4711/slurm_script"]


def test_a_path_under_any_prefix_never_reaches_the_bundle(planted):
    """Issue 38: a candidate patch whose header names a toolchain, a sibling build directory and a
    log under prefixes the scrubber did not know (/opt, /scratch, /tmp; a user it was not told of),
    and an engine's error text in the report naming a Slurm spool path, were published verbatim and
    the gate said nothing. Now every absolute path is scrubbed, and the patch still applies."""
    tmp = planted["tmp"]
    patch = (DATA / "0001-int8-path.patch").read_text().replace(
        "Measured on zq-devbox-07.\n",
        f"Measured on zq-devbox-07.\nBuilt with {BOB_PATHS[0]} in {BOB_PATHS[1]}; log {BOB_PATHS[2]}.\n")
    (tmp / "0001-int8-path.patch").write_text(patch)
    files = dict(planted["run"]["files"])
    readme = Path(files["README.md"]).read_text() + f"\nengine error: cannot open {BOB_PATHS[3]}: denied\n"
    files["README.md"] = readme.encode()
    patches = dict(planted["run"]["patches"], **{"0001-int8-path": tmp / "0001-int8-path.patch"})
    result = planted["build"](files=files, patches=patches)
    bundle = bundle_bytes(planted["out"])
    for rel, data in bundle.items():
        assert b"qx_bob" not in data and b"slurmd" not in data, rel
    assert b"Built with <path> in <path>; log <path>." in bundle["patches/0001-int8-path.patch"]
    assert result["findings"] == 0 and result["patches_checked"]


def test_the_gate_fails_on_a_path_that_bypassed_the_scrubber(tmp_path):
    """The gate's own detector: an absolute path written into a bundle file behind the scrubber's
    back is a finding, whatever its prefix."""
    from pairbench.publish import leakgate

    (tmp_path / "README.md").write_text("ok\n" + "\n".join(f"see {p}" for p in BOB_PATHS) + "\n")
    found = [(f.file, f.line, f.detector, f.value) for f in leakgate.scan(tmp_path, {})]
    assert found == [("README.md", i + 2, "abs-path", p) for i, p in enumerate(BOB_PATHS)]
