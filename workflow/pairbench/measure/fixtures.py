"""Synthetic frozen fixtures: per round, one chat message of *exactly* N native tokens.

Each fixture is one user message: ``Session <salt>.`` (the salt of the round and condition,
:func:`pairbench.core.plan.salt`)
then deterministic synthetic prose filler, then a small Python-function-completion task
(``pairbench.core.tasks.render_task``), as in a code-completion workload. N counts the whole chat
template (role markers, generation prompt), because that is what the engine prefills.

Exact length: the filler is a deterministic word stream; a binary search over its word count (with
the engine's own ``/tokenize``) finds the longest prefix that fits, then single-token pads close
the gap. Every arm's ``/tokenize`` is then asked about every round's message and must return the
same token ids; otherwise :class:`FixtureError` reports both counts.

One fixture per condition (:mod:`pairbench.core.conditions`), of its ``input_tokens``. The fixture
artifact (``fixtures/<condition>.json``) holds hashes and counts only; the messages and token ids
stay in ``private/prompts/<condition>.json``.

A load level sends many requests per round: its fixture holds, per round, ``requests`` (warm-up ones
first), each of exactly ``input_tokens`` tokens and with its own salt
(``salt(seed, round, condition, i)``), so no request can reuse another's prefix; the round's own
fields are its first request's. With ``load.prefix: shared`` every request of a level sends the
round's one prompt (disclosed). Fitting hundreds of prompts stays fast: each fit's search starts from
the previous prompt's word count (the salts differ, the filler does not), so most take two or three
``/tokenize`` calls instead of a binary search.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Callable

from pairbench.core.conditions import Condition
from pairbench.core import tasks
from pairbench.core.plan import salt as request_salt

Tokenizer = Callable[[list[dict]], list[int]]

_SUBJECTS = ["the librarian", "a small team", "the old mill", "our neighbour", "the river", "a visiting teacher",
             "the market", "the night train", "a careful editor", "the garden club", "the baker", "a quiet student"]
_VERBS = ["opens", "repairs", "describes", "visits", "paints", "counts", "follows", "collects", "explains",
          "measures", "plans", "remembers"]
_OBJECTS = ["the wooden bridge", "a long list of names", "the morning schedule", "three green lamps",
            "the village square", "a box of maps", "the spring festival", "an empty notebook",
            "the harbour wall", "two old lime trees", "the reading room", "a stack of letters"]
_TAILS = ["before noon", "every Tuesday", "with great care", "after the rain", "near the station",
          "in the evening", "without a word", "for the first time", "on the north side", "once a month"]
# Appended one at a time to close the last gap; each is normally exactly one token.
PADS = [" -", " .", " a", " I", " x", " =", ".", ",", " 1"]


class FixtureError(Exception):
    """A fixture cannot be built to its exact length, or the arms' tokenizers disagree."""


def filler_words(seed: int, length: int, n: int) -> list[str]:
    """The first *n* words of the deterministic filler stream for (*seed*, *length*)."""
    rng = random.Random(f"pairbench-filler:{seed}:{length}")
    words: list[str] = []
    while len(words) < n:
        sentence = f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}."
        words += sentence.split()
    return words[:n]


def make_messages(salt: str, filler: str, task_text: str) -> list[dict]:
    body = f"Session {salt}.\n\n{filler}\n\n{task_text}" if filler else f"Session {salt}.\n\n{task_text}"
    return [{"role": "user", "content": body}]


