"""Shared helpers for the load tests: launch the fake OpenAI-compatible server with load options."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.engines.conftest import free_port

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "openai_compat.py"


def start_fake(log_path: Path, *args: str, ready_timeout_s: float = 30.0) -> tuple[subprocess.Popen, str]:
    """Start the fake (vLLM flavor unless *args* say otherwise) and wait for /health (a readiness
    handshake, not a timing assumption). Returns (process, base URL)."""
    port = free_port()
    argv = [sys.executable, str(FAKE), "--flavor", "vllm", "--port", str(port), *args]  # a later --flavor wins
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_timeout_s
    with httpx.Client(trust_env=False) as http:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"fake exited {proc.returncode}: {log_path.read_text()[-2000:]}")
            try:
                if http.get(url + "/health", timeout=2).status_code == 200:
                    return proc, url
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                stop(proc)
                raise RuntimeError("fake server not ready in time")
            time.sleep(0.05)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def fake(tmp_path):
    """A factory: ``url = fake("--parallel", "4", ...)`` starts a fake server, stopped after the test."""
    procs = []

    def _start(*args: str) -> str:
        proc, url = start_fake(tmp_path / f"fake{len(procs)}.log", *args)
        procs.append(proc)
        return url

    yield _start
    for proc in procs:
        stop(proc)
