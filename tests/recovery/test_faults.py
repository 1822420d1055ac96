"""Engine faults fail the visit with an error naming the visit, arm, round and condition.

Each test runs a real visit (pairbench.measure.visit.run_visit) against the fake engine (tests/fakes/engine,
launched as a real server process from an exported copy, exactly as the pipeline does) told to
misbehave through its FAKE_ENGINE_* environment: fail to start, crash mid-stream, hang, or send
malformed server-sent events. A fault must never become a sample, leave a server running, or leave
the pid file behind. The pipeline-level retry of such a visit is in test_crash.py.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import psutil
import pytest

from pairbench.core.conditions import Condition
from pairbench.engines.adapter import arm_adapter

from pairbench.measure import visit as measure

REPO = Path(__file__).resolve().parents[2]
LENGTHS = [40, 48]
OUTPUT_TOKENS = 12
CONDITIONS = [Condition.of(input_tokens=n, output_tokens=OUTPUT_TOKENS) for n in LENGTHS]


@pytest.fixture
def arm_dir(tmp_path):
    d = tmp_path / "src" / "candidate"
    shutil.copytree(REPO / "tests" / "fakes" / "engine", d / "engine")
    return d


def visit_inputs(round_: int = 2):
    plan = {"conditions": [c.to_dict() for c in CONDITIONS], "seed": 0, "max_context": 2048}
    prompts = {c.id: {"rounds": [{"round": round_, "messages": [{"role": "user", "content": "x" * c.input_tokens}]}]}
               for c in CONDITIONS}
    fixtures = {c.id: {"rounds": [{"round": round_, "prompt_sha256": "0" * 64}]} for c in CONDITIONS}
    visit = {"index": 3, "round": round_, "arm": "candidate", "position": 1, "id": f"r{round_:02d}-candidate"}
    return visit, plan, prompts, fixtures


def run(arm_dir, tmp_path, env: dict, attempt: int = 1, request_timeout_s: float = 20.0):
    visit, plan, prompts, fixtures = visit_inputs()
    pid_path = tmp_path / "private" / "servers" / "measure.json"
    server_cfg = {"threads": None, "request_timeout_s": request_timeout_s, "startup_timeout_s": 10,
                  "stop_timeout_s": 2}
    before = {p.pid for p in psutil.process_iter()}
    try:
        engine = arm_adapter({"args": [], "env": env, "threads": None}, model="tiny", model_path=None,
                             ctx=plan["max_context"], src_dir=arm_dir)
        return measure.run_visit(visit=visit, engine=engine, plan=plan, prompts=prompts, fixtures=fixtures,
                                 server_cfg=server_cfg, server_log=tmp_path / "private" / "logs" / "server.log", inputs={},
                                 attempt=attempt, pid_path=pid_path)
    finally:
        assert not pid_path.exists(), "the pid file outlived its server"
        leftovers = [p for p in psutil.process_iter(["pid", "cwd", "status"])
                     if p.pid not in before and p.info["status"] != psutil.STATUS_ZOMBIE
                     and (p.info["cwd"] or "").startswith(str(arm_dir))]
        assert not leftovers, f"server processes left running: {leftovers}"


def test_a_healthy_visit_records_attempt_and_logs_progress(arm_dir, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="pairbench.progress"):
        body, outputs = run(arm_dir, tmp_path, {"FAKE_ENGINE_DECODE_MS": "1"}, attempt=2)
    assert body["attempt"] == 2 and all(r["attempt"] == 2 for r in body["records"])
    assert [r["condition"] for r in body["records"]] == ["in40-out12", "in48-out12"]
    assert [r["input_tokens"] for r in body["records"]] == LENGTHS
    assert all(r["completion_tokens"] == OUTPUT_TOKENS for r in body["records"])
    lines = [r.getMessage() for r in caplog.records if r.name == "pairbench.progress"]
    for c in CONDITIONS:
        label = f"[measure] r02-candidate arm=candidate round=2 condition={c.id}"
        assert f"{label}: 1/{OUTPUT_TOKENS} tokens" in lines
        assert f"{label}: {OUTPUT_TOKENS}/{OUTPUT_TOKENS} tokens" in lines


@pytest.mark.parametrize("env, cause", [
    ({"FAKE_ENGINE_FAIL_START": "1"}, "the engine failed to start: server exited with status 3"),
    ({"FAKE_ENGINE_CRASH_AFTER": "10"}, "engine fault: stream"),
    ({"FAKE_ENGINE_MALFORMED_SSE": "1"}, "engine fault: malformed SSE"),
    ({"FAKE_ENGINE_HANG": "1"}, "engine fault: request timed out after 1.5 s"),
], ids=["fails-to-start", "crashes-mid-stream", "malformed-sse", "hangs"])
def test_engine_fault_fails_the_visit_naming_arm_round_condition(arm_dir, tmp_path, env, cause):
    with pytest.raises(measure.VisitError) as err:
        run(arm_dir, tmp_path, env, attempt=1, request_timeout_s=1.5)
    msg = str(err.value)
    assert "visit r02-candidate (arm candidate, round 2, condition in40-out12, attempt 1)" in msg
    assert cause in msg
    if "CRASH_AFTER" in next(iter(env)):
        assert "the server exited with status 9" in msg
