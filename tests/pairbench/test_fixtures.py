"""Fixtures: exactly N native tokens for every round, salted per round, checked against every arm."""

import re

import pytest

from pairbench.core.conditions import Condition
from pairbench.measure import fixtures as pb_fixtures
from pairbench.core import tasks


def byte_tokenizer(messages):
    """Like the tiny engine: one token per UTF-8 byte, plus a few template tokens."""
    return [1] + list(messages[0]["content"].encode()) + [2, 3]


def word_tokenizer(messages):
    """A BPE-ish tokenizer: words are 1 token, long words 2, punctuation its own token."""
    out = [0, 0]
    for piece in re.findall(r"\w+|[^\w\s]|\s+", messages[0]["content"]):
        if piece.isspace():
            continue
        out += [hash(piece) % 1000] * (2 if len(piece) > 7 else 1)
    return out


SALTS = {"1": "aa11bb22", "2": "cc33dd44", "3": "ee55ff66"}


def cond(input_tokens: int) -> Condition:
    return Condition.of(input_tokens=input_tokens, output_tokens=8)


@pytest.mark.parametrize("tokenize", [byte_tokenizer, word_tokenizer])
@pytest.mark.parametrize("length", [450, 1000])
def test_every_round_is_exactly_n_tokens(tokenize, length):
    fixture, prompts = pb_fixtures.build_fixture(cond(length), 0, SALTS, "a", tokenize)
    assert (fixture["condition"], fixture["input_tokens"], fixture["output_tokens"]) == (f"in{length}-out8", length, 8)
    assert prompts["condition"] == f"in{length}-out8"
    assert [r["prompt_tokens"] for r in fixture["rounds"]] == [length] * 3
    for rnd in prompts["rounds"]:
        assert len(tokenize(rnd["messages"])) == length
        assert rnd["messages"][0]["content"].startswith(f"Session {SALTS[str(rnd['round'])]}.")
        assert rnd["messages"][0]["content"].endswith(tasks.render_task(tasks.get_task(fixture["task"])))
    # rounds differ (salt) so no round shares a prefix with another; the text hash shows it
    assert len({r["prompt_sha256"] for r in fixture["rounds"]}) == 3


def test_fixture_is_deterministic():
    a = pb_fixtures.build_fixture(cond(600), 0, SALTS, "a", word_tokenizer)
    b = pb_fixtures.build_fixture(cond(600), 0, SALTS, "a", word_tokenizer)
    assert a == b
    c = pb_fixtures.build_fixture(cond(600), 1, SALTS, "a", word_tokenizer)
    assert c[0]["rounds"][0]["prompt_sha256"] != a[0]["rounds"][0]["prompt_sha256"]


def test_token_ids_sha256_is_of_the_ids():
    fixture, prompts = pb_fixtures.build_fixture(cond(500), 0, SALTS, "a", byte_tokenizer)
    ids = prompts["rounds"][0]["token_ids"]
    assert fixture["rounds"][0]["token_ids_sha256"] == pb_fixtures.token_ids_sha256(ids)


def test_arms_that_disagree_fail_with_both_counts():
    fixture, prompts = pb_fixtures.build_fixture(cond(500), 0, SALTS, "a", byte_tokenizer)
    pb_fixtures.check_tokenizer(fixture, prompts, "b", byte_tokenizer)
    assert fixture["checked_by"] == ["a", "b"]
    with pytest.raises(pb_fixtures.FixtureError, match=r"a counts 500 tokens, c counts 501"):
        pb_fixtures.check_tokenizer(fixture, prompts, "c", lambda m: byte_tokenizer(m) + [9])
    with pytest.raises(pb_fixtures.FixtureError, match=r"disagree at token 0 \(both count 500"):
        pb_fixtures.check_tokenizer(fixture, prompts, "d", lambda m: [7] + byte_tokenizer(m)[1:])


def test_length_below_the_fixed_part_is_a_clear_error():
    with pytest.raises(pb_fixtures.FixtureError, match=r"lengths: 64 is shorter than the fixed part"):
        pb_fixtures.build_fixture(cond(64), 0, SALTS, "a", byte_tokenizer)
