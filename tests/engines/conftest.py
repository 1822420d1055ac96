"""Shared helpers for engine tests: start a server from a LaunchSpec, read an SSE stream."""

import json
import os
import signal
import socket
import subprocess
import time

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Running:
    def __init__(self, spec, log_path):
        self.spec = spec
        self.log_path = log_path
        self.http = httpx.Client(trust_env=False, timeout=30)
        env = {**os.environ, **spec.env}
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(spec.argv, cwd=spec.cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + spec.ready_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {open(log_path).read()[-2000:]}")
            try:
                if self.http.get(spec.health_url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("server not ready in time")
            time.sleep(spec.interval_s)

    def post(self, path, body):
        r = self.http.post(self.spec.url + path, json=body)
        r.raise_for_status()
        return r.json()

    def stream(self, path, body):
        """(text pieces, final top-level fields merged from every chunk)."""
        pieces, final = [], {}
        with self.http.stream("POST", self.spec.url + path, json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                for ch in chunk.get("choices") or []:
                    piece = ch.get("text", (ch.get("delta") or {}).get("content"))
                    if piece:
                        pieces.append(piece)
                final.update({k: v for k, v in chunk.items() if k != "choices" and v is not None})
        return pieces, final

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.http.close()


@pytest.fixture
def launch(tmp_path):
    started = []

    def _launch(spec):
        srv = Running(spec, tmp_path / f"server{len(started)}.log")
        started.append(srv)
        return srv

    yield _launch
    for srv in started:
        srv.stop()
