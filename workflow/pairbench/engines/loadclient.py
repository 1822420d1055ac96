"""The load client: concurrent streamed requests on one asyncio loop, timed per request and per level.

One level is a list of prepared requests (``path`` + body, built by the arm's adapter exactly as a
steady request is) sent one of two ways:

- **closed loop** (:meth:`LoadClient.closed_loop`): N streams; each sends its next request as soon
  as its last one finished, until the list is used up;
- **open loop** (:meth:`LoadClient.open_loop`): request i is sent at offset i of a schedule
  (:mod:`pairbench.core.schedule`), never waiting for any reply.

The client is idle while it waits: one asyncio event loop and ``httpx.AsyncClient`` streams, no
threads and no polling, so on a 2-CPU machine it leaves the server its CPU. The loop and the HTTP
client are built once (:class:`LoadClient` is a context manager holding an ``asyncio.Runner``) and
reused by every level, so building them (~0.1 s of CPU for the TLS context) lands in no level.

Per request it records raw times only (``time.perf_counter``, in s): when it was due, when it was
sent and when it ended, since the level started, and each token's arrival since the request was sent
(exactly as the steady client stamps them); the engine's usage counts, its llama.cpp ``timings``
when present, the text and token ids, and the error, if any. Nothing is derived here: TTFT, the
inter-token gaps, e2e and the schedule lag are the statistics' to compute
(:mod:`pairbench.analysis.loadlevel`), so a change to their definitions reruns ``stats``, not the
measurement. Each line of a reply is read by the arm's adapter
(:meth:`pairbench.engines.adapter.ArmEngine.read_line`, handed in as *read_line*: server-sent
OpenAI-compatible chunks by default), so a token is counted the same way in a steady and a load
request, and an engine that streams another shape is read the same way in both.

A request that fails is an *error*, never a sample: ``kind`` is ``timeout`` (the whole request
passed ``timeout_s``: a stalled stream lands here), ``http`` (a non-200 status), ``dropped`` (the
stream or connection ended before ``data: [DONE]``), ``malformed`` (an event that is not a JSON
object) or ``connect``. Per level it records the wall time (first send → last request finished) and
the client's CPU time over the same span (``time.process_time``: this process's user + system
time, all threads).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import asdict, dataclass, field

import httpx

from pairbench.engines.client import ClientError, LineReader, StreamResult, read_sse_line

ERROR_KINDS = ("timeout", "http", "dropped", "malformed", "connect")


@dataclass(frozen=True)
class LoadRequest:
    """One prepared request: the path (``/v1/chat/completions`` or ``/v1/completions``) and its body."""

    path: str
    body: dict

    def __post_init__(self):
        if self.body.get("stream") is not True:
            raise ValueError(f"load request to {self.path}: the body must ask for a stream ('stream': true)")


@dataclass(frozen=True)
class RequestRecord:
    """What one request of a level did: raw times (s since the level started) and what streamed."""

    index: int                       # position in the level's request list
    warmup: bool                     # one of the level's first ``warmup`` requests (sent, not measured)
    stream: int | None               # closed loop: the stream (0..N-1) that sent it
    scheduled_s: float               # when it was due
    sent_s: float                    # when it was sent
    end_s: float                     # when it finished (or failed)
    result: StreamResult             # text, token ids, each token's arrival (s since sent), usage, timings
    error: str | None = None
    error_kind: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def streamed_tokens(self) -> int:
        return len(self.result.token_times)

    @property
    def usage(self) -> dict | None:
        """The engine's usage, verbatim (for the adapter's gates)."""
        return self.result.usage if isinstance(self.result.usage, dict) else None

    @property
    def prompt_tokens(self) -> int | None:
        return (self.usage or {}).get("prompt_tokens")

    @property
    def completion_tokens(self) -> int | None:
        return (self.usage or {}).get("completion_tokens")

    @property
    def cached_tokens(self) -> int | None:
        """usage.prompt_tokens_details.cached_tokens, else the top-level tokens_cached."""
        return _cached(self.usage, self.result.tokens_cached)

    @property
    def timings(self) -> dict | None:
        """llama.cpp's timings, verbatim."""
        return self.result.timings

    def times(self) -> dict:
        """The request's raw times, as a level record keeps them for the statistics: ``scheduled_s``,
        ``sent_s``, ``end_s`` (since the level started), ``token_s`` (each token's arrival since the
        request was sent), the engine's ``completion_tokens``, the error and its kind."""
        return {"index": self.index, "warmup": self.warmup, "stream": self.stream, "scheduled_s": self.scheduled_s,
                "sent_s": self.sent_s, "end_s": self.end_s, "token_s": list(self.result.token_times),
                "completion_tokens": self.completion_tokens, "error_kind": self.error_kind, "error": self.error}

    def to_dict(self) -> dict:
        """Everything about the request (the level's private body): its times, the engine's counts,
        usage and timings verbatim, the text and token ids."""
        r = self.result
        return {**self.times(), "streamed_tokens": self.streamed_tokens, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens, "finish_reason": r.finish_reason, "usage": self.usage,
                "timings": r.timings, "tokens_cached": r.tokens_cached, "text": r.text, "token_ids": list(r.token_ids),
                "ok": self.ok}


