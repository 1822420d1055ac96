"""Conditions: what one steady request (or one load level) is measured under, defined once.

A *condition* is a value for each of the run's *factors*: today the input length and the output
length; a load run adds its concurrency or arrival rate (docs/contracts.md). The configured factor
lists are crossed, and every condition gets a stable, readable id (``in256-out64``,
``in1024-out64-c8``, ``in1024-out64-r0.5``) that names it everywhere: in paths
(``fixtures/<condition>.json``), records, table columns (``condition`` plus one column per
factor), statistics keys, the report and ``verify``.

The statistics, the report and ``verify`` never name a factor: they iterate conditions and read
:func:`label` and :data:`FACTORS`. Adding a factor is one entry in :data:`FACTORS` plus where its
config key is read (:func:`conditions`), and where the measurement acts on it. A *request-visible*
factor (``request=True``: a temperature, say) acts through the request alone: every engine profile's
request template names it (``temperature: "{temperature}"``) and the adapter fills it from the
condition (:meth:`pairbench.engines.adapter.ArmEngine.request`), so nothing under ``measure/`` changes;
an engine whose profile does not name it refuses the request rather than measure without it.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class Factor:
    """One factor of a condition: its record key, its id prefix, the config key it comes from."""

    name: str  # record key and table column, units in the name: input_tokens
    prefix: str  # in the condition id: in256
    config_key: str  # where the config lists its levels
    phrase: str  # the report's words for one value, "{} input tokens"
    kind: type = int
    request: bool = False  # request-visible: sent to the engine through its profile's request template


FACTORS: tuple[Factor, ...] = (
    Factor("input_tokens", "in", "lengths", "{} input tokens"),
    Factor("output_tokens", "out", "output_tokens", "{} output tokens"),
    # a load run's level (issue 23): closed-loop streams or an open-loop request rate, never both
    Factor("concurrency", "c", "load.concurrency", "{} concurrent streams"),
    Factor("rate", "r", "load.rate", "{} requests/s", kind=float),
)
BY_NAME = {f.name: f for f in FACTORS}
BY_PREFIX = {f.prefix: f for f in FACTORS}
LOAD_FACTORS = ("concurrency", "rate")  # the factors that make a condition a load level
ID_PATTERN = r"[a-z]+[0-9][0-9.]*(?:-[a-z]+[0-9][0-9.]*)*"


def format_value(value: Any) -> str:
    """A factor value as it appears in an id: integers plainly, other numbers in ``%g`` form."""
    if isinstance(value, bool):
        raise TypeError(f"a condition factor is a number, not {value!r}")
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return str(int(value))
    return f"{value:g}"


@dataclass(frozen=True, order=True)
class Condition:
    """A value per factor, in :data:`FACTORS` order. Immutable and hashable."""

    values: tuple[tuple[str, Any], ...]

    def __post_init__(self) -> None:
        names = [n for n, _ in self.values]
        unknown = [n for n in names if n not in BY_NAME]
        if unknown:
            raise ValueError(f"unknown condition factor(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
        order = [f.name for f in FACTORS if f.name in names]
        if names != order:
            raise ValueError(f"condition factors out of order: {names} (expected {order})")

    @property
    def id(self) -> str:
        return "-".join(f"{BY_NAME[n].prefix}{format_value(v)}" for n, v in self.values)

    def __getitem__(self, name: str) -> Any:
        for n, v in self.values:
            if n == name:
                return v
        raise KeyError(f"condition {self.id} has no factor {name!r}")

    def get(self, name: str, default: Any = None) -> Any:
        return dict(self.values).get(name, default)

    @property
    def factors(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.values)

    @property
    def input_tokens(self) -> int:
        return self["input_tokens"]

    @property
    def output_tokens(self) -> int:
        return self["output_tokens"]

    @property
    def load(self) -> tuple[str, Any] | None:
        """``("concurrency", 8)`` or ``("rate", 0.5)`` for a load level; None for a steady condition."""
        return next(((n, v) for n, v in self.values if n in LOAD_FACTORS), None)

    def without_load(self) -> "Condition":
        """The condition with its load factor left out: the group of levels that form one load curve."""
        return Condition(tuple((n, v) for n, v in self.values if n not in LOAD_FACTORS))

    def to_dict(self) -> dict:
        """``{"id", <factor>: value, ...}``, as plan.json and the summary list it."""
        return {"id": self.id, **dict(self.values)}

    @classmethod
    def of(cls, **values: Any) -> "Condition":
        return cls(tuple((f.name, values[f.name]) for f in FACTORS if f.name in values))

    @classmethod
    def from_dict(cls, d: dict) -> "Condition":
        """The condition of a ``to_dict()`` mapping (an ``id`` present must agree with the values)."""
        cond = cls.of(**{k: v for k, v in d.items() if k in BY_NAME})
        if "id" in d and d["id"] != cond.id:
            raise ValueError(f"condition id {d['id']!r} does not match its factors ({cond.id})")
        return cond


def label(cond: Condition | dict) -> str:
    """The report's words for a condition, e.g. ``256 input tokens, 64 output tokens``."""
    c = cond if isinstance(cond, Condition) else Condition.from_dict(cond)
    return ", ".join(BY_NAME[n].phrase.format(format_value(v)) for n, v in c.values)


