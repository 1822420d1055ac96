"""A local Hugging Face model directory as the harness reads it: its chat template and its tokenizer.

A model given as a directory (``config.json``, the tokenizer files, ``*.safetensors``: what
``huggingface-cli download <repo> --local-dir <dir>`` writes) is handed to engines that read it
(vLLM, SGLang: ``model_formats`` in their profile). The harness itself reads two things from it:

- the chat template, for an engine in completions mode (the exact text it is sent): from
  ``chat_template.jinja`` where it exists, else ``tokenizer_config.json``'s ``chat_template`` (a
  string, or a list of named templates: the ``default`` one), with its ``bos_token`` and
  ``eos_token``; rendered as ``transformers``' ``apply_chat_template`` renders it
  (:func:`pairbench.engines.chat.render_chat_prompt`);
- the tokenizer (``tokenizer.json``, read by the ``tokenizers`` package), for an engine whose
  profile counts prompt tokens with the model's own tokenizer (``tokenize.route: model``): the
  text the server is sent, encoded with special tokens added where a completions request adds
  them and not after a chat template (which holds its own), as vLLM and SGLang do.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from pairbench.engines.specs import EngineError

__all__ = ["chat_template", "encode"]


def _token_text(value) -> str:
    """A special token as tokenizer_config.json gives it: a string, or an AddedToken dict, or null."""
    if isinstance(value, dict):
        return str(value.get("content") or "")
    return value or ""


def chat_template(directory: str) -> tuple[str, str, str]:
    """``(chat_template, bos_token, eos_token)`` of the model directory *directory* (small files,
    read at each call: what is on disk is what is rendered)."""
    d = Path(directory)
    config_path = d / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if (d / "chat_template.jinja").is_file():
        template = (d / "chat_template.jinja").read_text()
    else:
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if not isinstance(template, str) or not template:
        raise EngineError(f"model: {directory} has no chat template (chat_template.jinja, or chat_template in "
                          "tokenizer_config.json)")
    return template, _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))


@functools.lru_cache(maxsize=4)
def _tokenizer(directory: str):
    from tokenizers import Tokenizer

    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        raise EngineError(f"model: {directory} has no tokenizer.json, which its engine's profile counts prompt "
                          "tokens with (tokenize.route: model)")
    return Tokenizer.from_file(str(path))


def encode(directory: str, text: str, *, add_special_tokens: bool) -> list[int]:
    """The token ids of *text* by the model directory's own ``tokenizer.json``."""
    return list(_tokenizer(str(directory)).encode(text, add_special_tokens=add_special_tokens).ids)
