"""A GGUF file's header metadata, read directly: its scalar and string keys, without its tensors.

The format (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): ``GGUF``, a version, the
tensor count, the metadata count, then each metadata entry as a length-prefixed key, a value type
and the value. ``gguf.GGUFReader`` (the ``gguf`` package) reads the same, but maps every tensor as
well, which takes seconds on a 100 MB model; the config is checked on every snakemake invocation (a
no-op rerun included), so only the header is read here (tests/pairbench/test_config.py checks the two
agree on a real model).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

# GGUF metadata value types: the struct format of each fixed-size scalar; 8 = string, 9 = array.
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class GGUFError(ValueError):
    """A file that is not a readable GGUF header; the message names the file."""


class _Header:
    def __init__(self, fh: BinaryIO, path: str | Path):
        self.fh, self.path = fh, path

    def read(self, fmt: str):
        size = struct.calcsize(fmt)
        data = self.fh.read(size)
        if len(data) != size:
            raise GGUFError(f"{self.path} ends inside its GGUF header")
        return struct.unpack(fmt, data)[0]

    def string(self) -> str:
        return self.fh.read(self.read("<Q")).decode("utf-8", errors="replace")

    def skip(self, vtype: int) -> None:
        if vtype in SCALARS:
            self.fh.seek(struct.calcsize(SCALARS[vtype]), 1)
        elif vtype == STRING:
            self.fh.seek(self.read("<Q"), 1)
        elif vtype == ARRAY:
            itype, n = self.read("<I"), self.read("<Q")
            if itype in SCALARS:
                self.fh.seek(n * struct.calcsize(SCALARS[itype]), 1)
            else:
                for _ in range(n):
                    self.skip(itype)
        else:
            raise GGUFError(f"{self.path} has an unknown GGUF metadata type {vtype}")


def metadata(path: str | Path) -> dict:
    """Scalar and string metadata of the GGUF file at *path* (arrays are skipped)."""
    out: dict = {}
    with open(path, "rb") as fh:
        h = _Header(fh, path)
        if fh.read(4) != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file (bad magic)")
        version = h.read("<I")
        if version < 2:
            raise GGUFError(f"{path} is GGUF version {version}; only v2+ is supported")
        h.read("<Q")  # tensor count
        for _ in range(h.read("<Q")):
            key, vtype = h.string(), h.read("<I")
            if vtype in SCALARS:
                out[key] = h.read(SCALARS[vtype])
            elif vtype == STRING:
                out[key] = h.string()
            else:
                h.skip(vtype)
    return out


def context_length(path: str | Path) -> int:
    """The trained context length a GGUF file states (``<general.architecture>.context_length``)."""
    meta = metadata(path)
    arch = meta.get("general.architecture")
    if arch is None:
        raise GGUFError(f"{path} has no general.architecture in its GGUF metadata")
    ctx = meta.get(f"{arch}.context_length")
    if ctx is None:
        raise GGUFError(f"{path} has no {arch}.context_length in its GGUF metadata")
    return int(ctx)
