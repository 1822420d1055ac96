"""One exchange with an engine, as values: where the server is, the request prepared, what came back.

:meth:`pairbench.engines.adapter.ArmEngine.exchange` owns one measured request end to end: it builds
the body from the condition (every factor is a template value of the engine's profile), counts the
prompt where the engine's replies carry no count, flushes, streams, reads the stream's shape and
gates the reply. A load level runs the same two halves around its concurrent streams
(:meth:`~pairbench.engines.adapter.ArmEngine.prepare` before, :meth:`~pairbench.engines.adapter.ArmEngine.judge`
after). These are the values they pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pairbench.engines.client import StreamResult


@dataclass(frozen=True)
class Link:
    """How the harness reaches one running server: its URL, the HTTP client, the request timeout
    and the server's log (read for the engines whose cold-cache evidence is logged)."""

    url: str
    http: object  # an httpx.Client (pairbench.engines.client.http)
    timeout_s: float
    log: Path | None = None


@dataclass(frozen=True)
class Prepared:
    """One request ready to send: the path and body in the engine's dialect, and the prompt's
    native token count where only the server's tokenizer says it (None: the reply carries it)."""

    path: str
    body: dict
    tokenize_count: int | None = None


@dataclass(frozen=True)
class Exchange:
    """One request as the engine answered it: what streamed (:class:`StreamResult`: text, token
    ids, each token's arrival, the engine's usage and timings), the gates (``{gate: True|False|None}``:
    None where the engine cannot prove it), a flag per reason, and the facts the gates read
    (``prompt_tokens``, ``completion_tokens``, ``tokens_cached``, ``cold_cache_proof``)."""

    result: StreamResult
    gates: dict
    flags: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No gate failed (a gate the engine cannot decide is flagged, not failed)."""
        return all(g is not False for g in self.gates.values())
