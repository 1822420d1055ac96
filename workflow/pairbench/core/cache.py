"""The user's pairbench cache: what is made once per machine and shared by every run and checkout.

``$PAIRBENCH_CACHE``, else ``$XDG_CACHE_HOME/pairbench``, else ``~/.cache/pairbench``. It holds the
llama.cpp repository made from the llama-cpp-python sdist (``llama.cpp/``, ``sdist/``), the compiler
cache of external builds (``ccache/``) and the llama-cpp-python wheel (``wheels/``, install.sh).
Nothing in it is published; a run records hashes and tags, never these paths.
"""

from __future__ import annotations

import os
from pathlib import Path


def user_cache() -> Path:
    if os.environ.get("PAIRBENCH_CACHE"):
        return Path(os.environ["PAIRBENCH_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "pairbench"