@dataclass(frozen=True)
class LevelRun:
    """One level as the client ran it."""

    factor: str                      # the condition's load factor: "concurrency" (closed loop) | "rate" (open loop)
    target: float | None             # its value: streams, or the schedule's nominal requests/s
    offered_rate_rps: float | None   # open loop: what the schedule offers, (n − 1) / its span
    timeout_s: float
    warmup: int
    wall_s: float                    # first send → last request finished
    cpu_s: float                     # this process's CPU time over the level (time.process_time)
    records: tuple[RequestRecord, ...] = field(default_factory=tuple)

    def client(self) -> dict:
        """What the statistics read of the level (:mod:`pairbench.analysis.loadlevel`): the wall and
        client CPU time, the schedule's offered rate, and every request's raw times."""
        return {"wall_s": self.wall_s, "cpu_s": self.cpu_s, "offered_rate_rps": self.offered_rate_rps,
                "requests": [r.times() for r in self.records]}

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("factor", "target", "offered_rate_rps", "timeout_s", "warmup", "wall_s",
                                           "cpu_s")}
        d["records"] = [r.to_dict() for r in self.records]
        return d


def _cached(usage: dict | None, tokens_cached) -> int | None:
    details = (usage or {}).get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        return details["cached_tokens"]
    return tokens_cached


