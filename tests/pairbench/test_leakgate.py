"""Tests for the leak gate over a folder: every detector kind fires, digests do not, findings name
file, line and detector."""

from __future__ import annotations

import json

import pytest

from pairbench.publish import leakgate

from sanitize_support import png

IDS = {"username": ["zq_alice"], "hostname": ["zq-devbox-07"], "secret": ["zqk_live_9f8e7d6c5b4a39281706f5e4d3c2b1a0"]}
DIGEST = "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ"
       ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")


def write(root, rel, content):
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    (p.write_bytes if isinstance(content, bytes) else p.write_text)(content)


def test_clean_folder_has_no_findings(tmp_path):
    write(tmp_path, "README.md", "# results\n\ndecode 47.9 tok/s, python 3.11.7, server 127.0.0.1:8080\n")
    write(tmp_path, "MANIFEST.json", json.dumps({"files": [{"path": "README.md", "sha256": DIGEST}],
                                                 "inputs": {"plan": DIGEST}}, indent=2))
    write(tmp_path, "tables/t.json", json.dumps({"inputs": {"summary": DIGEST}, "hashes": [DIGEST]}))
    write(tmp_path, "plots/p.png", png())
    assert leakgate.scan(tmp_path, IDS) == []


def test_findings_name_file_line_and_detector(tmp_path):
    write(tmp_path, "README.md", "ok\nrun by zq_alice\nfrom 10.23.45.67\n")
    write(tmp_path, "config.resolved.yaml", "a: 1\nkey: zqk_live_9f8e7d6c5b4a39281706f5e4d3c2b1a0\n")
    found = {str(f) for f in leakgate.scan(tmp_path, IDS)}
    assert "README.md:2: literal:username" in found
    assert "README.md:3: ipv4" in found
    assert "config.resolved.yaml:2: literal:secret" in found


def test_detect_secrets_catches_what_our_scrubber_does_not(tmp_path):
    # A JWT is not one of our classes; detect-secrets' JwtTokenDetector is the net under the net.
    write(tmp_path, "README.md", f"session\n{JWT}\n")
    found = [f for f in leakgate.scan(tmp_path, {}) if f.detector.startswith("detect-secrets:")]
    assert [(f.file, f.line, f.detector) for f in found] == [("README.md", 2, "detect-secrets:JSON Web Token")]


def test_digest_policy(tmp_path):
    # a digest as a whole JSON string is accepted; longer hex, or the same hex also sitting inside a
    # longer string, or a digest in a non-JSON file, is not
    write(tmp_path, "a.json", json.dumps({"prompt_sha256": DIGEST, "inputs": {"plan": DIGEST}}, indent=2))
    write(tmp_path, "b.json", json.dumps({"blob": DIGEST + "ab"}, indent=2))
    write(tmp_path, "c.json", json.dumps({"sha256": DIGEST, "file": f"{DIGEST}.bin"}, indent=2))
    write(tmp_path, "d.md", f'sha256: "{DIGEST}"\n')
    write(tmp_path, "e.yaml", f'model_sha256: "{DIGEST}"\n')
    hits = {(f.file, f.detector) for f in leakgate.scan(tmp_path, {})}
    hex_hits = {f for f, d in hits if d == "detect-secrets:Hex High Entropy String"}
    assert hex_hits == {"b.json", "c.json", "d.md"}


def test_git_id_policy(tmp_path):
    # a commit id as the whole value of commit, tree, tag_object or ref (a CI job's sha ref, in JSON
    # and in the bundle's quoted YAML) is accepted; the same hex in another field, or also inside a
    # longer string, is not
    sha = "b3623c1721685d98628d127a3411d236a6912286"
    write(tmp_path, "gate.json", json.dumps({"arms": {"base": {"ref": sha, "commit": sha, "tree": sha[::-1],
                                                               "version": sha}}}, indent=2))
    write(tmp_path, "config.resolved.yaml", f'"arms":\n  "base":\n    "source":\n      "ref": "{sha}"\n')
    write(tmp_path, "b.json", json.dumps({"token": sha}, indent=2))
    write(tmp_path, "c.json", json.dumps({"ref": sha, "note": f"at {sha}"}, indent=2))
    write(tmp_path, "d.json", json.dumps({"version": sha}, indent=2))  # a version, but no commit says so
    hits = {f.file for f in leakgate.scan(tmp_path, {}) if f.detector == "detect-secrets:Hex High Entropy String"}
    assert hits == {"b.json", "c.json", "d.json"}


def test_png_metadata_and_literal_bytes(tmp_path):
    write(tmp_path, "plots/meta.png", png({"Author": "someone"}))
    write(tmp_path, "plots/pixels.png", png(extra={b"prVt": b"rendered on zq-devbox-07"}))
    found = {str(f) for f in leakgate.scan(tmp_path, IDS)}
    assert found == {"plots/meta.png:0: png-metadata", "plots/pixels.png:0: literal:hostname"}


