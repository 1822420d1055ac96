"""Visit orders: which arm goes when within each round, counterbalanced across rounds.

A *visit* is one arm in one round. Within a round every arm is visited once; across rounds the
order is counterbalanced so drift (thermal, background load) cannot favour one arm:

- ``abba``: round r runs the arms rotated by r-1 — with two arms AB, BA, AB, BA … (ABBA);
- ``random``: seeded and balanced — within each block of k rounds (k arms) every arm goes first
  exactly once, the block's order drawn from ``random.Random(seed)``;
- ``williams``: a Williams design (Williams 1949), balanced for first-order carryover: over one
  block every arm takes every position once, and every ordered pair of arms is adjacent (one
  directly after the other) equally often. For even k a block is k rounds; for odd k no k-round
  square does it, so the block is the k rounds and their mirror images, 2k rounds. With two arms
  it is AB, BA: abba.
"""

from __future__ import annotations

import random

ORDERS = ("abba", "random", "williams")


def williams_rows(k: int) -> list[list[int]]:
    """The rows (arm indices) of one Williams block for k arms: k rows for even k, 2k for odd k.

    The first row interleaves from both ends, 0, 1, k-1, 2, k-2, …, so its successive differences
    mod k are all distinct; every other row adds r mod k, which keeps each arm once per position and
    each ordered pair adjacent once. For odd k the mirrored rows make up the pairs the square misses.
    """
    first, lo, hi = [0], 1, k - 1
    while len(first) < k:
        first.append(lo)
        lo += 1
        if len(first) < k:
            first.append(hi)
            hi -= 1
    rows = [[(a + r) % k for a in first] for r in range(k)]
    return rows if k % 2 == 0 else rows + [row[::-1] for row in rows]


def block_length(k: int, order: str) -> int:
    """Rounds in one counterbalanced block of *order* with k arms."""
    if order not in ORDERS:
        raise ValueError(f"order: unknown visit order {order!r} ({', '.join(ORDERS)})")
    return 2 * k if order == "williams" and k % 2 else k


def round_orders(arms: list[str], rounds: int, order: str, seed: int) -> list[list[str]]:
    """The arm order within each round (index 0 = round 1)."""
    k = len(arms)
    if order == "williams":
        rows = williams_rows(k)
        return [[arms[i] for i in rows[r % len(rows)]] for r in range(rounds)]
    if order == "abba":
        return [arms[(r % k):] + arms[:(r % k)] for r in range(rounds)]
    if order == "random":
        rng = random.Random(f"pairbench-order:{seed}")
        out: list[list[str]] = []
        while len(out) < rounds:
            base = list(arms)
            rng.shuffle(base)
            shifts = list(range(k))
            rng.shuffle(shifts)
            out += [base[s:] + base[:s] for s in shifts]
        return out[:rounds]
    raise ValueError(f"order: unknown visit order {order!r} ({', '.join(ORDERS)})")