class _Failure(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


async def _stream(http: httpx.AsyncClient, url: str, req: LoadRequest, result: StreamResult, sent: float,
                  read_line: LineReader) -> None:
    """Read one streamed reply into *result* (token times relative to *sent*); raise :class:`_Failure`."""
    async with http.stream("POST", url + req.path, json=req.body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            raise _Failure("http", f"HTTP {resp.status_code}: {resp.text[:200]}")
        async for line in resp.aiter_lines():
            now = time.perf_counter() - sent
            try:
                if read_line(result, line, now):
                    result.done = True
                    return
            except ClientError as exc:
                raise _Failure("malformed", str(exc)) from None


async def _one(http: httpx.AsyncClient, url: str, req: LoadRequest, *, index: int, warmup: bool,
               stream: int | None, t0: float, scheduled_s: float, timeout_s: float,
               read_line: LineReader) -> RequestRecord:
    result = StreamResult()
    sent = time.perf_counter()
    error = kind = None
    try:
        async with asyncio.timeout(timeout_s):
            await _stream(http, url, req, result, sent, read_line)
        if not result.done:
            kind, error = "dropped", f"stream ended without [DONE] after {len(result.token_times)} tokens"
    except TimeoutError:
        kind, error = "timeout", f"request exceeded {timeout_s:g} s (after {len(result.token_times)} tokens)"
    except _Failure as exc:
        kind, error = exc.kind, str(exc)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        kind, error = "connect", f"{type(exc).__name__}: {exc}"
    except httpx.HTTPError as exc:  # RemoteProtocolError, ReadError: the connection broke mid-stream
        kind, error = "dropped", f"stream broke after {len(result.token_times)} tokens: {type(exc).__name__}: {exc}"
    end = time.perf_counter()
    result.e2e_s = end - sent
    return RequestRecord(index=index, warmup=warmup, stream=stream, scheduled_s=scheduled_s, sent_s=sent - t0,
                         end_s=end - t0, result=result, error=error, error_kind=kind)


class LoadClient:
    """One event loop and one ``httpx.AsyncClient`` for a visit's levels against the server at *url*.

    ``with LoadClient(url) as lc: run = lc.closed_loop(requests, 8, timeout_s=60)``. Not thread-safe;
    one level at a time. *read_line* reads each line of a reply (default: server-sent events).
    """

    def __init__(self, url: str, *, connect_timeout_s: float = 10.0, read_line: LineReader = read_sse_line):
        self.url = url.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self.read_line = read_line  # the stream's shape (the arm's adapter's ArmEngine.read_line)
        self._runner: asyncio.Runner | None = None
        self._http: httpx.AsyncClient | None = None

    def __enter__(self) -> "LoadClient":
        self._runner = asyncio.Runner()
        self._runner.__enter__()

        async def make() -> httpx.AsyncClient:
            # no pool limit: an open-loop level must never queue a send behind busy connections (the
            # wait would hide in TTFT); trust_env=False: no proxy between the harness and 127.0.0.1
            return httpx.AsyncClient(trust_env=False, limits=httpx.Limits(max_connections=None,
                                                                           max_keepalive_connections=None),
                                     timeout=httpx.Timeout(None, connect=self.connect_timeout_s))

        self._http = self._runner.run(make())
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._http is not None:
                self._runner.run(self._http.aclose())
        finally:
            self._runner.__exit__(*exc)
            self._runner = self._http = None

    def _ready(self) -> None:
        if self._runner is None:
            raise RuntimeError("LoadClient is used outside its 'with' block")

    def closed_loop(self, requests: list[LoadRequest], concurrency: int, *, timeout_s: float,
                    warmup: int = 0) -> LevelRun:
        """N = *concurrency* streams share *requests* in order; each sends its next one when its last
        one finished. The first *warmup* requests (in list order) are marked ``warmup``."""
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"load.concurrency: must be a positive integer, got {concurrency!r}")
        _check(requests, timeout_s, warmup)
        self._ready()
        http, url, read = self._http, self.url, self.read_line

        async def level():
            queue = iter(enumerate(requests))
            records: list[RequestRecord] = []
            cpu0, t0 = time.process_time(), time.perf_counter()

            async def stream(k: int) -> None:
                free = 0.0  # the moment this stream became free, since t0
                for i, req in queue:  # shared iterator: no await between next() and the send
                    rec = await _one(http, url, req, index=i, warmup=i < warmup, stream=k, t0=t0, scheduled_s=free,
                                     timeout_s=timeout_s, read_line=read)
                    records.append(rec)
                    free = rec.end_s

            await asyncio.gather(*(stream(k) for k in range(concurrency)))
            return records, time.perf_counter() - t0, time.process_time() - cpu0

        records, wall, cpu = self._runner.run(level())
        return _level("concurrency", concurrency, records, wall, cpu, offered=None, timeout_s=timeout_s,
                      warmup=warmup)

    def open_loop(self, requests: list[LoadRequest], offsets_s, *, timeout_s: float, warmup: int = 0,
                  rate_rps: float | None = None) -> LevelRun:
        """Send request i at ``offsets_s[i]`` seconds after the level starts (the first at its offset,
        normally 0), never waiting for replies; *rate_rps* is the schedule's nominal rate, recorded."""
        offsets = [float(x) for x in offsets_s]
        if len(offsets) != len(requests):
            raise ValueError(f"open loop: {len(requests)} requests but {len(offsets)} schedule offsets")
        if any(b < a for a, b in zip(offsets, offsets[1:])) or (offsets and offsets[0] < 0):
            raise ValueError("open loop: schedule offsets must be non-negative and non-decreasing")
        _check(requests, timeout_s, warmup)
        self._ready()
        http, url, read = self._http, self.url, self.read_line

        async def level():
            tasks = []
            cpu0, t0 = time.process_time(), time.perf_counter()
            for i, (req, off) in enumerate(zip(requests, offsets)):
                delay = t0 + off - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(_one(http, url, req, index=i, warmup=i < warmup, stream=None,
                                                      t0=t0, scheduled_s=off, timeout_s=timeout_s,
                                                      read_line=read)))
            records = list(await asyncio.gather(*tasks))
            return records, time.perf_counter() - t0, time.process_time() - cpu0

        records, wall, cpu = self._runner.run(level())
        span = offsets[-1] - offsets[0] if offsets else 0.0
        offered = (len(offsets) - 1) / span if span > 0 else None
        return _level("rate", rate_rps, records, wall, cpu, offered=offered, timeout_s=timeout_s, warmup=warmup)


def _check(requests: list[LoadRequest], timeout_s: float, warmup: int) -> None:
    if not requests:
        raise ValueError("load level: no requests")
    if not all(isinstance(r, LoadRequest) for r in requests):
        raise TypeError("load level: requests must be LoadRequest objects")
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"server.request_timeout_s: must be a positive number of seconds, got {timeout_s!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup < len(requests):
        raise ValueError(f"load.warmup: must be an integer in [0, {len(requests)}), got {warmup!r}")


def _level(factor, target, records, wall, cpu, *, offered, timeout_s, warmup) -> LevelRun:
    # t0 (the level's 0) is read immediately before the first send, so wall_s spans first send → last end
    return LevelRun(factor=factor, target=target, offered_rate_rps=offered, timeout_s=float(timeout_s),
                    warmup=warmup, wall_s=wall, cpu_s=cpu, records=tuple(sorted(records, key=lambda r: r.index)))