def messages_sha256(messages: list[dict]) -> str:
    """sha256 of the canonical JSON of the messages (sorted keys, no spaces, UTF-8), as verify computes it."""
    text = json.dumps(messages, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def token_ids_sha256(ids: list[int]) -> str:
    """sha256 of the ids as comma-separated decimal ASCII (``"1,2,3"``)."""
    return hashlib.sha256(",".join(str(i) for i in ids).encode()).hexdigest()


def fit_round(length: int, salt: str, seed: int, task_text: str, tokenize: Tokenizer,
              start: int | None = None) -> dict:
    """Build one round's message with exactly *length* native tokens.

    *start*: a word count to search from (the previous prompt's, whose count is near); without it a
    binary search from scratch. Returns ``{"messages", "token_ids", "filler_words", "pads"}``.
    """
    def build(n: int, pads: str = "") -> list[dict]:
        return make_messages(salt, " ".join(filler_words(seed, length, n)) + pads, task_text)

    def fits(n: int) -> bool:
        return len(tokenize(build(n))) <= length

    if start is not None and fits(start):  # walk up from the hint while the next word still fits
        lo = start
        while fits(lo + 1):
            lo += 1
    elif start is not None and start > 0 and fits(start - 1):
        lo = start - 1
    else:
        base = len(tokenize(build(0)))
        if base > length:
            raise FixtureError(
                f"lengths: {length} is shorter than the fixed part of the prompt (salt, task and chat "
                f"template: {base} tokens)"
            )
        lo, hi = 0, max(1, length - base)  # every word is at least one token
        while lo < hi:  # largest n with count(n) <= length
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
    n = lo
    pads, npads = "", 0
    ids = tokenize(build(n, pads))
    while len(ids) < length:
        for pad in PADS:
            trial = tokenize(build(n, pads + pad))
            if len(trial) == len(ids) + 1:
                pads, ids, npads = pads + pad, trial, npads + 1
                break
        else:
            raise FixtureError(f"lengths: cannot pad the fixture from {len(ids)} to exactly {length} tokens")
    if len(ids) != length:
        raise FixtureError(f"lengths: fixture came out at {len(ids)} tokens, not {length}")
    return {"messages": build(n, pads), "token_ids": ids, "filler_words": n, "pads": npads}


def _public(fit: dict, salt: str) -> dict:
    return {"salt": salt, "prompt_tokens": len(fit["token_ids"]), "prompt_sha256": messages_sha256(fit["messages"]),
            "token_ids_sha256": token_ids_sha256(fit["token_ids"]), "filler_words": fit["filler_words"],
            "pads": fit["pads"]}


def build_fixture(condition: Condition, seed: int, salts: dict[str, str], arm: str,
                  tokenize: Tokenizer, requests: int | None = None) -> tuple[dict, dict]:
    """Fit every round of *condition*'s fixture (its ``input_tokens``) with *arm*'s tokenizer.

    Returns ``(fixture_body, prompts_body)``: the public artifact body (hashes, counts) and the
    private one (messages, token ids). *salts* maps round (as a string) to its salt. *requests*: a
    load level's prompts per round (each with its own salt), None for one prompt per round (a
    steady condition, or a load level with a shared prefix).
    """
    length = condition.input_tokens
    task = tasks.task_for(length)
    task_text = tasks.render_task(task)
    rounds, private = [], []
    hint = None
    for rnd in sorted(salts, key=int):
        fits = []
        for i in range(requests or 1):
            s = salts[rnd] if requests is None else request_salt(seed, int(rnd), condition.id, i)
            fit = fit_round(length, s, seed, task_text, tokenize, start=hint)
            hint = fit["filler_words"] if requests is not None else None  # a steady fixture: as it always was
            fits.append((s, fit))
        first_salt, first = fits[0]
        pub = {"round": int(rnd), **_public(first, first_salt)}
        priv = {"round": int(rnd), "messages": first["messages"], "token_ids": first["token_ids"]}
        if requests is not None:
            pub["requests"] = [{"index": i, **_public(f, s)} for i, (s, f) in enumerate(fits)]
            priv["requests"] = [{"index": i, "messages": f["messages"], "token_ids": f["token_ids"]}
                                for i, (_, f) in enumerate(fits)]
        rounds.append(pub)
        private.append(priv)
    fixture = {"condition": condition.id, **dict(condition.values), "task": task.name, "seed": seed,
               "checked_by": [arm], "rounds": rounds}
    return fixture, {"condition": condition.id, "rounds": private}


def check_tokenizer(fixture: dict, prompts: dict, arm: str, tokenize: Tokenizer) -> None:
    """Ask *arm*'s tokenizer about every round; it must give the very same ids. Adds it to ``checked_by``."""
    ref = fixture["checked_by"][0]
    for rnd, req in ((r, q) for r in prompts["rounds"] for q in r.get("requests") or [r]):
        mine, theirs = req["token_ids"], tokenize(req["messages"])
        if theirs == mine:
            continue
        where = f"fixture {fixture['condition']}, round {rnd['round']}" + (
            f", request {req['index']}" if "index" in req else "")
        if len(theirs) != len(mine):
            raise FixtureError(f"lengths: {where}: the arms' tokenizers disagree: {ref} counts {len(mine)} "
                               f"tokens, {arm} counts {len(theirs)}")
        pos = next(i for i, (a, b) in enumerate(zip(theirs, mine)) if a != b)
        raise FixtureError(f"lengths: {where}: the arms' tokenizers disagree at token {pos} "
                           f"(both count {len(mine)} tokens)")
    fixture["checked_by"].append(arm)