def test_symlinks_are_findings(tmp_path):
    write(tmp_path, "README.md", "x\n")
    (tmp_path / "link.md").symlink_to("/etc/hostname")
    assert [str(f) for f in leakgate.scan(tmp_path, {})] == ["link.md:0: symlink"]


def test_strip_png_metadata():
    data = png({"Software": "matplotlib", "Author": "zq_alice"})
    assert leakgate.png_text_chunks(data) == ["tEXt", "tEXt"]
    clean = leakgate.strip_png_metadata(data)
    assert leakgate.png_text_chunks(clean) == [] and clean == png()
    with pytest.raises(ValueError):
        leakgate.strip_png_metadata(b"GIF89a")


def test_detector_names_count_all_three_kinds():
    names = leakgate.detector_names(IDS)
    assert any(n.startswith("detect-secrets:") for n in names)
    assert {"email", "ipv4", "home-path", "gpu-uuid"} <= set(names)
    assert {"literal:username", "literal:hostname", "literal:secret"} <= set(names)
    assert {"png-metadata", "symlink", "not-utf8"} <= set(names)
    assert len(names) == len(set(names))


def test_report_line_counts_detectors_by_family_not_as_one_sum():
    """The scrubber's own rules, re-run over text they already rewrote, are not added to the
    independent scanner's plugins as if they were more evidence."""
    names = ["detect-secrets:AWSKeyDetector", "detect-secrets:JwtTokenDetector", "email", "ipv4", "home-path",
             "literal:hostname", "literal:username", "png-metadata", "symlink", "not-utf8"]
    assert leakgate.families(names) == {"independent": 2, "pattern": 3, "literal": 2, "file": 3}
    assert leakgate.report_line(0, names, 12) == (
        "0 findings by detect-secrets (2 plugins, independent of the scrubber), by the scrubber's own 3 "
        "pattern rules and this machine's literal identifiers (2 categories) re-run over its output, and by "
        "3 file checks (PNG metadata, symlinks, UTF-8), over 12 files")


def test_every_detector_the_gate_runs_has_a_family():
    names = leakgate.detector_names(IDS)
    counts = leakgate.families(names)
    assert sum(counts.values()) == len(names)
    assert counts["pattern"] == len(leakgate.sanitize.DETECTORS) and counts["literal"] == 3 and counts["file"] == 3
    assert counts["independent"] == len([n for n in names if n.startswith("detect-secrets:")]) > 0


def test_report_line_names_a_detector_it_cannot_place():
    with pytest.raises(ValueError, match="unknown leak-gate detector 'entropy-v2'"):
        leakgate.report_line(0, ["email", "entropy-v2"], 1)
    with pytest.raises(TypeError, match="detector names"):
        leakgate.report_line(0, 51, 1)


def test_result_reports_families(tmp_path):
    write(tmp_path, "README.md", "clean\n")
    gate = leakgate.result(tmp_path, IDS)
    assert gate["findings"] == [] and gate["families"] == leakgate.families(gate["detectors"])
    assert gate["report_line"].startswith("0 findings by detect-secrets (")
    assert gate["report_line"].endswith(", over 1 files")


def test_scrubbed_text_passes_the_whole_gate(tmp_path):
    """Scrubber and gate agree: whatever the scrubber rewrites, no detector (detect-secrets included)
    still finds in the result."""
    from pairbench.publish.sanitize import scrub_text

    from sanitize_support import IDS as SIDS, POSITIVES

    text = "\n".join(t for _, t in POSITIVES) + "\nzq_alice zq-devbox-07 zqk_live_9f8e7d6c5b4a39281706f5e4d3c2b1a0\n"
    assert len(leakgate.scan(_put(tmp_path / "raw", text), SIDS)) >= len(POSITIVES)
    clean = scrub_text(text, SIDS)
    assert [str(f) for f in leakgate.scan(_put(tmp_path / "clean", clean), SIDS)] == []


def _put(root, text):
    write(root, "README.md", text)
    write(root, "config.resolved.yaml", text)
    return root


def test_scan_cli(tmp_path, monkeypatch, capsys):
    from pairbench.publish import envfacts
    from pairbench.__main__ import main

    from sanitize_support import planted_facts

    facts = planted_facts()
    monkeypatch.setattr(envfacts, "collect", lambda **kw: facts)
    write(tmp_path / "clean", "README.md", "all numbers: 47.9 tok/s\n")
    assert main(["scan", str(tmp_path / "clean")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("0 findings by ")
    write(tmp_path / "dirty", "README.md", "ok\nbuilt on zq-devbox-07\n")
    assert main(["scan", str(tmp_path / "dirty")]) == 1
    out = capsys.readouterr().out
    assert "README.md:2: literal:hostname" in out and "zq-devbox-07" not in out
