"""The catalogue of Python-function-completion tasks that the validation stage checks.

Every fixture prompt ends with one of these tasks: the pipeline places ``render_task(task)`` after
its synthetic filler, in one user chat message. The model is asked to complete a small Python
function and then to keep writing comments until it is stopped (the harness forces a fixed output
length with ``ignore_eos``, so the output always runs on past the function). The validation cases
(``pairbench.validate.cases``) then extract the function from the output and run the task's tests in a
sandbox (``pairbench.validate.sandbox``).

The tasks are deliberately simple: the default subject is SmolLM2-135M-Instruct, and a functional
case is only useful if the stock model passes it. Each task here was kept because the real model,
greedy, with ~200 tokens of neutral filler before it, produced a function that passes its tests;
``python -m pairbench.validate.probe probe`` re-runs that check and docs/validation.md records what it saw.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    """One function-completion task.

    ``signature`` is the def line plus its docstring (what the model is shown); ``tests`` is Python
    source of plain ``assert`` statements that call ``entry_point``.
    """

    name: str
    entry_point: str
    signature: str
    tests: str


TASKS: tuple[Task, ...] = (
    Task(
        name="add",
        entry_point="add",
        signature='def add(a, b):\n    """Return the sum of a and b."""',
        tests="assert add(2, 3) == 5\nassert add(-1, 1) == 0\nassert add(0, 0) == 0\n",
    ),
    Task(
        name="is_even",
        entry_point="is_even",
        signature='def is_even(n):\n    """Return True if the integer n is even, otherwise False."""',
        tests=(
            "assert is_even(4) is True\nassert is_even(7) is False\n"
            "assert is_even(0) is True\nassert is_even(-3) is False\n"
        ),
    ),
    Task(
        name="max_of_three",
        entry_point="max_of_three",
        signature='def max_of_three(a, b, c):\n    """Return the largest of the three numbers a, b and c."""',
        tests=(
            "assert max_of_three(1, 2, 3) == 3\nassert max_of_three(3, 2, 1) == 3\n"
            "assert max_of_three(1, 3, 2) == 3\nassert max_of_three(-5, -2, -9) == -2\n"
        ),
    ),
    Task(
        name="reverse_string",
        entry_point="reverse_string",
        signature='def reverse_string(s):\n    """Return the string s reversed."""',
        tests=(
            "assert reverse_string('abc') == 'cba'\nassert reverse_string('') == ''\n"
            "assert reverse_string('racecar') == 'racecar'\n"
        ),
    ),
    Task(
        name="multiply",
        entry_point="multiply",
        signature='def multiply(a, b):\n    """Return the product of a and b."""',
        tests="assert multiply(2, 3) == 6\nassert multiply(-2, 4) == -8\nassert multiply(0, 9) == 0\n",
    ),
    Task(
        name="square",
        entry_point="square",
        signature='def square(x):\n    """Return x multiplied by itself."""',
        tests="assert square(3) == 9\nassert square(-4) == 16\nassert square(0) == 0\n",
    ),
)


def get_task(name: str) -> Task:
    """The task called *name*; a KeyError naming it (and the known names) otherwise."""
    for task in TASKS:
        if isinstance(name, str) and task.name == name:
            return task
    raise KeyError(f"unknown task {name!r} (known: {', '.join(t.name for t in TASKS)})")


def render_task(task: Task) -> str:
    """The task text the model sees, placed after the filler in the same user message."""
    return (
        "Complete the following Python function. Write the whole function in a ```python code "
        "block. After the code block, keep writing Python comments (lines starting with #) about "
        "the function until you are stopped.\n\n"
        f"```python\n{task.signature}\n```"
    )


def task_for(length: int, round: int | None = None) -> Task:
    """The task for a fixture of *length* prompt tokens (and optionally a *round*).

    Deterministic across processes and machines (sha256, not Python's salted ``hash``). Both arms
    of a round see the same fixture, so ``matches_baseline`` compares like with like.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
        raise ValueError(f"length must be a positive int, got {length!r}")
    if round is not None and (isinstance(round, bool) or not isinstance(round, int) or round < 0):
        raise ValueError(f"round must be a non-negative int or None, got {round!r}")
    key = f"{length}" if round is None else f"{length}/{round}"
    digest = hashlib.sha256(key.encode()).digest()
    return TASKS[int.from_bytes(digest[:8], "big") % len(TASKS)]


# --- the probe: does the real model pass each task? --------------------------------------------

#: Neutral filler (~200 tokens) placed before the task in the probe, like the pipeline's filler.
