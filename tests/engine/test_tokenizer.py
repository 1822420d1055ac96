"""Tokenizer units on the tiny model's byte-level tokenizer: round trips, special tokens, the chat
template, and the streaming detokenizer's handling of characters split across tokens."""

from __future__ import annotations

import pytest

import engine
from engine.tokenizer import IncrementalDecoder, Tokenizer
from engine.weights import TINY_CHAT_TEMPLATE, byte_level_tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return engine.load("tiny", max_context=16).tokenizer


@pytest.mark.parametrize("text", ["", "plain ascii", "naïve café – 日本語 🙂", "  spaces\n\ttabs  "])
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert len(ids) == len(text.encode("utf-8"))  # one token per byte
    assert tok.decode(ids) == text


def test_special_tokens_are_single_ids_and_skipped_on_decode(tok):
    ids = tok.encode("<|im_start|>user<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and len(ids) == 6
    assert tok.decode(ids) == "user"
    assert tok.decode(ids, skip_special=False) == "<|im_start|>user<|im_end|>"
    assert tok.eos_id == 2 and tok.stop_ids == {2}


def test_add_special_prepends_bos_only_when_the_model_asks():
    no_bos = Tokenizer(byte_level_tokenizer(), eos_id=2, bos_id=0, add_bos=False)
    bos = Tokenizer(byte_level_tokenizer(), eos_id=2, bos_id=0, add_bos=True)
    assert no_bos.encode("a", add_special=True) == no_bos.encode("a")
    assert bos.encode("a", add_special=True) == [0, *bos.encode("a")]
    assert bos.encode("a") == no_bos.encode("a")


def test_chat_template(tok):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(messages) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert not tok.apply_chat_template(messages, add_generation_prompt=False).endswith("assistant\n")
    assert tok.encode_chat(messages) == tok.encode(tok.apply_chat_template(messages))


def test_template_errors_and_missing_template():
    strict = Tokenizer(byte_level_tokenizer(), eos_id=2,
                       chat_template="{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}"
                                     "{% endif %}" + TINY_CHAT_TEMPLATE)
    with pytest.raises(Exception, match="user first"):
        strict.apply_chat_template([{"role": "assistant", "content": "x"}])
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(byte_level_tokenizer(), eos_id=2).apply_chat_template([{"role": "user", "content": "x"}])


def test_incremental_decoder_never_splits_a_character(tok):
    text = "añb🙂c日"
    det = IncrementalDecoder(tok)
    pieces = [det.push(i) for i in tok.encode(text)]
    assert "".join(pieces) + det.flush() == text
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[1] == "" and pieces[2] == "ñ"  # ñ is two bytes: held back, then emitted whole


def test_incremental_decoder_flushes_an_incomplete_tail(tok):
    det = IncrementalDecoder(tok)
    ids = tok.encode("x🙂")[:-1]  # cut inside the emoji
    assert "".join(det.push(i) for i in ids) == "x"
    assert det.flush() == "\ufffd"