def parse_id(text: str) -> Condition:
    """The condition an id names; a ``ValueError`` names the part it cannot read."""
    values = {}
    for part in text.split("-"):
        m = re.fullmatch(r"([a-z]+)([0-9][0-9.]*)", part)
        if not m or m.group(1) not in BY_PREFIX:
            raise ValueError(f"condition id {text!r}: cannot read {part!r} (factors: "
                             f"{', '.join(f.prefix + '<n>' for f in FACTORS)})")
        factor = BY_PREFIX[m.group(1)]
        values[factor.name] = factor.kind(float(m.group(2)) if "." in m.group(2) else int(m.group(2)))
    cond = Condition.of(**values)
    if cond.id != text:
        raise ValueError(f"condition id {text!r} is not in canonical form ({cond.id})")
    return cond


def levels(config: dict, factor: Factor) -> list:
    """The configured values of one factor (a scalar counts as a list of one); [] if not set."""
    node: Any = config
    for part in factor.config_key.split("."):
        if not isinstance(node, dict) or node.get(part) is None:
            return []
        node = node[part]
    return list(node) if isinstance(node, (list, tuple)) else [node]


def _typed(factor: Factor, value: Any) -> Any:
    """A rate of 2 is 2.0, as its id ``r2`` reads back (a float factor's integers become floats)."""
    return float(value) if factor.kind is float and isinstance(value, int) and not isinstance(value, bool) else value


def conditions(config: dict) -> list[Condition]:
    """The run's conditions: the cross product of every configured factor's levels, the first
    factor outermost, each factor's levels in config order."""
    present = [(f, [_typed(f, v) for v in levels(config, f)]) for f in FACTORS]
    present = [(f, vals) for f, vals in present if vals]
    return [Condition(tuple((f.name, v) for (f, _), v in zip(present, combo)))
            for combo in itertools.product(*(vals for _, vals in present))]


def from_plan(plan: dict) -> list[Condition]:
    """The plan's conditions, in plan order."""
    return [Condition.from_dict(c) for c in plan["conditions"]]


def shortest(conds: Iterable[Condition]) -> Condition:
    """The condition with the shortest prompt, then the fewest output tokens, then the first in
    order: the cheapest to run a request of (the cost channel's ``conditions: shortest``)."""
    return min(conds, key=lambda c: (c.get("input_tokens") or 0, c.get("output_tokens") or 0))


def selected(conds: list[Condition], wanted: list[str] | tuple[str, ...] | str | None) -> list[Condition]:
    """The conditions a ``conditions`` setting picks (the cost channel's ``cost.conditions``), in
    *conds*' order: None every one, ``"shortest"`` :func:`shortest`, else the named ids; an id
    *conds* lacks is a ``ValueError`` naming it and the ones there are."""
    if wanted is None:
        return list(conds)
    if wanted == "shortest":
        return [shortest(conds)]
    known = ids(conds)
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise ValueError(f"{', '.join(unknown)} not planned (planned: {', '.join(known)})")
    return [c for c in conds if c.id in wanted]


def ids(conds: Iterable[Condition | dict]) -> list[str]:
    return [c.id if isinstance(c, Condition) else c["id"] for c in conds]


def by_id(conds: Iterable[Condition | dict], cid: str) -> Condition:
    """The condition named *cid*; a ``KeyError`` lists the ones there are."""
    conds = [c if isinstance(c, Condition) else Condition.from_dict(c) for c in conds]
    for c in conds:
        if c.id == cid:
            return c
    raise KeyError(f"no condition {cid!r} (the run has {', '.join(c.id for c in conds) or 'none'})")


def factor_columns(conds: Iterable[Condition | dict]) -> list[str]:
    """The factors the conditions vary or fix, in :data:`FACTORS` order: one table column each."""
    names = set()
    for c in conds:
        names |= set(c.factors if isinstance(c, Condition) else (k for k in c if k in BY_NAME))
    return [f.name for f in FACTORS if f.name in names]
