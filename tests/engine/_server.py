"""Start ``python -m engine serve`` as a real subprocess on a free port (shared by the engine tests)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A running engine server; ``stop()`` sends SIGTERM and returns the exit code."""

    def __init__(self, root: Path, model: str = "tiny", extra: list[str] | None = None, timeout: float = 120):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "engine", "serve", "--model", model, "--port", str(self.port),
               "--threads", "1", *(extra or [])]
        env = dict(os.environ, PYTHONPATH=str(root))  # import the engine/ under ``root``, nothing else
        self.log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"engine-test-{self.port}.log", "w+")
        self.proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.client = httpx.Client(base_url=self.url, timeout=60)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"engine server not healthy after {timeout} s:\n{self.output()}")
            time.sleep(0.1)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self, timeout: float = 30) -> int:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def sse_events(response: httpx.Response) -> list:
    """The ``data:`` payloads of a streamed response, in order (``[DONE]`` kept as a string)."""
    import json

    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
