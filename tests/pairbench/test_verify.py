"""Tests for offline verification: a good bundle passes; each kind of tampering is named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pairbench.publish import envfacts
from pairbench.publish import bundle as publish
from pairbench.__main__ import main
from pairbench.core.artifacts import dumps, sha256_file
from pairbench.publish.verify import messages_sha256, verify_bundle

from sanitize_support import planted_facts, planted_run, use_test_schemas


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("verify")
    use_test_schemas(mp, tmp)
    facts = planted_facts()
    run = planted_run(tmp, facts)
    out = tmp / "publish"
    publish.build_bundle(out, run["files"], identifiers=envfacts.identifiers(facts), private_dir=tmp / "private",
                         patches=run["patches"], clean_source=run["clean_source"],
                         patched_files=run["patched_files"], patch_roots=run["patch_roots"])
    yield out, run["clean_source"]
    mp.undo()


@pytest.fixture
def bundle(built, tmp_path):
    out, clean = built
    copy = tmp_path / "bundle"
    shutil.copytree(out, copy)
    return copy, clean


def rehash(bundle: Path, rel: str) -> None:
    """Record a tampered file's new hash in MANIFEST.json, so only the deeper check can catch it."""
    mpath = bundle / "MANIFEST.json"
    manifest = json.loads(mpath.read_text())
    for e in manifest["files"]:
        if e["path"] == rel:
            e["sha256"] = sha256_file(bundle / rel)
            e["size_bytes"] = (bundle / rel).stat().st_size
    mpath.write_text(dumps(manifest))


def test_good_bundle_verifies(bundle, capsys):
    b, clean = bundle
    assert verify_bundle(b) == []
    assert verify_bundle(b, clean_source=clean) == []
    assert main(["verify", str(b), "--source", str(clean)]) == 0
    assert "OK" in capsys.readouterr().out


def test_snakemake_directory_marker_is_tolerated_only_empty(bundle):
    b, _ = bundle
    marker = b / ".snakemake_timestamp"
    marker.write_bytes(b"")
    assert verify_bundle(b) == []
    marker.write_text("zq_alice\n")
    assert verify_bundle(b) == [".snakemake_timestamp: in the bundle but not listed in MANIFEST.json"]


def test_tampered_hash(bundle, capsys):
    b, _ = bundle
    csv = b / "tables" / "measurements.csv"
    csv.write_text(csv.read_text().replace("47.9", "57.9"))
    problems = verify_bundle(b)
    assert len(problems) == 1 and problems[0].startswith("tables/measurements.csv: sha256 mismatch")
    assert main(["verify", str(b)]) == 1
    assert "tables/measurements.csv: sha256 mismatch" in capsys.readouterr().out


def test_broken_patch(bundle):
    b, clean = bundle
    p = b / "patches" / "0001-int8-path.patch"
    p.write_text(p.read_text().replace('-    return "float32"', '-    return "float64"'))
    rehash(b, "patches/0001-int8-path.patch")
    assert verify_bundle(b) == []  # without the source, a patch is just text
    problems = verify_bundle(b, clean_source=clean)
    assert len(problems) == 1
    assert problems[0].startswith("patches/0001-int8-path.patch: does not apply to the clean source")
    assert "engine/model.py" in problems[0]


def test_patched_file_hash_differs_from_measured_source(bundle, tmp_path):
    b, clean = bundle
    other = tmp_path / "other_source"
    shutil.copytree(clean, other)
    model = other / "engine" / "model.py"
    model.write_text(model.read_text() + "\n# a different tag\n")
    problems = verify_bundle(b, clean_source=other)
    assert len(problems) == 1 and problems[0].startswith("source engine/model.py: sha256 after patching")


