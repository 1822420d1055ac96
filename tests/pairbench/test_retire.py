"""The retire stage: retries no longer in their visit's chain leave the run, kept and recorded; the
audit checks the record."""

import json

from pairbench.core.artifacts import read_artifact, write_artifact
from pairbench.core.layout import Layout
from pairbench.integrity.audit import audit_run
from pairbench.stages.validate import retire_stage


def _artifact(path, text="{}"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_retries_beyond_the_chain_are_moved_kept_and_recorded(tmp_path):
    res = tmp_path / "results" / "x"
    chain = [_artifact(res / "measure" / "r01-a.json"), _artifact(res / "validate" / "r01-a.json"),
             _artifact(res / "measure" / "r01-a.retry1.json"), _artifact(res / "validate" / "r01-a.retry1.json")]
    stale = [_artifact(res / "measure" / "r01-a.retry2.json", '{"old": 2}'),
             _artifact(res / "validate" / "r01-a.retry2.json")]
    (res / "private" / "outputs" / "r01-a.retry2").mkdir(parents=True)
    _artifact(res / "private" / "outputs" / "r01-a.retry2" / "400.json")
    other = _artifact(res / "measure" / "r02-a.retry1.json")  # r02-a's chain ends at its retry 1
    retired = res / "private" / "retired.json"
    retire_stage(Layout.of(res), retired=str(retired), measures=chain[::2] + [other], validations=chain[1::2],
                 chain={"r01-a": 1, "r02-a": 1})
    record = read_artifact(retired, "retired")
    assert sorted(m["from"] for m in record["moved"]) == ["measure/r01-a.retry2.json",
                                                          "private/outputs/r01-a.retry2",
                                                          "validate/r01-a.retry2.json"]
    for m in record["moved"]:
        assert not (res / m["from"]).exists() and (res / m["to"]).exists()
        assert m["to"].startswith("private/superseded/") and m["visit"] == "r01-a"
    moved = next(m for m in record["moved"] if m["from"] == "measure/r01-a.retry2.json")
    assert json.loads((res / moved["to"]).read_text()) == {"old": 2}, "moved, never rewritten"
    assert all((res / "measure" / p).exists() for p in ("r01-a.json", "r01-a.retry1.json", "r02-a.retry1.json"))
    assert record["chain"] == {"r01-a": 1, "r02-a": 1}
    # a second run with nothing stale keeps the history
    retire_stage(Layout.of(res), retired=str(retired), measures=chain[::2], validations=chain[1::2],
                 chain={"r01-a": 1})
    assert len(read_artifact(retired, "retired")["moved"]) == 3


def test_the_audit_fails_a_retired_file_that_is_back_in_the_run(tmp_path):
    res = tmp_path / "x"
    (res / "private" / "superseded" / "t" / "measure").mkdir(parents=True)
    (res / "private" / "superseded" / "t" / "measure" / "r01-a.retry2.json").write_text("{}")
    write_artifact(res / "private" / "retired.json", "retired",
                   {"moved": [{"visit": "r01-a", "from": "measure/r01-a.retry2.json",
                               "to": "private/superseded/t/measure/r01-a.retry2.json"},
                              {"visit": "r01-a", "from": "validate/r01-a.retry2.json",
                               "to": "private/superseded/t/validate/r01-a.retry2.json"}],
                    "chain": {"r01-a": 1}, "inputs": {}})
    _artifact(res / "measure" / "r01-a.retry2.json")
    findings = [(f.path, f.check, f.message) for f in audit_run(res).findings if f.check == "retired"]
    assert findings == [
        ("measure/r01-a.retry2.json", "retired", "listed as retired in private/retired.json, yet back in the run"),
        ("private/retired.json", "retired", "private/superseded/t/validate/r01-a.retry2.json: a retired retry that is gone"),
    ]
