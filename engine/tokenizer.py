"""Tokenizer: a ``tokenizers.Tokenizer`` plus the model's special ids and its jinja2 chat template.

The chat template is rendered the way Hugging Face ``apply_chat_template`` does it (sandboxed jinja2,
``trim_blocks``/``lstrip_blocks``, ``raise_exception``, ``bos_token``/``eos_token`` in scope), so
templates taken from GGUF metadata render exactly as they do upstream.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import jinja2.sandbox
import tokenizers


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def compile_chat_template(source: str) -> jinja2.Template:
    """A chat template compiled as Hugging Face ``apply_chat_template`` does: sandboxed jinja2,
    ``trim_blocks``/``lstrip_blocks``, ``raise_exception`` and a non-ASCII-preserving ``tojson``.

    The one renderer of chat templates in the repository: the harness loads this file to render the
    prompt it sends a completions-mode engine (pairbench.engines.chat), so both agree by construction.
    """
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    return env.from_string(source)


class Tokenizer:
    def __init__(self, tok: tokenizers.Tokenizer, *, eos_id: int, bos_id: int | None = None,
                 add_bos: bool = False, chat_template: str | None = None, stop_ids: list[int] | None = None):
        self.tok = tok
        self.eos_id = eos_id
        self.bos_id = bos_id
        self.add_bos = add_bos
        self.chat_template = chat_template
        # Tokens that end a generation: EOS plus any end-of-turn ids the model declares.
        self.stop_ids = frozenset([eos_id, *(stop_ids or [])])
        self._template = compile_chat_template(chat_template) if chat_template is not None else None

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of ``text``. Special tokens written in the text (``<|im_start|>``) are recognised;
        ``add_special`` prepends BOS when the model asks for one."""
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if self._template is None:
            raise ValueError("this model has no chat template")
        bos = self.tok.id_to_token(self.bos_id) if self.bos_id is not None else ""
        eos = self.tok.id_to_token(self.eos_id) or ""
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     bos_token=bos or "", eos_token=eos)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """The prompt ids of a chat request: template applied, generation prompt added."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt=True), add_special=True)


def write_hf_dir(tokenizer: Tokenizer, name: str, context_length: int, out_dir) -> Path:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` (+ ``special_tokens_map.json``) that
    ``transformers.AutoTokenizer.from_pretrained(out_dir)`` loads as this model's tokenizer: the same
    ids for the same text, the same chat template. For clients that count tokens themselves (AIPerf,
    guidellm) without a model hub. Returns ``out_dir``."""
    from tokenizers.processors import TemplateProcessing

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizers.Tokenizer.from_str(tokenizer.tok.to_str())  # a copy: the engine's stays untouched
    name_of = tokenizer.tok.id_to_token
    bos = name_of(tokenizer.bos_id) if tokenizer.bos_id is not None else None
    if tokenizer.add_bos and bos is not None:
        tok.post_processor = TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                special_tokens=[(bos, tokenizer.bos_id)])
    tok.save(str(out / "tokenizer.json"))
    specials = {"eos_token": name_of(tokenizer.eos_id)}
    if bos is not None:
        specials["bos_token"] = bos
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": context_length,
              "clean_up_tokenization_spaces": False, "add_bos_token": bool(tokenizer.add_bos),
              "name_or_path": name, **specials}
    if tokenizer.chat_template is not None:
        config["chat_template"] = tokenizer.chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2, sort_keys=True) + "\n",
                                                 encoding="utf-8")
    return out


class IncrementalDecoder:
    """Turns a stream of token ids into text pieces without splitting multi-byte UTF-8 characters.

    Byte-level BPE tokens can end in the middle of a character; such a piece is held back until a
    later token completes it. Only a short window is re-decoded per token (vLLM's prefix/read
    offsets), so streaming stays O(1) per token."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # start of the window re-decoded for context
        self.read = 0  # ids before this have been emitted as text

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        decode = self.tokenizer.decode
        prefix_text = decode(self.ids[self.prefix:self.read])
        new_text = decode(self.ids[self.prefix:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return new_text[len(prefix_text):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes as U+FFFD)."""
        decode = self.tokenizer.decode
        prefix_text = decode(self.ids[self.prefix:self.read])
        new_text = decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return new_text[len(prefix_text):]
