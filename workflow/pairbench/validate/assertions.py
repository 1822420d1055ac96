"""A task's tests as the sandbox's supervisor runs them: the child evaluates, the harness compares.

A task's tests are plain ``assert`` statements (``assert add(2, 3) == 5``). Run as written inside
the sandbox, they would be decided in the same process as the model's code, which can rewrite
``AssertionError``, the runner or its own return value's ``__eq__``. So :func:`plan` takes them
apart in the harness process:

- every top-level ``assert`` becomes a :class:`Step` whose test expression stays here. Each operand
  of it that is a **literal** (``5``, ``'cba'``, ``[1, 2]``, ``True``, ``None``) is evaluated here
  with ``ast.literal_eval`` and never sent to the child; each other operand (``add(2, 3)``) is sent
  to the child, which evaluates it and sends back the value's ``repr``;
- :func:`decode` reads that back with ``ast.literal_eval``: plain data only, so no object of the
  model's reaches the comparison;
- :func:`holds` then applies the comparison (``==``, ``!=``, ``<``, ``in``, ``is None``, ``and``,
  ``not``, ...) here, on those plain values;
- any other top-level statement (``import math``, ``x = add(1, 2)``) is setup: it runs in the child
  as written.

So the expected value of ``assert add(2, 3) == 5`` never enters the child, and a pass needs the
child to have produced the value ``5`` for ``add(2, 3)``. Write tests with the expected value as a
literal on one side: an operand that is computed (``add(2, 3) == 2 + 3``) is computed in the child,
which can then make it anything. :func:`plan` refuses (:class:`TestsError`, naming the line) what it
cannot decide here: an ``assert`` nested inside a block (it would run in the child) and an ``is``
comparison without a ``None``/``True``/``False`` literal (identity does not survive the trip).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: The longest value text :func:`decode` reads (the child caps it at the same figure).
MAX_VALUE_CHARS = 64 << 10

_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne,
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.Is: operator.is_, ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}
_SINGLETONS = (type(None), bool, type(Ellipsis))


class TestsError(ValueError):
    """The tests cannot be decided outside the sandbox as written; the message names the line."""

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class Step:
    """One top-level statement of the tests.

    ``kind`` is ``"exec"`` (setup: ``source`` runs in the child) or ``"assert"`` (``test`` is
    decided here by :func:`holds`); ``line`` is 1-based and ``text`` is that line, for reasons.
    """

    kind: str
    line: int
    text: str
    source: str = ""
    test: ast.expr | None = None


def literal(node: ast.expr) -> tuple[bool, Any]:
    """``(True, value)`` if *node* is a literal (``ast.literal_eval`` accepts it), else ``(False, None)``."""
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _check(node: ast.expr, line: int) -> None:
    """Refuse what :func:`holds` could not decide faithfully."""
    if isinstance(node, ast.BoolOp):
        for value in node.values:
            _check(value, line)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        _check(node.operand, line)
    elif isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            if isinstance(op, (ast.Is, ast.IsNot)):
                sides = [literal(operands[i]), literal(operands[i + 1])]
                if not any(ok and isinstance(v, _SINGLETONS) for ok, v in sides):
                    raise TestsError(f"line {line}: `is` compares identity, which does not survive the "
                                     "sandbox boundary; compare with a literal None/True/False, or use ==")


def plan(tests: str) -> list[Step]:
    """The tests as steps; SyntaxError if they do not parse, :class:`TestsError` naming the line if
    they cannot be decided outside the sandbox."""
    if not isinstance(tests, str):
        raise TypeError(f"tests must be str, got {type(tests).__name__}")
    tree = ast.parse(tests, "<tests>")
    lines = tests.splitlines()
    steps = []
    for stmt in tree.body:
        text = lines[stmt.lineno - 1].strip() if stmt.lineno <= len(lines) else ""
        if isinstance(stmt, ast.Assert):
            _check(stmt.test, stmt.lineno)
            steps.append(Step("assert", stmt.lineno, text, ast.unparse(stmt.test), stmt.test))
            continue
        nested = next((n for n in ast.walk(stmt) if isinstance(n, ast.Assert)), None)
        if nested is not None:
            raise TestsError(f"line {nested.lineno}: an assert inside a {type(stmt).__name__.lower()} "
                             "block would be decided inside the sandbox, where the candidate can fake it; "
                             "write each assert at the top level")
        steps.append(Step("exec", stmt.lineno, text, ast.unparse(stmt)))
    return steps


def holds(test: ast.expr, ask: Callable[[ast.expr], Any]) -> bool:
    """Whether the assertion *test* holds. Literal operands are evaluated here; *ask(node)* returns
    the plain value of any other operand, evaluated by the child, in Python's order of evaluation
    (left to right, short-circuiting ``and``/``or`` and chained comparisons). A comparison of
    incompatible values raises TypeError, as the assert itself would."""
    if isinstance(test, ast.BoolOp):
        if isinstance(test.op, ast.And):
            return all(holds(v, ask) for v in test.values)
        return any(holds(v, ask) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return not holds(test.operand, ask)
    if isinstance(test, ast.Compare):
        left = _operand(test.left, ask)
        for op, node in zip(test.ops, test.comparators):
            right = _operand(node, ask)
            if not _OPS[type(op)](left, right):
                return False
            left = right
        return True
    return bool(_operand(test, ask))


def _operand(node: ast.expr, ask: Callable[[ast.expr], Any]) -> Any:
    ok, value = literal(node)
    return value if ok else ask(node)


def decode(text: str) -> Any:
    """The plain value whose ``repr`` the child sent; ValueError if *text* is not one."""
    if not isinstance(text, str) or len(text) > MAX_VALUE_CHARS:
        raise ValueError(f"not a value text of at most {MAX_VALUE_CHARS} characters")
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise ValueError(f"not a plain literal ({type(exc).__name__})") from None
