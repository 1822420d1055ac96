"""How the sandbox's supervisor decides a task's asserts: what it sends the child, what it keeps.

No subprocess here: ``ask`` stands in for the child, so each test sees exactly which expressions
would leave the harness process.
"""

import ast

import pytest
from pairbench.validate import assertions, runner
from pairbench.validate.assertions import TestsError, decode, holds, plan


def _decide(tests: str, answers: dict[str, object]) -> tuple[list[bool], list[str]]:
    """Each assert's outcome, with the child answering from *answers* (source -> value); and what
    was asked, in order."""
    asked = []

    def ask(node):
        source = ast.unparse(node)
        asked.append(source)
        return answers[source]

    return [holds(s.test, ask) for s in plan(tests) if s.kind == "assert"], asked


def test_plan_keeps_asserts_here_and_sends_setup_to_the_child():
    steps = plan("import math\nx = add(1, 2)\n\nassert add(2, 3) == 5\n")
    assert [(s.kind, s.line, s.text) for s in steps] == [
        ("exec", 1, "import math"), ("exec", 2, "x = add(1, 2)"), ("assert", 4, "assert add(2, 3) == 5")]
    assert steps[1].source == "x = add(1, 2)"


def test_the_expected_value_is_never_asked_for():
    outcome, asked = _decide("assert add(2, 3) == 5\nassert 'cba' == reverse('abc')\n",
                             {"add(2, 3)": 5, "reverse('abc')": "abc"})
    assert outcome == [True, False]
    assert asked == ["add(2, 3)", "reverse('abc')"]


@pytest.mark.parametrize("tests, answers, expected", [
    ("assert is_even(4) is True", {"is_even(4)": True}, [True]),
    ("assert is_even(4) is True", {"is_even(4)": 1}, [False]),      # 1 == True, but it is not True
    ("assert f() is None", {"f()": None}, [True]),
    ("assert f() is not None", {"f()": 0}, [True]),
    ("assert f() == 5", {"f()": 5.0}, [True]),                      # Python's == on plain values
    ("assert f() != 5", {"f()": 5}, [False]),
    ("assert 1 < f() <= 3", {"f()": 3}, [True]),
    ("assert 1 < f() <= 3", {"f()": 4}, [False]),
    ("assert b'x' not in f()", {"f()": b"abc"}, [True]),
    ("assert f() in [1, 2]", {"f()": 2}, [True]),
    ("assert f()", {"f()": [0]}, [True]),
    ("assert not f()", {"f()": ""}, [True]),
    ("assert f() == (1, [2])", {"f()": [1, [2]]}, [False]),          # a list is not a tuple
    ("assert f() == {'a': {1, 2}}", {"f()": {"a": {2, 1}}}, [True]),
])
def test_comparisons_follow_python_on_plain_values(tests, answers, expected):
    assert _decide(tests, answers)[0] == expected


def test_and_or_and_chains_short_circuit_like_python():
    outcome, asked = _decide("assert f(1) and g(2)\nassert f(1) or g(2)\nassert 5 < f(1) < g(2)\n",
                             {"f(1)": 0, "g(2)": 1})
    assert outcome == [False, True, False]
    assert asked == ["f(1)", "f(1)", "g(2)", "f(1)"]


def test_incompatible_values_raise_typeerror_like_the_assert():
    with pytest.raises(TypeError):
        _decide("assert f() < 3", {"f()": "x"})


def test_an_assert_inside_a_block_is_refused_naming_its_line():
    with pytest.raises(TestsError, match=r"line 3: an assert inside a for block"):
        plan("x = 1\nfor i in range(3):\n    assert f(i) == i\n")
    with pytest.raises(TestsError, match=r"line 2: an assert inside a if block"):
        plan("if True:\n    assert f()\n")


def test_is_against_a_non_singleton_is_refused_naming_its_line():
    with pytest.raises(TestsError, match=r"line 2: `is` compares identity"):
        plan("assert f() == 1\nassert f() is 5\n")
    plan("assert None is f()\nassert f() is not False\n")  # a singleton on either side is fine


def test_tests_that_do_not_parse_raise_syntaxerror():
    with pytest.raises(SyntaxError):
        plan("assert add(2, 3) ==\n")
    with pytest.raises(TypeError):
        plan(None)


@pytest.mark.parametrize("text, value", [
    ("5", 5), ("-2.5", -2.5), ("'cba'", "cba"), ("b'\\x00'", b"\x00"), ("None", None), ("True", True),
    ("(1, [2, {3}], {'k': (None,)})", (1, [2, {3}], {"k": (None,)})), ("set()", set()), ("1e999", float("inf")),
])
def test_decode_reads_plain_values(text, value):
    assert decode(text) == value and type(decode(text)) is type(value)


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')", "Yes()", "(1).__class__", "x", "lambda: 1", "5; 6", "[" * 300 + "]" * 300,
    "'x' * 10", "'" + "a" * (assertions.MAX_VALUE_CHARS + 1) + "'", None,
])
def test_decode_refuses_anything_but_a_plain_literal(text):
    with pytest.raises(ValueError):
        decode(text)


# --- the child's side: what it may send back -----------------------------------------------------


@pytest.mark.parametrize("value", [5, True, None, -0.5, 1j, "s", b"b", (1, "a"), [1, [2]], {1, 2}, {"k": [None]}])
def test_runner_encodes_plain_values_as_their_repr(value):
    assert decode(runner.encode(value)) == value


class _Int(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


@pytest.mark.parametrize("value, named", [
    (_Int(3), "_Int"), (object(), "object"), ([1, object()], "object"), ({"k": _Int(1)}, "_Int"),
    (frozenset({1}), "frozenset"), (float("nan"), "nan"), (range(3), "range"),
])
def test_runner_refuses_anything_else_naming_it(value, named):
    with pytest.raises(runner.Unrepresentable, match=named):
        runner.encode(value)


def test_runner_refuses_deep_or_large_values():
    deep = []
    for _ in range(runner.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(runner.Unrepresentable, match="nested deeper"):
        runner.encode(deep)
    with pytest.raises(runner.Unrepresentable, match="more than"):
        runner.encode(list(range(runner.MAX_ITEMS + 1)))
    with pytest.raises(runner.Unrepresentable, match="characters"):
        runner.encode("x" * runner.MAX_VALUE_CHARS)


def test_the_catalogue_keeps_every_expected_value_out_of_the_child():
    """Every task's tests are top-level asserts whose only non-literal operands are calls of the
    task's function on literal arguments: the child is asked for those calls and nothing else."""
    from pairbench.core.tasks import TASKS

    for task in TASKS:
        steps = plan(task.tests)
        assert steps and all(s.kind == "assert" for s in steps), task.name
        for step in steps:
            asked = []
            holds(step.test, lambda node: asked.append(node) or 0)
            assert len(asked) == 1, (task.name, step.text)
            call = asked[0]
            assert isinstance(call, ast.Call) and ast.unparse(call.func) == task.entry_point, (task.name, step.text)
            assert all(assertions.literal(arg)[0] for arg in call.args), (task.name, step.text)
