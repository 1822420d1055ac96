"""Which node a visit ran on: its real host name, kept private, and a pseudonym that may be published.

On a cluster, pairing needs every visit of a comparison on one node (docs/cluster.md); the audit
checks it from the pseudonyms in the measure artifacts (pairbench.integrity.audit). The pseudonym is
a hash of the host name under a secret of the run (its private prompt files, which never leave
private/), so the same node reads the same within a run, and a published pseudonym cannot be matched
against a list of likely host names.
"""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path


def hostname() -> str:
    return socket.gethostname()


def run_secret(private_files: list[str]) -> bytes:
    """The run's secret: the bytes of its private prompt files, in the order given."""
    return b"".join(Path(p).read_bytes() for p in private_files)


def pseudonym(host: str, secret: bytes) -> str:
    """``node-<8 hex>`` of *host* under *secret*."""
    digest = hashlib.sha256(b"pairbench.node/v1\0" + secret + b"\0" + host.encode()).hexdigest()
    return f"node-{digest[:8]}"


def pin_extra(extra: str | None, node: str | None) -> str:
    """The ``slurm_extra`` of a visit after the first block of rounds: *extra* (config
    ``resources.extra``) plus ``--nodelist=<node>``, the node the first block ran on, so every block
    of an adaptive run lands on one node. A config that names its own node list keeps it."""
    extra = (extra or "").strip()
    named = any(t.startswith(("-w", "--nodelist")) for t in extra.split())
    return extra if not node or named else f"{extra} --nodelist={node}".strip()
