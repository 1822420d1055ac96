"""A tiny local Hugging Face model directory, made on the spot (no download): what a vLLM or SGLang
user hands pairbench as ``model:``.

``config.json`` (a 2,048-token context), ``tokenizer.json`` built with the ``tokenizers`` library,
``tokenizer_config.json`` with a ChatML chat template, and a one-tensor ``model.safetensors``. The
tokenizer is the fake server's own (tests/fakes/fake_serve: id = byte + 3, 1 = ``<|im_start|>``,
2 = ``<|im_end|>``), written as a byte-level BPE without merges, and the template is its template,
so the directory's tokenizer and the fake server count every prompt alike.
"""

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

CONTEXT = 2048
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2; bytes follow from 3
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_table() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which the byte-level pre-tokenizer maps bytes through."""
    table, n = {}, 0
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


def tokenizer() -> Tokenizer:
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    vocab.update({ch: b + len(SPECIALS) for b, ch in byte_table().items()})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    return tok


def make_tiny_hf(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    vocab_size = len(SPECIALS) + 256
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab_size, "hidden_size": 8,
        "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1,
        "max_position_embeddings": CONTEXT, "bos_token_id": None, "eos_token_id": 2, "torch_dtype": "float32"},
        indent=2))
    tokenizer().save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": None, "eos_token": {"content": "<|im_end|>", "special": True}, "chat_template": CHAT_TEMPLATE,
        "model_max_length": CONTEXT, "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))
    save_file({"model.embed_tokens.weight": np.zeros((vocab_size, 8), dtype=np.float32)},
              str(directory / "model.safetensors"))
    return directory
