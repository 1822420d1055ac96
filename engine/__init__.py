"""pairbench-engine: a small, readable PyTorch runtime for Llama-architecture models.

It is the default subject that pairbench benchmarks, serving llama.cpp's HTTP API
(docs/contracts.md §1). Public surface: ``load``, ``LoadedModel``, ``__version__``, ``NATIVE``,
and ``engine.generate.{forward_logits, greedy}``.
"""

from pathlib import Path

__version__ = (Path(__file__).resolve().parent / "VERSION").read_text(encoding="utf-8").strip()
ENGINE_NAME = "pairbench-engine"
NATIVE = f"{ENGINE_NAME} {__version__}"

from .weights import LoadedModel, load  # noqa: E402

__all__ = ["ENGINE_NAME", "NATIVE", "LoadedModel", "__version__", "load"]