def test_changed_fixture_text(bundle):
    b, _ = bundle
    f = b / "fixtures.json"
    data = json.loads(f.read_text())
    data["fixtures"][0]["messages"][1]["content"] = "Summarise a different paragraph."
    f.write_text(dumps(data))
    rehash(b, "fixtures.json")
    assert verify_bundle(b) == ["fixtures.json: fixtures[0] (condition in256-out64): messages_sha256 does not recompute from the messages"]
    data["fixtures"][0]["messages_sha256"] = messages_sha256(data["fixtures"][0]["messages"])
    data["fixtures"][0]["text"] += " "
    f.write_text(dumps(data))
    rehash(b, "fixtures.json")
    assert verify_bundle(b) == ["fixtures.json: fixtures[0] (condition in256-out64): text_sha256 does not recompute from the text"]


def test_schema_violations(bundle):
    b, _ = bundle
    env = b / "environment.json"
    data = json.loads(env.read_text())
    data["hostname"] = "box"
    env.write_text(dumps(data))
    rehash(b, "environment.json")
    csv = b / "tables" / "measurements.csv"
    csv.write_text(csv.read_text().replace("120.5", "fast"))
    rehash(b, "tables/measurements.csv")
    problems = verify_bundle(b)
    assert len(problems) == 2
    assert problems[0].startswith("environment.json: ") and "hostname" in problems[0]
    assert problems[1].startswith("tables/measurements.csv: line 2: column 'ttft_ms' is not numeric")


def test_script_syntax_and_unlisted_and_missing_files(bundle):
    b, _ = bundle
    (b / "scripts" / "replot.py").write_text("def broken(:\n")
    rehash(b, "scripts/replot.py")
    (b / "tables" / "extra.csv").write_text("a\n1\n")
    (b / "plots" / "decode_tok_s.png").unlink()
    problems = verify_bundle(b)
    assert "plots/decode_tok_s.png: listed in MANIFEST.json but missing (or not a plain file)" in problems
    assert "tables/extra.csv: in the bundle but not listed in MANIFEST.json" in problems
    assert any(p.startswith("scripts/replot.py: line 1: Python syntax error") for p in problems)
    assert len(problems) == 3


def test_manifest_problems(tmp_path, bundle):
    assert verify_bundle(tmp_path) == ["MANIFEST.json: missing"]
    b, _ = bundle
    m = b / "MANIFEST.json"
    data = json.loads(m.read_text())
    data["files"][0]["sha256"] = "not-a-hash"
    m.write_text(dumps(data))
    problems = verify_bundle(b)
    assert len(problems) == 1 and problems[0].startswith("MANIFEST.json: ") and "sha256" in problems[0]


def test_a_table_is_read_back_against_its_schema_naming_file_line_and_column(tmp_path):
    """Issue 38: publish and the report's landing page read tables/*.csv with a bare pd.read_csv, so a
    cell of free text (a path, a message) where a number belongs went on into the report."""
    from pairbench.publish.verify import TableError, read_table

    good = tmp_path / "measurements.csv"
    good.write_text("round,arm,condition,selected,decode_tok_s\n1,baseline,in256-out64,true,41.5\n")
    df = read_table(good, publish.CATEGORICAL_FIELDS, required=("round", "arm", "condition", "selected"))
    assert list(df.columns) == ["round", "arm", "condition", "selected", "decode_tok_s"]
    assert df["decode_tok_s"].tolist() == [41.5]
    bad = tmp_path / "bad.csv"
    bad.write_text("round,arm,condition,selected,decode_tok_s\n1,baseline,in256-out64,true,41.5\n"
                   "2,baseline,in256-out64,true,see /scratch/qx_bob/log\n")
    with pytest.raises(TableError, match=r"bad\.csv: line 3: column 'decode_tok_s' is not numeric"):
        read_table(bad, publish.CATEGORICAL_FIELDS)
    short = tmp_path / "short.csv"
    short.write_text("round,arm,condition\n1,baseline,in256-out64\n")
    with pytest.raises(TableError, match=r"short\.csv: line 1: missing column\(s\) \['selected'\]"):
        read_table(short, publish.CATEGORICAL_FIELDS, required=("round", "arm", "condition", "selected"))
