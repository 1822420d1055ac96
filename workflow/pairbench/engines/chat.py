"""The prompt text a completions-mode engine is sent: the model's own chat template.

An engine whose tokenizer route takes text (llama.cpp's ``/tokenize``, llama-cpp-python's) is sent
the rendered prompt, and that exact text's token count is verified. The template and its BOS/EOS
strings are read from the GGUF metadata, or from a Hugging Face model directory's tokenizer files
(:mod:`pairbench.engines.hfmodel`); the rendering is the embedded engine's own
(``engine/tokenizer.py: compile_chat_template``), loaded from this checkout's file without
importing the engine package (and torch), so there is one chat-template renderer in the repository.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

from pairbench.engines.hfmodel import chat_template
from pairbench.engines.profiles import REPO, EngineError


@functools.lru_cache(maxsize=1)
def _renderer():
    path = REPO / "engine" / "tokenizer.py"
    spec = importlib.util.spec_from_file_location("pairbench_engine_tokenizer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compile_chat_template


@functools.lru_cache(maxsize=4)
def gguf_chat(path: str) -> tuple[str, str, str]:
    """``(chat_template, bos_token, eos_token)`` from a GGUF file's metadata."""
    from gguf import GGUFReader

    reader = GGUFReader(path)

    def value(key: str):
        f = reader.fields.get(key)
        if f is None:
            return None
        return f.contents() if hasattr(f, "contents") else f.parts[f.data[0]]

    tmpl = value("tokenizer.chat_template")
    if tmpl is None:
        raise EngineError(f"model: {path} has no tokenizer.chat_template in its GGUF metadata")
    if not isinstance(tmpl, str):
        tmpl = bytes(tmpl).decode()
    tokens = reader.fields["tokenizer.ggml.tokens"]

    def token(id_key: str) -> str:
        f = reader.fields.get(id_key)
        if f is None:
            return ""
        idx = int(f.parts[f.data[0]][0])
        return bytes(tokens.parts[tokens.data[idx]]).decode()

    return tmpl, token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")


def render_chat_prompt(model_path: str | os.PathLike, messages: list[dict]) -> str:
    """The model's chat template applied to *messages*, generation prompt added: the exact text a
    completions-mode engine is sent and whose token count is verified. *model_path* is a GGUF file
    or a Hugging Face model directory."""
    path = Path(model_path)
    tmpl, bos, eos = chat_template(str(path)) if path.is_dir() else gguf_chat(str(path))
    return _renderer()(tmpl).render(messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos)
