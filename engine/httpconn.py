"""The server's connections under hostile clients: limits, deadlines, and reading a request.

The server (``engine/server.py``) gives each connection a thread of ``ThreadingHTTPServer``. What a
client could do to it, and what bounds it here (each bound an ``engine serve`` option,
:func:`add_arguments`):

- open connections and send nothing, or a byte at a time (slowloris): at most ``--max-connections``
  are served at once (one more gets a 503 and is closed at once, by the accepting thread), and a
  request's line and headers must arrive within ``--header-timeout`` seconds of the connection or of
  the previous response (an idle keep-alive connection is closed then);
- announce a body and not send it: the body must arrive within ``--body-timeout`` (a 408 then);
  the same bound holds each write of a response to a client that stopped reading;
- send big bodies: ``--max-body-bytes`` per request (413), ``--body-budget`` bytes of bodies being
  read at once over every connection (503 beyond it);
- fill the accept queue: the listen backlog is ``--backlog``;
- send a chunked body or other transfer codings: refused with 411 (chunked: send Content-Length)
  or 501, and the connection closed, since its body cannot be skipped.

Every refusal is an OpenAI-shaped JSON error (``{"error": {"message", "type", "param", "code"}}``),
never the standard library's HTML page. While a request runs, its connection thread watches the
socket for the client closing it: bytes the client sends meanwhile (a pipelined next request) are
kept (:class:`ClientReader`) and served to the next request, so the watch never stops.

The design follows what production servers bound (nginx's ``client_header_timeout``,
``client_body_timeout``, ``client_max_body_size``; uvicorn's ``--limit-concurrency``,
``--backlog``, ``--timeout-keep-alive``).
"""

from __future__ import annotations

import argparse
import io
import json
import socket
import threading
import time
from dataclasses import dataclass

MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """The bounds on connections (defaults: the ``engine serve`` options' defaults)."""

    max_connections: int = 256
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_body_bytes: int = 32 * MiB
    body_budget_bytes: int = 256 * MiB
    backlog: int = 128

    def __post_init__(self):
        for name in ("max_connections", "max_body_bytes", "body_budget_bytes", "backlog"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("header_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_body_bytes > self.body_budget_bytes:
            raise ValueError(f"max_body_bytes ({self.max_body_bytes}) exceeds body_budget_bytes "
                             f"({self.body_budget_bytes}): no such body could ever be read")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``engine serve`` options of :class:`Limits`."""
    d = Limits()
    parser.add_argument("--max-connections", type=int, default=d.max_connections,
                        help=f"connections served at once; one more gets a 503 and is closed (default {d.max_connections})")
    parser.add_argument("--header-timeout", type=float, default=d.header_timeout_s,
                        help="seconds from a connection (or the end of the previous response) to the end of a "
                             f"request's headers; an idle or slow client is closed then (default {d.header_timeout_s:g})")
    parser.add_argument("--body-timeout", type=float, default=d.body_timeout_s,
                        help="seconds from the end of the headers to the end of the body (408 after), and for "
                             f"each write of a response to a client that stopped reading (default {d.body_timeout_s:g})")
    parser.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                        help=f"largest request body; a larger one gets a 413 (default {d.max_body_bytes >> 20} MiB)")
    parser.add_argument("--body-budget", type=int, default=d.body_budget_bytes,
                        help="bytes of request bodies read at once over every connection; a body beyond it "
                             f"gets a 503 (default {d.body_budget_bytes >> 20} MiB)")
    parser.add_argument("--backlog", type=int, default=d.backlog,
                        help=f"the listen backlog: connections the kernel queues before they are accepted (default {d.backlog})")


def limits_from(args: argparse.Namespace) -> Limits:
    """The :class:`Limits` of parsed ``engine serve`` options; ValueError naming a bad one."""
    return Limits(max_connections=args.max_connections, header_timeout_s=args.header_timeout,
                  body_timeout_s=args.body_timeout, max_body_bytes=args.max_body_bytes,
                  body_budget_bytes=args.body_budget, backlog=args.backlog)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> bytes:
    """An OpenAI-shaped error body."""
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}}).encode()


def refuse(sock: socket.socket, status: int, reason: str, message: str, kind: str, code: str) -> None:
    """Answer a connection that will not be served with one JSON error and close it, without
    reading it (the accepting thread does this: it must never block on a client)."""
    body = error_body(message, kind, code=code)
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\nRetry-After: 1\r\n\r\n").encode()
    try:
        sock.setblocking(False)
        sock.send(head + body)  # a fresh socket's send buffer takes it whole
    except OSError:
        pass


class Budget:
    """Bytes that may be held at once, over every thread (the body budget)."""

    def __init__(self, total: int):
        self.total, self.used, self.lock = total, 0, threading.Lock()

    def take(self, n: int) -> bool:
        with self.lock:
            if self.used + n > self.total:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self.lock:
            self.used -= n


class ClientReader(io.RawIOBase):
    """A connection's bytes as its handler reads them: first those the disconnect watch took off the
    socket while a request ran (:meth:`absorb`), then the socket's, every read under the current
    ``deadline`` (``time.monotonic``; None: no bound) and counted in ``received``."""

    #: bytes the watch keeps for the next request; a client that sends more while its request runs
    #: is no longer watched for a close (it is not waiting for its answer either)
    MAX_PENDING = 1 * MiB

    def __init__(self, sock: socket.socket):
        super().__init__()
        self.sock, self.pending, self.deadline, self.received = sock, bytearray(), None, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        if self.pending:
            n = min(len(buf), len(self.pending))
            buf[:n] = self.pending[:n]
            del self.pending[:n]
            self.received += n
            return n
        if self.deadline is None:
            self.sock.settimeout(None)
        else:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the client's deadline passed")
            self.sock.settimeout(left)
        n = self.sock.recv_into(buf)
        self.received += n
        return n

    def absorb(self) -> bool | None:
        """Take what the client sent while its request runs: True if it closed the connection, False
        if not (what it sent is kept for the next request), None if it sent more than
        :data:`MAX_PENDING` (stop watching)."""
        try:
            data = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        if not data:
            return True
        self.pending += data
        return None if len(self.pending) > self.MAX_PENDING else False


class SocketWriter(io.BufferedIOBase):
    """The response side: each write goes out whole (``sendall``) under the socket's timeout."""

    def __init__(self, sock: socket.socket):
        super().__init__()
        self.sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.sock.sendall(data)
        return len(data)
